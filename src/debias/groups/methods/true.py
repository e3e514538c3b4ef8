"""``true`` (oracle): label = the true bias attribute a; minority = ~aligned; group = y * A + a."""

from __future__ import annotations

from debias.groups.registry import GroupInference, register_group_method


def infer_true(train, z, logits, params, seed: int) -> GroupInference:
    """label = a (oracle); minority = ~aligned; group = y * A + a."""
    return GroupInference(train.a.clone(), train.g.clone(), ~train.aligned.bool())


register_group_method("true", infer_true, display="true bias labels", needs_attribute=True)
