"""Which epoch a training stage keeps: the selection rules (``erm.selection``, ``stage2.selection``), their scores,
and the selection block every training stage records (:func:`describe_selection`).

Rules live in :data:`RULES` (name -> :class:`SelectionRule`):

- ``last``: the last epoch;
- ``best_worst_group``: best validation worst-group accuracy (groups = class x true bias attribute), ties broken by
  validation unbiased accuracy, then average accuracy, then the earlier epoch;
- ``best_worst_class``: best validation worst-class accuracy, ties broken by the mean of the per-class accuracies,
  then average accuracy, then the earlier epoch. It needs no bias label at all: SubpopBench (Yang et al., ICML 2023,
  "Change is Hard") selects by worst-class accuracy when attributes are unknown in training and validation;
- ``best_unbiased``: best validation unbiased accuracy (the mean of the (class, bias) group accuracies), ties broken
  by validation worst-group accuracy, then average accuracy, then the earlier epoch. Every validation image counts,
  where worst-group accuracy is decided by the 6-30 images of one group;
- ``best_worst_inferred_group``: best validation worst-inferred-group accuracy, the validation split's groups being
  the ones ``infer_groups`` inferred with the same fitted inference as the training split's; ties broken by the
  mean inferred-group accuracy, then average accuracy, then the earlier epoch. ERM cannot use it: its groups are
  inferred from ERM itself (:func:`check_rule_for`).

The label-free validation numbers these rules read come from :func:`label_free_scalars` (``val/worst_class``,
``val/mean_class``, ``val/worst_class_n``; with inferred groups ``val/worst_inferred_group``,
``val/mean_inferred_group``, ``val/worst_inferred_group_n``). Every rule whose numbers every epoch has is also
replayed on the history (:func:`picks_by_rule`), so the selection block says which epoch each rule would have kept:
with true attributes a label-free rule can be compared with the oracle from one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from debias.metrics import group_accuracy


@dataclass(frozen=True)
class SelectionRule:
    """A selection rule: the validation number it maximises (``key``; None: the last epoch), that number's group size
    (``n_key``: how many images decide a lead), the tie-breaks in order, and the words that name them."""

    description: str
    key: str | None = None
    n_key: str | None = None
    tie_breaks: tuple[str, ...] = ()
    unit: str = ""  # the set whose accuracy ``key`` is: "worst group", "worst class", "worst inferred group"
    needs_inferred_groups: bool = False


RULES: dict[str, SelectionRule] = {
    "last": SelectionRule("the last epoch"),
    "best_worst_group": SelectionRule(
        "best validation worst-group accuracy; ties broken by validation unbiased accuracy, then average accuracy, "
        "then the earlier epoch", "val/worst_group", "val/worst_group_n", ("val/unbiased", "val/avg"), "worst group"),
    "best_worst_class": SelectionRule(
        "best validation worst-class accuracy (no bias label needed); ties broken by the mean class accuracy, then "
        "average accuracy, then the earlier epoch", "val/worst_class", "val/worst_class_n",
        ("val/mean_class", "val/avg"), "worst class"),
    "best_worst_inferred_group": SelectionRule(
        "best validation worst-inferred-group accuracy (groups from infer_groups, no bias label needed); ties broken "
        "by the mean inferred-group accuracy, then average accuracy, then the earlier epoch",
        "val/worst_inferred_group", "val/worst_inferred_group_n", ("val/mean_inferred_group", "val/avg"),
        "worst inferred group", needs_inferred_groups=True),
    "best_unbiased": SelectionRule(
        "best validation unbiased accuracy (the mean over the (class, bias) groups, so every validation image counts); "
        "ties broken by validation worst-group accuracy, then average accuracy, then the earlier epoch",
        "val/unbiased", None, ("val/worst_group", "val/avg"), "unbiased mean"),
}
SELECTION_RULES = {name: rule.description for name, rule in RULES.items()}  # name -> what it keeps

# Short names of the validation numbers in the reasons the selection block gives.
WORDS = {"val/worst_group": "worst-group", "val/unbiased": "unbiased", "val/avg": "average",
         "val/worst_class": "worst-class", "val/mean_class": "class-mean",
         "val/worst_inferred_group": "worst-inferred-group", "val/mean_inferred_group": "inferred-group mean"}


def rule(selection: str) -> SelectionRule:
    """``RULES[selection]``; an unknown name is refused, naming the allowed ones."""
    if selection not in RULES:
        raise ValueError(f"selection = '{selection}'; allowed: {', '.join(RULES)}")
    return RULES[selection]


def check_rule_for(stage: str, selection: str, inferred_groups: bool) -> None:
    """Refuse ``selection`` for a stage (``stage``: its params key, e.g. ``erm.selection``) that has no inferred
    groups of the validation split when the rule needs them, naming the rules it may use."""
    if rule(selection).needs_inferred_groups and not inferred_groups:
        allowed = [name for name, r in RULES.items() if not r.needs_inferred_groups]
        raise ValueError(f"{stage} = {selection}: this stage has no inferred groups to select by (ERM trains before "
                         f"infer_groups, which infers the groups from ERM's model); allowed: {', '.join(allowed)}")


def _number(value: Any) -> bool:
    """A validation number (not the "needs bias labels" marker a run without bias labels records instead)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def computable_rules(metrics: dict[str, float]) -> list[str]:
    """The rules whose validation number ``metrics`` (one epoch's) has, in :data:`RULES`'s order."""
    return [name for name, r in RULES.items() if r.key is None or _number(metrics.get(r.key))]


