"""fedcomm: a declarative, reproducible lab for communication-efficient federated learning."""

__version__ = "0.1.0"
