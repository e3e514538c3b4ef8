"""``true`` (oracle): label = the true bias attribute a; minority = ~aligned; group = y * A + a."""

from __future__ import annotations

from debias.groups.registry import GroupInference, register_group_method


def infer_true(train, z, logits, params, seed: int) -> GroupInference:
    """label = a (oracle); minority = ~aligned; group = y * A + a."""
    return GroupInference(train.a.clone(), train.g.clone(), ~train.aligned.bool())


def transfer_true(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                  train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """The oracle: label = the validation split's a; group = y * A + a; minority = ~aligned."""
    from debias.groups.discovered import attributes

    if attributes(val) is None:
        raise ValueError("groups.method = true needs the validation split's bias attribute, which it lacks; allowed "
                         "without bias labels: pred, cluster, soft")
    return GroupInference(val.a.clone(), val.g.clone(), ~val.aligned.bool(), y=val.y.clone())


register_group_method("true", infer_true, display="true bias labels", needs_attribute=True,
                      transfer=transfer_true)