def selection_score(metrics: dict[str, float], selection: str) -> tuple[float, ...]:
    """Higher is better (compared as a tuple): the rule's validation number, then its tie-breaks (0 where absent), so
    an epoch only wins a tie (e.g. 0 at every epoch) by being better on the tie-breaks; ``last`` is the epoch index.
    A rule whose number the epoch lacks is refused, naming it."""
    chosen = rule(selection)
    if chosen.key is None:
        return (float(metrics["epoch"]),)
    if not _number(metrics.get(chosen.key)):
        raise ValueError(f"selection = {selection} reads the validation number {chosen.key}, which this stage's "
                         f"validation does not compute; allowed here: "
                         f"{', '.join(computable_rules(metrics))}")
    ties = (metrics.get(key, 0.0) for key in chosen.tie_breaks)
    return (float(metrics[chosen.key]), *(float(value) if _number(value) else 0.0 for value in ties))


def picks_by_rule(history: list[dict[str, float]]) -> dict[str, int]:
    """The epoch each rule would keep on ``history`` (the first best score, as :func:`fit` keeps it), for every rule
    whose validation number every epoch has (cheap: the numbers are already computed)."""
    picks: dict[str, int] = {}
    for name in RULES:
        if not history or any(name not in computable_rules(row) for row in history):
            continue
        best = max(history, key=lambda row: (selection_score(row, name), -int(row["epoch"])))
        picks[name] = int(best["epoch"])
    return picks


# A kept epoch that beats every other epoch's validation number by at most this many images of its own worst group
# (class, inferred group) is flagged (``fragile-selection``): one or two images of a group of 6-18 decide it (ours: a
# Wilson interval of such a group spans 30-60 points, so a one- or two-image lead is well inside it).
FRAGILE_IMAGES = 2


def won_by_images(kept_accuracy: float, kept_n: int, runner_up_accuracy: float) -> int:
    """How many images of the kept epoch's worst group (``kept_n`` images, ``kept_accuracy`` of them right) it must
    lose before its accuracy is no better than ``runner_up_accuracy``: ``correct - floor(runner_up * n)`` (0: tied
    or behind)."""
    correct = round(kept_accuracy * kept_n)
    return max(0, correct - math.floor(runner_up_accuracy * kept_n + 1e-9))


def selection_margin(history: list[dict[str, float]], chosen: dict[str, float],
                     selection: str = "best_worst_group") -> dict[str, Any]:
    """The kept epoch's lead on the rule's validation number over the best other epoch: ``runner_up_epoch``,
    ``runner_up_<number>`` (``runner_up_worst_group`` for ``best_worst_group``) and ``won_by_images`` (None where the
    history has one epoch or does not record the size of the group that number is the accuracy of)."""
    r = rule(selection)
    key, n_key = str(r.key), str(r.n_key)
    runner_key = "runner_up_" + key.removeprefix("val/")
    others = [row for row in history if int(row["epoch"]) != int(chosen["epoch"])]
    margin: dict[str, Any] = {"runner_up_epoch": None, runner_key: None, "won_by_images": None}
    if not others:
        return margin
    runner = max(others, key=lambda row: (float(row[key]), -int(row["epoch"])))
    margin.update({"runner_up_epoch": int(runner["epoch"]), runner_key: float(runner[key])})
    if chosen.get(n_key):
        margin["won_by_images"] = won_by_images(float(chosen[key]), int(chosen[n_key]), float(runner[key]))
    return margin


