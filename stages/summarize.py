"""DVC stage `summarize`: tables and plots over every run and seed (reports/)."""

from _entry import fedcomm_app

if __name__ == "__main__":
    fedcomm_app()(["summarize"])
