"""Stage 2's orchestration: build the registered ``stage2.method``, check its step fits in memory, train it with
:func:`debias.training.loop.fit` and write the stage's outputs. Nothing here depends on which method runs: what
differs is read from its :class:`~debias.training.methods.registry.MethodSpec`.

Under ``torchrun`` (:mod:`debias.core.distributed`) each batch (a shuffled minibatch, a CNC forward
chunk of contrastive batches, WCL's two views) is the global batch: every rank draws and augments
all of it with the same generator, forwards its contiguous shard and all-gathers the features
(and logits) with gradient, so the loss, negatives from every rank included, is the
single-process loss of the global batch; the ranks' gradients are summed before each step.
Labels and bias labels need no gather: every rank holds the batch's indices.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from debias.core import distributed
from debias.core.io import save_json
from debias.core.resources import check_stage2_fits
from debias.core.runtime import pick_device, seed_everything
from debias.core.stage_run import StageRun
from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import HeadParams, Params
from debias.training.loop import finish, fit, resume_key
from debias.training.methods.base import Stage2Inputs, setup_method
from debias.training.methods.head import head_validator
from debias.training.methods.registry import method_spec
from debias.training.outputs import StageOutputs, note_resume, split_tensors, write_outputs
from debias.training.selection import check_rule_for

__all__ = ["stage2_validator", "train_stage2"]


def stage2_validator(model: Network, splits: dict[str, BiasedSplit], method: str, batch_size: int,
                     device: torch.device, head: HeadParams | None = None,
                     val_inferred_group: torch.Tensor | None = None) -> Callable[[], dict[str, float]]:
    """Validation scalars (per inferred group too, given the validation split's ``val_inferred_group``); methods
    without a jointly trained head get it fitted first (:func:`fit_head` with ``stage2.head``'s weight decay and
    iterations)."""
    return head_validator(model, splits, method_spec(method).head_trained, batch_size, device, head or HeadParams(),
                          val_inferred_group)


def train_stage2(params: Params, splits: dict[str, BiasedSplit], inferred: torch.Tensor, minority: torch.Tensor,
                 erm_state: dict[str, torch.Tensor] | None, run: StageRun, out: StageOutputs,
                 inferred_group: torch.Tensor | None = None, bias_scores: torch.Tensor | None = None,
                 val_inferred_group: torch.Tensor | None = None,
                 params_warnings: list[str] | None = None) -> dict[str, dict]:
    """Train ``stage2.method``, keep the selected epoch (best validation worst-group by default), write outputs.

    ``inferred_group`` and ``bias_scores`` are the groups table's other columns (:class:`Stage2Inputs`);
    ``val_inferred_group`` the validation split's inferred groups (``stage2.selection =
    best_worst_inferred_group`` selects by them, and every epoch records its accuracy on them).
    ``params_warnings``: what the params alone say of the run (negligible-param), recorded with its warnings.

    Under ``torchrun`` every rank trains (joining the process group first); rank 0 writes the
    outputs and returns the accuracy reports, the other ranks return ``{}``.
    """
    s2 = params.stage2
    check_rule_for("stage2.selection", s2.selection, inferred_groups=val_inferred_group is not None)
    spec = method_spec(s2.method)
    device = distributed.init_from_env(pick_device())
    generator = seed_everything(params.seed)
    setup = setup_method(Stage2Inputs(splits, inferred, minority, erm_state, params, device, generator,
                                      inferred_group, bias_scores))
    if not spec.head_trained:  # the per-epoch head reads z or z / |z| (stage2.head.features); saved with the model
        setup.model.head_input = s2.head.features
    check_stage2_fits(s2.method, list(setup.task.modules().values()), setup.optimizer, params, len(splits["train"]),
                      max(len(split) for split in splits.values()), tuple(splits["train"].x.shape[1:]), device)
    key = resume_key({"seed": params.seed, "model": params.model.name, "options": setup.model.encoder.options,
                      "stage2": s2.model_dump(mode="json"), "loss": params.loss.model_dump(mode="json")},
                     {**split_tensors(splits), "inferred": inferred, "minority": minority, "erm_state": erm_state,
                      **{k: v for k, v in (("inferred_group", inferred_group), ("bias_scores", bias_scores))
                         if v is not None}})
    advice = f"stage2.lr (now {s2.lr:g})"
    if spec.temperature is not None:
        temperature_key, temperature = spec.temperature(params)
        advice += f" or raise {temperature_key} (now {temperature:g})"
    result = fit(setup.task, setup.optimizer, s2.epochs,
                 stage2_validator(setup.model, splits, s2.method, s2.eval_batch_size, device, s2.head,
                                  val_inferred_group),
                 selection=s2.selection, scheduler=setup.scheduler, state_path=out.resume, state_key=key,
                 on_epoch=lambda epoch, metrics: run.log_metrics(metrics, step=epoch), label="train_contrastive",
                 divergence_advice=advice)
    note_resume(run, result)
    reports: dict[str, dict] = {}
    if distributed.is_main():
        reports = write_outputs(setup.model, params.model.name, result, splits, run, out, s2.eval_batch_size, device,
                                label=f"stage2 {s2.method}", extra_metrics={"method": s2.method},
                                meta={"method": s2.method, "head_trained": spec.head_trained},
                                warnings=setup.warnings(result.history) + list(params_warnings or []),
                                thresholds=params.health)
        info_path = out.metrics.with_name(f"{out.metrics.stem}_info.json")
        save_json(info_path, {"method": s2.method, **setup.report(result.history)})
        run.log_artifact(info_path)
        finish(out.resume)
    distributed.barrier()
    return reports
