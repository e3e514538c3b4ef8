"""ERM: cross-entropy training of the encoder and its head from scratch (the ``train_erm`` stage).

The task is :class:`debias.training.classifier.ClassifierTask` (every index once per epoch); the outputs are
:func:`debias.training.outputs.write_outputs`'s. Under ``torchrun`` every rank trains (see
:mod:`debias.core.distributed`); only rank 0 writes outputs.
"""

from __future__ import annotations

from debias.core import distributed
from debias.core.resources import check_classifier_fits
from debias.core.runtime import pick_device, seed_everything
from debias.core.stage_run import StageRun
from debias.data.store import BiasedSplit
from debias.models import build_model
from debias.params import HealthParams, ModelParams, OptimParams
from debias.training.classifier import ClassifierTask, validator
from debias.training.loop import build_optimizer, build_scheduler, finish, fit, resume_key
from debias.training.outputs import StageOutputs, note_resume, split_tensors, write_outputs
from debias.training.selection import check_rule_for


def train_erm(splits: dict[str, BiasedSplit], model_params: str | ModelParams, optim: OptimParams, seed: int,
              run: StageRun, out: StageOutputs, thresholds: HealthParams | None = None) -> dict[str, dict]:
    """Cross-entropy training from scratch, selection by ``optim.selection``, then every output.

    ``model_params`` is ``params.model`` (or just a registry name, with the encoder's default options);
    ``thresholds`` is ``params.health`` (its defaults when None).

    Under ``torchrun`` every rank trains (joining the process group first); rank 0 writes the
    outputs and returns the accuracy reports, the other ranks return ``{}``.
    """
    check_rule_for("erm.selection", optim.selection, inferred_groups=False)  # before any work
    device = distributed.init_from_env(pick_device())
    generator = seed_everything(seed)
    train = splits["train"]
    model_name = model_params if isinstance(model_params, str) else model_params.name
    model = build_model(model_params, train.n_classes, tuple(train.x.shape[1:])).to(device)
    optimizer = build_optimizer(model.parameters(), optim.optimizer, optim.lr, optim.momentum, optim.weight_decay)
    scheduler = build_scheduler(optimizer, optim.lr_milestones, optim.lr_gamma)
    task = ClassifierTask(model, optimizer, train, optim.batch_size, generator, device, augment_shift=optim.augment_shift)
    check_classifier_fits(model, optimizer, model_name, "erm", optim.batch_size, optim.eval_batch_size, len(train),
                          max(len(split) for split in splits.values()), tuple(train.x.shape[1:]), device)
    key = resume_key({"seed": seed, "model": model_name, "options": model.encoder.options,
                      "erm": optim.model_dump(mode="json")}, split_tensors(splits))
    result = fit(task, optimizer, optim.epochs, validator(model, splits["val"], optim.eval_batch_size, device),
                 selection=optim.selection, scheduler=scheduler, state_path=out.resume, state_key=key,
                 on_epoch=lambda epoch, metrics: run.log_metrics(metrics, step=epoch), label="train_erm",
                 divergence_advice=f"erm.lr (now {optim.lr:g})")
    note_resume(run, result)
    reports: dict[str, dict] = {}
    if distributed.is_main():
        reports = write_outputs(model, model_name, result, splits, run, out, optim.eval_batch_size, device, "erm",
                                meta={"method": "erm", "head_trained": True}, thresholds=thresholds)
        finish(out.resume)
    distributed.barrier()
    return reports
