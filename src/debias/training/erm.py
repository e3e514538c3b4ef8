"""ERM: cross-entropy training of the encoder and its head from scratch (the ``train_erm`` stage).

The task is :class:`debias.training.classifier.ClassifierTask` (every index once per epoch; its step run by
``erm.step``'s runner, :mod:`debias.training.captured`); the outputs are
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
from debias.params import ErmParams, HealthParams, ModelParams
from debias.training.captured import CUDA_GRAPH, check_capturable, step_runner
from debias.training.classifier import ClassifierTask, validator
from debias.training.loop import build_optimizer, build_scheduler, finish, fit, fits_on_device, resume_key
from debias.training.outputs import StageOutputs, note_resume, split_tensors, write_outputs
from debias.training.selection import check_rule_for


def train_erm(splits: dict[str, BiasedSplit], model_params: str | ModelParams, optim: ErmParams, seed: int,
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
    check_capturable("erm.step", optim.step, "erm", True, "", device, distributed.world_size(),
                     fits_on_device(train, device))  # before any work
    model_name = model_params if isinstance(model_params, str) else model_params.name
    model = build_model(model_params, train.n_classes, tuple(train.x.shape[1:])).to(device)
    graph_device = device if optim.step == CUDA_GRAPH else None  # graph-safe (build_optimizer)
    optimizer = build_optimizer(model.parameters(), optim.optimizer, optim.lr, optim.momentum, optim.weight_decay,
                                graph_device)
    scheduler = build_scheduler(optimizer, optim.lr_milestones, optim.lr_gamma)
    task = ClassifierTask(model, optimizer, train, optim.batch_size, generator, device, augment_shift=optim.augment_shift)
    task.runner = step_runner(optim.step, task.step_compute, device)
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
