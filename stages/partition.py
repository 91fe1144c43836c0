"""DVC stage `partition`: split the dataset over clients (data/partition/)."""

from _entry import fedcomm_app

if __name__ == "__main__":
    fedcomm_app()(["partition"])
