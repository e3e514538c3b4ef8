"""What group inference found, beyond the training split's table: the validation split's inferred groups (for the
label-free selection rule ``best_worst_inferred_group``) and a summary of every inferred group (for the report's
montage of discovered groups).

Validation groups (:func:`infer_val_groups`, one function per ``groups.method`` in :data:`TRANSFERS`) come from the
same fitted inference as the training split's, applied to the validation split's ERM outputs:

- ``pred`` / ``soft``: label = argmax of ERM's validation logits; group = y * C + label (the training rule itself);
- ``true``: the validation split's true attribute (the oracle, as for training);
- ``cluster``: a vote of the k nearest training points in ERM's feature space z (k = ``groups.cluster.umap_neighbors``,
  the neighbourhood UMAP itself builds on; ties: the lower id). With ``per_class = 1`` the clusters span all classes,
  so the vote is over training points of every class and decides the inferred label (group = y * C + label); with
  ``per_class = k > 1`` the clusters lie within a class, so the vote is over the point's own class and decides its
  inferred group. Ours: the clusters were fitted on a UMAP of the training points only, and a nearest-neighbour vote
  places a point outside that fit among them without refitting. Measured on one ERM run of the default params (1,078
  training, 269 validation digits, 79 % of them bias-conflicting): the vote's label is the validation digit's true
  colour for 95.5 % of them (k = 15), the clusters' own labels the training digit's for 99.3 %;
  a vote within the own class instead found it for 45 % only (the training minorities are too small to win a vote).

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
from debias.params import GroupsParams
from debias.core.paths import GROUPS_SUMMARY, GROUPS_VAL_TABLE  # noqa: F401  (re-exported)

EXAMPLES_PER_GROUP = 8  # images per inferred group in the report's montage (ours: one row, readable at 110 dpi)


def attributes(split: BiasedSplit) -> torch.Tensor | None:
    """The split's true bias attribute [N], or None where it has none (absent, or negative: unknown)."""
    a = getattr(split, "a", None)
    if a is None or a.numel() != len(split) or bool((a < 0).any()):
        return None
    return a


def _group_labels(inference: GroupInference) -> dict[int, int]:
    """Inferred group -> its inferred bias label (every method gives one label per group)."""
    pairs = torch.stack([inference.inferred_group, inference.inferred_label], 1).unique(dim=0)
    return {int(g): int(label) for g, label in pairs.tolist()}


def _from_groups(val: BiasedSplit, group: torch.Tensor, train_inference: GroupInference) -> GroupInference:
    """A validation inference from its groups: labels as the training groups', minority = label != y."""
    labels = _group_labels(train_inference)
    label = torch.tensor([labels.get(int(g), -1) for g in group.tolist()], dtype=torch.long)
    label = torch.where(label < 0, val.y, label)
    return GroupInference(label, group, label != val.y, y=val.y.clone())


def transfer_pred(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                  train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """label = argmax of ERM's validation logits; group = y * C + label; minority = label != y."""
    label = val_logits.argmax(1).long()
    return GroupInference(label, val.y * val.n_classes + label, label != val.y, y=val.y.clone())


def transfer_true(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                  train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """The oracle: label = the validation split's a; group = y * A + a; minority = ~aligned."""
    if attributes(val) is None:
        raise ValueError("groups.method = true needs the validation split's bias attribute, which it lacks; allowed "
                         "without bias labels: pred, cluster, soft")
    return GroupInference(val.a.clone(), val.g.clone(), ~val.aligned.bool(), y=val.y.clone())


def nearest_group_vote(val_z: torch.Tensor, val_y: torch.Tensor, train_z: torch.Tensor, train_y: torch.Tensor,
                       train_group: torch.Tensor, k: int, block: int = 1024) -> torch.Tensor:
    """Per validation point, the group most frequent among its ``k`` nearest training points (Euclidean) of the same
    class (all training points where its class has none); ties: the lower group id. int64 [M]."""
    out = torch.empty(len(val_z), dtype=torch.long)
    n_ids = int(train_group.max()) + 1 if len(train_group) else 1
    for label in val_y.unique().tolist():
        rows = torch.nonzero(val_y == label).flatten()
        pool = torch.nonzero(train_y == label).flatten()
        if len(pool) == 0:
            pool = torch.arange(len(train_y))
        candidates, groups = train_z[pool].double(), train_group[pool]
        kk = min(k, len(pool))
        for start in range(0, len(rows), block):
            chunk = rows[start : start + block]
            distances = torch.cdist(val_z[chunk].double(), candidates)
            nearest = torch.topk(distances, kk, dim=1, largest=False).indices  # [b, kk]
            votes = torch.zeros(len(chunk), n_ids, dtype=torch.long)
            votes.scatter_add_(1, groups[nearest], torch.ones_like(nearest))
            out[chunk] = votes.argmax(1)  # argmax returns the first maximum: the lower group id on a tie
    return out


def transfer_cluster(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                     train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """``per_class = 1`` (clusters over all points, matched to classes): label = the majority inferred label of the
    nearest training points of any class in z, group = y * C + label. ``per_class = k > 1`` (clusters within each
    class): the majority inferred group of the nearest training points of the point's own class."""
    assert train_inference.y is not None
    k = params.cluster.umap_neighbors
    if params.cluster.per_class == 1:
        anywhere_val, anywhere_train = torch.zeros_like(val.y), torch.zeros_like(train_inference.y)
        label = nearest_group_vote(val_z, anywhere_val, train_z, anywhere_train, train_inference.inferred_label, k)
        return GroupInference(label, val.y * val.n_classes + label, label != val.y, y=val.y.clone())
    group = nearest_group_vote(val_z, val.y, train_z, train_inference.y, train_inference.inferred_group, k)
    return _from_groups(val, group, train_inference)


TransferFn = Callable[[BiasedSplit, torch.Tensor, torch.Tensor, torch.Tensor, GroupInference, GroupsParams],
                      GroupInference]
TRANSFERS: dict[str, TransferFn] = {"pred": transfer_pred, "soft": transfer_pred, "true": transfer_true,
                                    "cluster": transfer_cluster}


def infer_val_groups(method: str, val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor,
                     train_z: torch.Tensor, train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """The validation split's inferred groups by ``TRANSFERS[method]`` (see the module docstring)."""
    if method not in TRANSFERS:
        raise ValueError(f"groups.method = '{method}': no validation transfer; allowed: {', '.join(TRANSFERS)}")
    if len(val_z) != len(val) or len(val_logits) != len(val):
        raise ValueError(f"ERM validation embeddings hold {len(val_z)} rows and logits {len(val_logits)}, the "
                         f"validation split {len(val)}: they come from another split; rerun train_erm")
    return TRANSFERS[method](val, val_z.detach().cpu(), val_logits.detach().cpu().float(), train_z.detach().cpu(),
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
    labels = _group_labels(inference)
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
