"""Each warning code's predictive value: do runs that carry it have worse test numbers than matched runs without it?

For every code of :data:`debias.core.health.CODES`, one row of ``benchmarks/results/warning_value.{csv,md}``: how it
was measured, the cells, the paired difference of test unbiased and worst-group accuracy (the warned run minus the
matched run without the warning, points, 95 % interval), the difference the cells detect at 80 % power, the TOST
p-value for ±1 point, and the verdict (note or warning) by the rule :data:`rule.RULE`, written before the runs.

- ``cnc-small-pools``: params.yaml's stage 2 (``stage2.cnc.short_pools: replace``: short pools drawn with
  replacement, warned) against ``shrink`` (M and N cut to the smallest pool, no warning) on the same cells: the
  bundled digits at seeds 0-19 and the default search's held-out cells. Whether the warning fired on a cell is read
  from CNC's sampler on that cell's training split and clusters (the pools the stage's train info lists as short).
- ``degenerate-selection``: from ``benchmarks/results/default_search.csv`` (no new runs): the default's runs whose
  ``best_unbiased`` pick is degenerate, against the same run's ``last`` epoch (the model trained in full).
- The other codes: measured where these runs show them, otherwise the reason they cannot be measured here.

``--pipeline`` runs ``dvc repro`` of the bundled default at seeds 0-19 in fresh clones at ``--rev`` and records each
run's warnings and notes, every stage's (the count the page states).

    python -m benchmarks.warning_value --workdir SCRATCH --jobs 2 --digits-only
    python -m benchmarks.warning_value --npz PATH/mnist10k.npz --workdir SCRATCH --jobs 2
    python -m benchmarks.warning_value --workdir SCRATCH --jobs 2 --pipeline
    python -m benchmarks.warning_value --collect-only

Modules: :mod:`.rule` (settings, cells, the rule and its verdict), :mod:`.runner` (the runs and the command line),
:mod:`.page` (the results page).
"""
