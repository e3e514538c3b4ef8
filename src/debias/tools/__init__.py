"""The tools a user runs around the pipeline, which no stage imports: the ``debias`` command, sweeps, the shared
services, presets, ``debias compare`` and the derivation of dvc.yaml's code deps. None is a stage's dependency."""
