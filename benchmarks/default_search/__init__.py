"""The default stage 2, chosen on validation by a rule written before the runs, judged per regime, reported on images
the choice never saw.

The protocol (:data:`protocol.PROTOCOL`, printed at the top of the results file with the commit of this file that ran it):

1. **Screen** every candidate (:func:`candidates`: CNC's schedules x group source x short pools x ε, and the released
   FairKL objective) on a few validation cells of each regime (:data:`SCREEN_CELLS`).
2. **Carry** the top :data:`CARRY_TOP` eligible candidates (pooled over the regimes, each regime weighted equally),
   each regime's best eligible one, and the reference rows (the previous default, the best eligible CNC on ERM
   predictions, the best eligible CNC of the ``q3m16`` schedule on clusters, FairKL).
3. **Size** the confirmation per regime from the screen's paired sd of the carried candidates' validation unbiased
   accuracy: enough cells to detect a :data:`DETECT`-point difference and to show equivalence within
   ±:data:`MARGIN` (TOST, true difference 0), each at 80 % power, between :data:`FLOOR` and :data:`CAP` cells.
4. **Confirm** the carried candidates on fresh validation cells (other seeds) and **decide on their validation
   numbers only** (:func:`decide`): per regime, the winner by mean validation unbiased accuracy; a candidate holds a
   regime when it is its winner or shown equivalent to it (TOST within ±:data:`MARGIN`, α 0.05), and is shown worse
   (95 % paired interval below 0) than no carried candidate there, on validation unbiased or worst-group accuracy.
   The default is the cheapest (summed stage-2 CPU seconds over the confirmation cells) candidate that holds every
   regime. If none does, the page says so and names the candidate holding the bundled digits and most other
   regimes. Eligible: stage-2 CPU seconds summed over a regime's cells at most :data:`COST_BUDGET` times FairKL's,
   in every regime; nothing else gates.
5. **Report** the carried candidates on held-out cells: the other half of mnist10k (disjoint images, palettes the
   choice never saw, Biased-MNIST at 0.98 too) and other seeds of the bundled digits, test numbers per regime with
   intervals clustered by cell (one paired difference per cell).
6. **Extend** (step 7 of the printed protocol, :data:`EXTENSION_PROTOCOL`, written after the steps above ran and
   before its own runs): where the default is neither a regime's winner nor shown equivalent to it, and shown worse
   than no one, the two meet again on fresh validation cells sized for the equivalence test (:func:`extension_plan`,
   :func:`decide_extension`); step 8 (:data:`REPORT_PROTOCOL`, report only) runs the other carried candidates that
   were ahead of the default there on the same cells (:func:`report_only`).

    python -m benchmarks.default_search --npz PATH/mnist10k.npz --workdir SCRATCH --jobs 2

Every run is keyed by its data file, the code and params.yaml at ``--rev``, the torch threads and the run's params;
rows of ``OUT.csv`` under another key are not reused (counted as stale). Each row records the threads, runs at once,
commit and data it was made with, and the header is read from the rows. ``--collect-only`` rewrites ``OUT.md`` from
the CSV, and refuses a CSV that gives one run (phase, cell, candidate, rule) by two rows, naming them; ``--phase
screen`` / ``confirm`` stops after that phase; ``--phase extension`` runs steps 7 and 8 alone on the confirmation rows
the CSV holds (made at their own commit), leaving every other row as it is.

Modules: :mod:`.protocol` (the steps as data and their decision functions), :mod:`.page` (the results page),
:mod:`.runner` (the runs and the command line).
"""
