"""``pred`` (CNC Sec. 4): label = argmax of the ERM logits; minority = label != y; group = y * C + label."""

from __future__ import annotations

from debias.groups.registry import GroupInference, register_group_method


def infer_pred(train, z, logits, params, seed: int) -> GroupInference:
    """label = argmax logits; minority = label != y; group = y * C + label."""
    label = logits.argmax(1).long()
    return GroupInference(label, train.y * train.n_classes + label, label != train.y)


def transfer_pred(val: BiasedSplit, val_z: torch.Tensor, val_logits: torch.Tensor, train_z: torch.Tensor,
                  train_inference: GroupInference, params: GroupsParams) -> GroupInference:
    """label = argmax of ERM's validation logits; group = y * C + label; minority = label != y."""
    label = val_logits.argmax(1).long()
    return GroupInference(label, val.y * val.n_classes + label, label != val.y, y=val.y.clone())


register_group_method("pred", infer_pred, display="ERM predictions", schema_default=True, transfer=transfer_pred)
