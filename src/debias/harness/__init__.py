"""The harness: what starts, runs, watches and records a stage without computing any of its output values.

The launcher and the fork server start a stage's process, the stage runner loads its params and turns errors into
one line, tracking records the run in MLflow and reports/runs/, progress prints lines on stderr, and the memory
check advises before training. No file here is ever a stage's code dependency (debias.tools.deps), and
tests/test_forkserver.py holds the harness to that: the same output bytes with the fork server on and off.
"""
