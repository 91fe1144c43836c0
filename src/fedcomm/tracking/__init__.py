"""Experiment tracking. :mod:`.mlflow` is the only module that imports MLflow."""
