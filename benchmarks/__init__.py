"""The benchmarks, a package run from the repository root as ``python -m benchmarks.<study>``.

Two floors above the library (src/debias, which never imports this package):

- shared modules, imported by the studies: :mod:`benchmarks.cells` (stage-2 cells in clones of one commit),
  :mod:`benchmarks.clones` (fresh clones, their environment and measured commands), :mod:`benchmarks.dvc_queue`
  (plans run through DVC's queue in a scratch clone), :mod:`benchmarks.pages` (what results pages print),
  :mod:`benchmarks.throughput`, :mod:`benchmarks.reference_losses`, :mod:`benchmarks.reference_training` and
  :mod:`benchmarks.stage2_epochs` (one stage-2 run, also started by path inside a cell's clone);
- the studies, one module (or package) each with its own ``--help``; a study imports shared modules and the
  library, never another study.
"""

#: The shared modules (the lower floor); every other module or package here is a study.
SHARED = ("cells", "clones", "dvc_queue", "pages", "reference_losses", "reference_training", "stage2_epochs", "throughput")
