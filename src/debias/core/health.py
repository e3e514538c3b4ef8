"""Training health: checks that a stage's result is what it claims to be, and the warnings that say when not.

A warning is one line that starts with a short code and a colon, e.g.
``"degenerate-selection: validation worst-group accuracy was 0 at every epoch; epoch 3 kept by unbiased
accuracy"``. A stage puts its warnings into its metrics JSON (``"warnings": [...]``), prints each one in its
log and records them in MLflow (:meth:`debias.harness.tracking.StageRun.log_warnings`); the report shows them.

The codes and what each means: :data:`CODES` (the benchmarks' tables take their legends from there); whether a code
is a warning or a note: :data:`KINDS` (:func:`split_notes`). A note is kept apart: the stage's ``"notes"`` list, a
line in the report's details, never in the warnings, the headline or compare's count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

# Mean squared distance between L2-normalised features (pairs i != j) below which a representation counts as
# collapsed. It is 2 for directions spread uniformly over a high-dimensional sphere; trained LeNet-5 encoders give
# about 0.2 (ReLU features, all in the positive orthant) to 1.5, an untrained one about 0.13; the collapsed CNC runs
# that motivated this check (issue 14) had 0.008-0.021.
COLLAPSE_SPREAD = 0.05
# An accuracy below chance + CHANCE_MARGIN * (1 - chance) counts as chance level, chance being the frequency of the
# split's most frequent class (what a constant prediction gets): 0.28 for 5 balanced classes, 0.19 for 10.
CHANCE_MARGIN = 0.1


CODES: dict[str, str] = {
    "degenerate-selection": "the selection rule's validation worst-group, worst-class or worst-inferred-group accuracy "
                            "was 0 at every epoch, so the tie-breaks chose: the kept epoch's worst-group number is no "
                            "evidence of robustness",
    "first-epoch-kept": "the selection rule kept the first of several epochs, no later one beating it on the rule's "
                        "validation number (the reason lists the later epochs': a plateau or a decline), so the "
                        "numbers are those of the model trained one epoch (a note: on the default's runs such a keep "
                        "tested better than the same run's last epoch, benchmarks/results/warning_value.md)",
    "fragile-selection": "the kept epoch tied another epoch's validation number (worst-group, worst-class or "
                         "worst-inferred-group accuracy) and the tie-breaks chose, or beat it by only one or two images "
                         "of that group or class: the choice rests on noise, and so do the kept epoch's numbers",
    "unread-param": "a param changed where the run does not read it (another method's, source's or protocol's): "
                    "the change has no effect",
    "negligible-param": "a param that applies to the run but enters a term weighing under 1 % of the loss "
                        "(debias check-params): changing it changes almost nothing",
    "collapsed-representation": "the L2-normalised features are nearly identical",
    "chance-level": "accuracy no better than always predicting the most frequent class (plus a margin), on the "
                    "bias-aligned samples too: the model learned neither the label nor the bias shortcut",
    "fairkl-starved": "FairKL's pair sets were missing from most batches, so it contributed nothing there",
    "cnc-small-pools": "CNC drew positives or negatives with replacement from pools smaller than a batch needs (a "
                       "note: on the bundled digits such runs measured no loss against M and N cut to the pool, "
                       "benchmarks/results/warning_value.md)",
    "weak-groups": "the inferred minority misses most bias-conflicting points or is mostly others",
    "unstable-training": "the training loss jumped back up after it had fallen (or ended well above its minimum): "
                         "the kept epoch may sit on a spike; lower the learning rate or look at the loss curve",
    "mixed-environment": "a resumed run was trained by processes with different thread counts, CPU kernels, devices "
                         "or torch builds: its numbers are none of theirs alone",
}


#: Each code's kind, declared here alone: a ``warning`` goes into a stage's ``warnings`` list (its metrics JSON, the
#: log, the headline, compare's ``!`` count, MLflow's ``debias.warnings`` tag); a ``note`` into its ``notes`` list, a
#: line of the report's details and MLflow's ``debias.notes`` tag, nothing else. A code is a note when runs that
#: carry it were measured no worse than matched runs without it, on cells that can tell (benchmarks/results/
#: warning_value.md, by the rule written there); a check that guards correctness stays a warning whatever it measured.
KINDS: dict[str, Literal["warning", "note"]] = {
    "degenerate-selection": "warning",
    "first-epoch-kept": "note",
    "fragile-selection": "warning",
    "unread-param": "warning",
    "negligible-param": "warning",
    "collapsed-representation": "warning",
    "chance-level": "warning",
    "fairkl-starved": "warning",
    "cnc-small-pools": "note",
    "weak-groups": "warning",
    "unstable-training": "warning",
    "mixed-environment": "warning",
}


def kind(message: str) -> Literal["warning", "note"]:
    """The kind of a ``"code: message"`` line by its code (:data:`KINDS`); a line without a known code is a warning."""
    return KINDS.get(message.partition(":")[0].strip(), "warning")


def split_notes(messages: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(warnings, notes)``: ``messages`` split by :func:`kind`, each in its order."""
    return ([m for m in messages if kind(m) == "warning"], [m for m in messages if kind(m) == "note"])


