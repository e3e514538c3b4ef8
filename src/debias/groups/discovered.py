"""What group inference found, beyond the training split's table: the validation split's inferred groups (for the
label-free selection rule ``best_worst_inferred_group``) and a summary of every inferred group (for the report's
montage of discovered groups).

Validation groups (:func:`infer_val_groups`: the ``transfer`` each ``groups.method`` declares) come from the
same fitted inference as the training split's, applied to the validation split's ERM outputs:

- ``pred`` / ``soft``: label = argmax of ERM's validation logits; group = y * C + label (the training rule itself);
- ``true``: the validation split's true attribute (the oracle, as for training);
- ``cluster``: a vote of the k nearest training points in ERM's feature space z (k = ``groups.cluster.umap_neighbors``,
  the neighbourhood UMAP itself builds on; ties: the lower id). With ``per_class = 1`` the clusters span all classes,
  so the vote is over training points of every class and decides the inferred label (group = y * C + label); with
  ``per_class = k > 1`` the clusters lie within a class, so the vote is over the point's own class and decides its
  inferred group. Ours: the clusters were fitted on a UMAP of the training points only, and a nearest-neighbour vote
  places a point outside that fit among them without refitting (a vote within the point's own class would let the
  class's majority outvote its small training minorities). How often the vote finds the validation digit's true
  colour is in infer_groups' metrics (``reports/metrics/groups.json``), not claimed here.

The summary (:func:`group_summary`) lists per (class, inferred group) of the training split its size, ERM's
accuracy on it, the true attribute's share where the split has one, and a few example indices
(:func:`pick_examples`, seeded: the same images every run).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from debias.core.io import save_json
from debias.data.store import BiasedSplit
from debias.groups.inference import GroupInference
from debias.groups.registry import METHODS, group_method
from debias.params import GroupsBase
from debias.core.paths import GROUPS_SUMMARY, GROUPS_VAL_TABLE  # noqa: F401  (re-exported)

EXAMPLES_PER_GROUP = 8  # images per inferred group in the report's montage (ours: one row, readable at 110 dpi)


def attributes(split: BiasedSplit) -> torch.Tensor | None:
    """The split's true bias attribute [N], or None where it has none (absent, or negative: unknown)."""
    a = getattr(split, "a", None)
    if a is None or a.numel() != len(split) or bool((a < 0).any()):
        return None
    return a


def infer_val_groups(method: str, val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor,
                     train_z: torch.Tensor, train_inference: GroupInference, params: GroupsBase) -> GroupInference:
    """The validation split's inferred groups by the method's declared ``transfer`` (see the module docstring)."""
    transfer = group_method(method).transfer_fn()
    if transfer is None:
        with_transfer = [name for name, spec in METHODS.items() if spec.transfer is not None]
        raise ValueError(f"groups.method = '{method}' labels no validation split, so nothing can select by inferred "
                         f"groups; allowed: {', '.join(with_transfer)}")
    if len(val_z) != len(val) or len(val_logits) != len(val):
        raise ValueError(f"ERM validation embeddings hold {len(val_z)} rows and logits {len(val_logits)}, the "
                         f"validation split {len(val)}: they come from another split; rerun train_erm")
    return transfer(val, val_z.detach().cpu(), val_logits.detach().cpu().float(), train_z.detach().cpu(),
                             train_inference, params)


# --------------------------------------------------------------------------- the discovered groups, summarised

def pick_examples(y: torch.Tensor, group: torch.Tensor, per_group: int, seed: int) -> dict[tuple[int, int], list[int]]:
    """Per (class, inferred group) present, up to ``per_group`` training indices of exactly that class and group,
    drawn by a permutation seeded with ``seed`` (the same images every run), in increasing order."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    picked: dict[tuple[int, int], list[int]] = {}
    for index in order.tolist():
        key = (int(y[index]), int(group[index]))
        chosen = picked.setdefault(key, [])
        if len(chosen) < per_group:
            chosen.append(index)
    return {key: sorted(indices) for key, indices in sorted(picked.items())}


def group_summary(inference: GroupInference, train: BiasedSplit, erm_logits: torch.Tensor, seed: int,
                  per_group: int = EXAMPLES_PER_GROUP) -> list[dict]:
    """Per (class, inferred group) of the training split, sorted by class then size (largest first):
    ``{"class", "group", "inferred_label", "n", "erm_correct", "erm_accuracy", "attribute_share", "examples"}``;
    ``attribute_share`` maps each true attribute value present to its share of the group (None: the split has no
    attribute)."""
    y, group = train.y.cpu().long(), inference.inferred_group.cpu().long()
    correct = erm_logits.argmax(1).cpu() == y
    a = attributes(train)
    labels = inference.labels_by_group()
    examples = pick_examples(y, group, per_group, seed)
    rows = []
    for (label, g), shown in examples.items():
        members = (y == label) & (group == g)
        n = int(members.sum())
        share = None
        if a is not None:
            values, counts = a[members].unique(return_counts=True)
            share = {str(int(v)): float(c) / n for v, c in zip(values.tolist(), counts.tolist())}
        rows.append({"class": label, "group": g, "inferred_label": labels.get(g), "n": n,
                     "erm_correct": int(correct[members].sum()), "erm_accuracy": float(correct[members].double().mean()),
                     "attribute_share": share, "examples": shown})
    return sorted(rows, key=lambda row: (row["class"], -row["n"], row["group"]))


def save_summary(path: str | Path, rows: list[dict], method: str) -> None:
    """Write :func:`group_summary`'s rows with the method that inferred the groups (JSON, atomically)."""
    save_json(Path(path), {"method": method, "groups": rows})
