"""Experiment tracking: the only package of fedcomm that imports MLflow. :mod:`.mlflow` opens
runs and logs to them, :mod:`.query` reads runs back, and :mod:`.store` checks a local store on
opening it (a damaged one -> one :class:`~fedcomm.tracking.store.TrackingStoreError`)."""
