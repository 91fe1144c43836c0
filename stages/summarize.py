"""DVC stage `summarize`: tables and plots over every run and seed (reports/)."""

from fedcomm.cli import app

if __name__ == "__main__":
    app(["summarize"])