def describe_selection(history: list[dict[str, float]], selected_epoch: int, selection: str) -> dict[str, Any]:
    """``{"rule", "selected_epoch", "degenerate", "fragile", "reason", "picks"}`` (a rule with a validation number
    adds :func:`selection_margin`'s keys and ``unit``): the selection block of a training stage's metrics.
    ``picks`` is :func:`picks_by_rule`: the epoch every rule computable on this history would have kept.

    Degenerate (rules with a validation number): that number was 0 at every epoch (the rule had nothing to choose by
    and the tie-breaks chose), or the first of several epochs was kept (no later epoch beat the untrained-most model;
    often the same failure; ``first_epoch`` True says it is this case). Fragile: not degenerate, and the kept epoch tied another epoch's number (the tie-breaks
    chose) or beat every other epoch's number by 1 to :data:`FRAGILE_IMAGES` images of the group (class, inferred
    group) it is the accuracy of."""
    r = rule(selection)
    block: dict[str, Any] = {"rule": selection, "selected_epoch": selected_epoch, "degenerate": False,
                             "fragile": False, "reason": "", "picks": picks_by_rule(history)}
    if r.key is None or not history:
        block["reason"] = r.description
        return block
    key, word = r.key, WORDS[r.key]
    block["unit"] = r.unit
    chosen = next(row for row in history if int(row["epoch"]) == selected_epoch)
    margin = selection_margin(history, chosen, selection)
    block.update(margin)
    values = [float(row[key]) for row in history]
    tied = [int(row["epoch"]) for row in history if float(row[key]) == float(chosen[key])]
    scores = ", ".join(f"{WORDS[k]} {float(chosen.get(k, 0)):.3f}" for k in (key, *r.tie_breaks))
    scores = f"validation {scores}"
    if max(values) == 0:
        block.update(degenerate=True, reason=f"validation {word} accuracy was 0 at every epoch ({len(history)}); "
                                             f"epoch {selected_epoch} kept by validation {WORDS[r.tie_breaks[0]]} "
                                             f"accuracy ({scores})")
    elif selected_epoch == int(history[0]["epoch"]) and len(history) > 1:
        later = ", ".join(f"{float(row[key]):.3f}" for row in history[1:])
        block.update(degenerate=True, first_epoch=True, reason=f"the first epoch was kept: no later epoch of {len(history)} beat its "
                                             f"{scores} (the later epochs' validation {word}: {later})")
    elif len(tied) > 1:
        block.update(fragile=True, reason=f"epochs {tied} tie on validation {word} accuracy; epoch {selected_epoch} "
                                          f"kept by the tie-breaks ({scores})")
    else:
        block["reason"] = f"best validation {word} accuracy ({scores})"
        won = margin["won_by_images"]
        if won is not None:
            n = int(chosen[str(r.n_key)])
            runner = margin["runner_up_" + key.removeprefix("val/")]
            block["reason"] += (f"; it won by {won} image{'s' if won != 1 else ''} of its {r.unit} "
                                f"({round(float(chosen[key]) * n)} of {n} right) over epoch "
                                f"{margin['runner_up_epoch']}'s {runner:.3f}")
            block["fragile"] = 1 <= won <= FRAGILE_IMAGES
    return block


# --------------------------------------------------------------------------- label-free validation numbers

def _worst_and_mean(pred: torch.Tensor, y: torch.Tensor, group: torch.Tensor, prefix: str) -> dict[str, float]:
    """``{prefix}worst``-style numbers over the groups present: worst accuracy, mean accuracy, the worst one's size
    (of the smallest, where several tie on it)."""
    group = group.detach().cpu().long()
    hits, counts = group_accuracy(pred.detach().cpu(), y.detach().cpu(), group, int(group.max()) + 1)
    present = counts > 0
    accuracy = hits[present] / counts[present]
    worst = float(accuracy.min())
    worst_n = int(counts[present][accuracy == accuracy.min()].min())
    return {f"val/worst_{prefix}": worst, f"val/mean_{prefix}": float(accuracy.mean()),
            f"val/worst_{prefix}_n": float(worst_n)}


def label_free_scalars(pred: torch.Tensor, y: torch.Tensor, inferred_group: torch.Tensor | None = None
                       ) -> dict[str, float]:
    """The validation numbers the label-free rules read, from predictions ``pred`` of classes ``y`` [N]:
    ``val/worst_class``, ``val/mean_class``, ``val/worst_class_n`` (classes present only) and, given the split's
    ``inferred_group`` [N] (int64), ``val/worst_inferred_group``, ``val/mean_inferred_group``,
    ``val/worst_inferred_group_n`` (inferred groups present only: an empty one is skipped, never counted as 0)."""
    if y.numel() == 0:
        raise ValueError("label_free_scalars: the split holds no samples")
    out = _worst_and_mean(pred, y, y, "class")
    if inferred_group is not None:
        if len(inferred_group) != len(y):
            raise ValueError(f"label_free_scalars: {len(inferred_group)} inferred groups for {len(y)} validation "
                             "images: they belong to another split; rerun infer_groups")
        out.update(_worst_and_mean(pred, y, inferred_group, "inferred_group"))
    return out
