"""DVC stage `partition`: split the dataset over clients (data/partition/)."""

from fedcomm.cli import app

if __name__ == "__main__":
    app(["partition"])