def warning(code: str, message: str) -> str:
    """``"code: message"`` on one line; ``code`` must be one of :data:`CODES`."""
    if code not in CODES:
        raise ValueError(f"unknown warning code {code!r}; known: {sorted(CODES)}")
    return f"{code}: {' '.join(message.split())}"


def feature_spread(z: torch.Tensor) -> float:
    """Mean of ||u_i - u_j||^2 over ordered pairs i != j of the L2-normalised rows u (0: all identical; in [0, 4]).

    Exact in O(N D): sum_{i,j} ||u_i - u_j||^2 = 2 N^2 - 2 ||sum_i u_i||^2 for unit rows.
    """
    n = len(z)
    if n < 2:
        return float("nan")
    u = torch.nn.functional.normalize(z.double(), dim=1)
    total = 2.0 * n * n - 2.0 * float(u.sum(0).square().sum())
    return max(total, 0.0) / (n * (n - 1))


def collapse_warning(z: torch.Tensor, where: str) -> str | None:
    """A ``collapsed-representation`` warning when the normalised features ``z`` of ``where`` are nearly identical."""
    spread = feature_spread(z)
    if spread == spread and spread < COLLAPSE_SPREAD:  # not NaN
        return warning("collapsed-representation",
                       f"the L2-normalised features of {where} are nearly identical (mean squared pair distance "
                       f"{spread:.4f} < {COLLAPSE_SPREAD}; 2 for spread-out features)")
    return None


def chance_level(y: torch.Tensor, n_classes: int) -> float:
    """Accuracy of always predicting the most frequent class of ``y``."""
    if y.numel() == 0:
        return 0.0
    return float(torch.bincount(y.long(), minlength=n_classes).max()) / y.numel()


def chance_bound(chance: float) -> float:
    """The accuracy below which a model counts as at chance level, ``chance`` being a constant prediction's."""
    return chance + CHANCE_MARGIN * (1 - chance)


def chance_warning(accuracy: float, chance: float, where: str, aligned: tuple[float, float] | None = None) -> str | None:
    """A ``chance-level`` warning when ``accuracy`` is no better than ``chance`` (+ the margin), unless ``aligned``
    (the accuracy on the bias-aligned samples and a constant prediction's there) clears that bound: a model right
    where the bias attribute predicts the label and wrong elsewhere follows the bias (the shortcut a biased model
    learns, which the worst-group and conflicting accuracies show), it did not fail to learn."""
    bound = chance_bound(chance)
    if aligned is not None and aligned[0] >= chance_bound(aligned[1]):
        return None
    if accuracy < bound:
        return warning("chance-level",
                       f"{where} accuracy {accuracy:.3f} is no better than chance ({chance:.3f}, the most frequent "
                       f"class; counted as chance below {bound:.3f})")
    return None


def loss_instability(losses: Sequence[float], spike: float, end: float, min_fall: float) -> str | None:
    """Why the per-epoch training ``losses`` look unstable, or None.

    With ``fall(t) = L_0 - min_{s<t} L_s`` (how far the loss had fallen before epoch t): a *spike* is an epoch with
    ``L_t - L_{t-1} > spike * fall(t)`` (a jump back up) once ``fall(t) >= min_fall * |L_0|`` (the loss had fallen
    some way); the loss *ends high* when ``L_last - min L > end * (L_0 - min L)`` (also a slow drift back up).
    Scale-free, so it holds for losses that go negative (eps-SupInfoNCE) as for cross-entropy.
    """
    values = [float(v) for v in losses]
    if len(values) < 3 or any(v != v for v in values):  # too short to judge; NaN stops training before this
        return None
    first = values[0]
    for t in range(2, len(values)):
        fall, jump = first - min(values[:t]), values[t] - values[t - 1]
        if fall > 0 and fall >= min_fall * abs(first) and jump > spike * fall:
            return (f"the training loss jumped from {values[t - 1]:.4g} at epoch {t - 1} to {values[t]:.4g} at epoch "
                    f"{t}, {jump / fall:.0%} of its fall from {first:.4g} to {min(values[:t]):.4g} (more than "
                    f"health.loss_spike = {spike:g})")
    low = min(values)
    fall, rebound = first - low, values[-1] - low
    if fall > 0 and fall >= min_fall * abs(first) and rebound > end * fall:
        return (f"the training loss ended at {values[-1]:.4g}, above its minimum {low:.4g} (epoch {values.index(low)}) "
                f"by {rebound / fall:.0%} of its fall from {first:.4g} (more than health.loss_end = {end:g})")
    return None


def instability_warning(losses: Sequence[float], spike: float, end: float, min_fall: float) -> str | None:
    """An ``unstable-training`` warning from :func:`loss_instability`, or None."""
    reason = loss_instability(losses, spike, end, min_fall)
    return None if reason is None else warning("unstable-training", reason)
