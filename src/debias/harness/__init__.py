"""The harness: what starts, runs, watches and records a stage without computing any of its output values.

The launcher and the fork server start a stage's process, the stage runner loads its params and turns errors into
one line, tracking records the run in MLflow and reports/runs/, progress prints lines on stderr, and the memory
check advises before training. The modules debias.tools.deps.SIDE_CHANNELS names hand research code no value and are
no stage's code dependency (tests/test_forkserver.py: the same output bytes with the fork server on and off); any
other module here that a stage reaches is one of its dependencies (tests/test_trace.py checks both).
"""
