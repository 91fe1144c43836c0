"""DVC stage `partition`: split the dataset over clients (data/partition/)."""

from fedcomm.config import load_params
from fedcomm.experiment import partition_stage

if __name__ == "__main__":
    print(f"partition {partition_stage(load_params('params.yaml'))[:12]}")
