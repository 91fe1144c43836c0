"""Experiment tracking: the only package of fedcomm that imports MLflow. :mod:`.mlflow` opens
runs and logs to them (experiments tagged as model training), :mod:`.views` adds the
accuracy-against-traffic series and each experiment's saved view, :mod:`.inputs` makes a run's
partition its MLflow dataset input, :mod:`.query` reads runs back, :mod:`.summary_run` logs the
summarize stage's report on a run of its own, :mod:`.saved_model` loads a run's model back
(``fedcomm.load_model``), :mod:`.ui` serves the MLflow UI (``fedcomm ui``, with the
:mod:`.ui_app` plugin of ``mlflow ui --app-name fedcomm``), and :mod:`.store` checks a local store
on opening it (a damaged one -> one :class:`~fedcomm.tracking.store.TrackingStoreError`)."""
