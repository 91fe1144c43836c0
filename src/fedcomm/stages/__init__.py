"""The pipeline's stages as library calls, one module per DVC stage.

``partition`` -> ``train`` -> ``evaluate`` -> ``summarize``, as in ``dvc.yaml``: each stage
function takes the validated :class:`~fedcomm.config.Params` and explicit :class:`Paths
<fedcomm.stages.paths.Paths>`, does one stage's work and writes its declared outputs atomically.
The DVC entry scripts in the project's ``stages/`` and the ``fedcomm`` CLI both call these, so
there is exactly one implementation.

Below the four stages: :mod:`~fedcomm.stages.identity` (a run's name, resolved config, config
hash, code fingerprint, git state), :mod:`~fedcomm.stages.paths` (where the stages read and
write) and :mod:`~fedcomm.stages.outputs` (the files a run's training writes). A stage imports
only those and the stages before it; nothing imports ``summarize``. This package re-exports
nothing, so importing one stage loads only what that stage needs.
"""
