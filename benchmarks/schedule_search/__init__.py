"""Stage 2's later epochs on Biased-MNIST, explained, and whether a schedule stops their decline.

The default keeps the first of its 3 epochs on most Biased-MNIST cells, its last epoch trailing the kept one on
validation (``benchmarks/results/default_search.md``). This study runs params.yaml's stage 2 (``constant``: Adam at
1e-3 throughout) beside two schedules on fresh validation cells of each regime: ``decay`` (the learning rate x0.1
after each epoch) and ``half`` (half the anchors of each epoch: half the steps). Every epoch's numbers are kept: the
validation accuracy on the bias-aligned and the bias-conflicting images, the training losses and the spread of the
features, which say where the decline is and what stops it. The decision reads the kept epochs' validation numbers,
per regime, by the rule :data:`rule.RULE` (written before the runs); held-out cells report test numbers.

    python -m benchmarks.schedule_search --npz PATH/mnist10k.npz --workdir SCRATCH --jobs 2
    python -m benchmarks.schedule_search --collect-only

Rows: ``benchmarks/results/default_search_schedule.csv`` (one per cell, candidate and epoch); page: its ``.md``.
Modules: :mod:`.rule` (candidates, cells, the rule and its verdicts), :mod:`.runner` (the runs and the command
line), :mod:`.page` (the results page).
"""
