"""Experiment tracking: the only package of fedcomm that imports MLflow. :mod:`.mlflow` opens
runs and logs to them (experiments tagged as model training), :mod:`.inputs` makes a run's
partition its MLflow dataset input, :mod:`.query` reads runs back, :mod:`.ui` serves the MLflow UI
(``fedcomm ui``), and :mod:`.store` checks a local store on opening it (a damaged one -> one
:class:`~fedcomm.tracking.store.TrackingStoreError`)."""
