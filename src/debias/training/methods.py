"""Stage-2 methods behind a registry (``stage2.method``); each trains a fresh encoder.

``cnc``             CNC (App. B): two-sided contrastive batches from inferred labels;
                    loss = lambda * cnc_two_sided + (1 - lambda) * CE on every batch point;
                    no projection head; ``accumulation`` contrastive batches per optimiser step.
``supcon`` / ``eps_supcon`` / ``eps_supinfonce``
                    shuffled batches; loss = alpha * L_con(z/|z|, y) + fairkl.weight * FairKL(z/|z|, y, b)
                    with b the bias labels from infer_groups (true or inferred); no projection head.
``wcl``             difficulty-weighted contrastive learning: debiased encoder E_d trained with the
                    relative-difficulty weighted InfoNCE between two augmented views, biased encoder
                    E_b trained jointly with the triplet loss (labels unused).
``jtt``             JTT: cross-entropy on the training set with the inferred minority (ERM errors when
                    groups.method is pred) repeated round(upweight) times per epoch.
``erm``             a second ERM run with stage 2's optimiser settings (seed-matched comparisons).

Methods that learn no classifier themselves (the contrastive ones and WCL) get their linear head
fitted at the end of every epoch on the frozen training features (:func:`fit_head`: multinomial
logistic regression, full-batch L-BFGS, no gradient into the encoder), so every epoch has a
validation worst-group accuracy for checkpoint selection; the linear_probe stage refits it with
its own regularisation search.

Under ``torchrun`` (:mod:`debias.distributed`) each batch (a shuffled minibatch, a CNC forward
chunk of contrastive batches, WCL's two views) is the global batch: every rank draws and augments
all of it with the same generator, forwards its contiguous shard and all-gathers the features
(and logits) with gradient, so the loss, negatives from every rank included, is the
single-process loss of the global batch; the ranks' gradients are summed before each step.
Labels and bias labels need no gather: every rank holds the batch's indices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from debias import distributed, losses
from debias.data.augment import random_shift, view
from debias.data.store import BiasedSplit
from debias.models import Network, build_model
from debias.params import Params
from debias.sampling import CNCBatchSampler
from debias.io import save_json
from debias.runtime import pick_device, seed_everything
from debias.tracking import StageRun
from debias.training.erm import (ClassifierTask, StageOutputs, note_resume, predict, split_tensors, validator,
                                 write_outputs)
from debias.training.loop import GeneratorTask, build_optimizer, build_scheduler, ensure_finite, finish, fit, resume_key
from debias.training.memory import check_stage2_fits


@dataclass
class Stage2Inputs:
    """Everything a method may use: splits, inferred bias labels, ERM weights, params, device, RNG."""

    splits: dict[str, BiasedSplit]
    inferred: torch.Tensor  # inferred bias label per training point
    minority: torch.Tensor  # bool: inferred minority per training point
    erm_state: dict[str, torch.Tensor] | None
    params: Params
    device: torch.device
    generator: torch.Generator


@dataclass
class Stage2Setup:
    task: Any  # a training.loop.Task
    model: Network
    optimizer: torch.optim.Optimizer
    scheduler: Any | None
    report: Callable[[], dict[str, Any]] = dict  # method facts for stage2_train_info.json, read after training


MethodFn = Callable[[Stage2Inputs], Stage2Setup]
HEAD_TRAINED = {"erm", "jtt", "cnc"}  # methods whose head is trained jointly with CE (others: online probe)
METHODS: dict[str, MethodFn] = {}


def register_method(name: str) -> Callable[[MethodFn], MethodFn]:
    def decorate(fn: MethodFn) -> MethodFn:
        METHODS[name] = fn
        return fn

    return decorate


def _fresh_model(inputs: Stage2Inputs) -> Network:
    train = inputs.splits["train"]
    return build_model(inputs.params.model, train.n_classes, tuple(train.x.shape[1:])).to(inputs.device)


def _optimiser(inputs: Stage2Inputs, parameters: Any) -> tuple[torch.optim.Optimizer, Any | None]:
    s2 = inputs.params.stage2
    optimizer = build_optimizer(parameters, s2.optimizer, s2.lr, s2.momentum, s2.weight_decay)
    return optimizer, build_scheduler(optimizer, s2.lr_milestones, s2.lr_gamma)


def _normalise(z: torch.Tensor) -> torch.Tensor:
    return F.normalize(z, dim=1)


class _Progress:
    """Running means for the progress bar and the epoch's returned metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, **values: torch.Tensor | float) -> None:
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + float(value)
        self.count += 1

    def means(self, prefix: str = "train/") -> dict[str, float]:
        return {f"{prefix}{k}": v / max(self.count, 1) for k, v in self.sums.items()}


# --------------------------------------------------------------------------- CE baselines


@register_method("erm")
def erm_method(inputs: Stage2Inputs) -> Stage2Setup:
    model = _fresh_model(inputs)
    optimizer, scheduler = _optimiser(inputs, model.parameters())
    task = ClassifierTask(model, optimizer, inputs.splits["train"], inputs.params.stage2.batch_size,
                          inputs.generator, inputs.device, augment_shift=inputs.params.stage2.augment_shift)
    return Stage2Setup(task, model, optimizer, scheduler)


def jtt_pool(n: int, minority: torch.Tensor, upweight: float) -> torch.Tensor:
    """Indices one JTT epoch visits: every point once, minority points round(upweight) times in all."""
    extra = max(int(round(upweight)) - 1, 0)
    errors = torch.nonzero(minority).flatten()
    return torch.cat([torch.arange(n), errors.repeat(extra)])


@register_method("jtt")
def jtt_method(inputs: Stage2Inputs) -> Stage2Setup:
    if not bool(inputs.minority.any()):
        raise ValueError("stage2.method = jtt: infer_groups found no inferred minority (error) point to upweight; "
                         "check groups.method, or train ERM less (JTT needs ERM errors)")
    model = _fresh_model(inputs)
    optimizer, scheduler = _optimiser(inputs, model.parameters())
    train = inputs.splits["train"]
    pool = jtt_pool(len(train), inputs.minority, inputs.params.stage2.jtt.upweight)
    task = ClassifierTask(model, optimizer, train, inputs.params.stage2.batch_size, inputs.generator,
                          inputs.device, pool=pool, augment_shift=inputs.params.stage2.augment_shift)
    facts = {"jtt_error_points": int(inputs.minority.sum()), "jtt_epoch_size": len(pool)}
    return Stage2Setup(task, model, optimizer, scheduler, report=lambda: facts)


# --------------------------------------------------------------------------- supervised contrastive (+ FairKL)

CONTRASTIVE: dict[str, Callable[[torch.Tensor, torch.Tensor, Params], torch.Tensor]] = {
    "supcon": lambda z, y, p: losses.supcon(z, y, p.loss.temperature),
    "eps_supcon": lambda z, y, p: losses.eps_supcon(z, y, p.loss.epsilon, p.loss.temperature),
    "eps_supinfonce": lambda z, y, p: losses.eps_supinfonce(z, y, p.loss.epsilon, p.loss.temperature),
}


class ContrastiveTask(GeneratorTask):
    """Shuffled batches; alpha * L_con + lambda * FairKL on normalised features, plus an online linear head."""

    def __init__(self, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit, bias: torch.Tensor,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.optimizer, self.train, self.bias = model, optimizer, train, bias
        self.params, self.generator, self.device = params, generator, device
        self.contrastive = CONTRASTIVE[params.stage2.method]

    def train_epoch(self, epoch: int) -> dict[str, float]:
        loss_params = self.params.loss
        order = torch.randperm(len(self.train), generator=self.generator)
        progress = _Progress()
        bar = tqdm(order.split(self.params.stage2.batch_size), desc=f"epoch {epoch}", leave=False,
                   disable=None if distributed.is_main() else True)
        for step, index in enumerate(bar):
            if len(index) < 2:
                continue  # a single sample has no pair
            x = random_shift(self.train.x[index], self.params.stage2.augment_shift, self.generator)
            x = x[distributed.shard_slice(len(index))].to(self.device)
            y = self.train.y[index].to(self.device)
            z = self.model.embed(x)
            zn = distributed.all_gather_rows(_normalise(z), len(index))
            con = self.contrastive(zn, y, self.params)
            loss = loss_params.alpha * con
            parts = {"contrastive": con.detach()}
            if loss_params.fairkl.weight > 0:
                reg = losses.fairkl(zn, y, self.bias[index].to(self.device), loss_params.fairkl.variant)
                loss = loss + loss_params.fairkl.weight * reg
                parts["fairkl"] = reg.detach()
            ensure_finite(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach(), **parts)
            bar.set_postfix(loss=f"{progress.sums['loss'] / progress.count:.4f}", refresh=False)
        return progress.means()


def _contrastive_method(inputs: Stage2Inputs) -> Stage2Setup:
    model = _fresh_model(inputs)
    optimizer, scheduler = _optimiser(inputs, model.encoder.parameters())
    task = ContrastiveTask(model, optimizer, inputs.splits["train"], inputs.inferred, inputs.params,
                           inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)


for _name in CONTRASTIVE:
    register_method(_name)(_contrastive_method)


# --------------------------------------------------------------------------- CNC


class CNCTask(GeneratorTask):
    """One epoch = ``len(sampler)`` two-sided contrastive batches, ``accumulation`` per optimiser step.

    A step's loss is the mean over its contrastive batches of
    lambda * cnc_two_sided(z/|z|) + (1 - lambda) * CE(head(z), y) over every point of the batch;
    batches are forwarded ``forward_chunk`` at a time, gradients accumulated (same gradient).
    """

    def __init__(self, model: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit,
                 sampler: CNCBatchSampler, params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.optimizer, self.train, self.sampler = model, optimizer, train, sampler
        self.params, self.generator, self.device = params, generator, device

    def extra_state(self) -> dict[str, Any]:
        return {**super().extra_state(), "sampler": self.sampler.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self.sampler.load_state_dict(state["sampler"])

    def _chunk_loss(self, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean contrastive and CE loss over ``count`` freshly drawn contrastive batches."""
        batch = self.sampler.sample_many(count)
        groups = [batch.anchors, batch.positives, batch.negatives] + ([batch.negatives2] if batch.negatives2 is not None else [])
        sizes = [g.shape[1] for g in groups]
        index = torch.cat(groups, dim=1)  # [count, 2M + 2N]
        x = random_shift(self.train.x[index.flatten()], self.params.stage2.augment_shift, self.generator)
        total = len(x)  # every rank holds the chunk's images; each forwards its shard of them
        x = x[distributed.shard_slice(total)].to(self.device)
        y = self.train.y[index.flatten()].to(self.device)
        z, logits = self.model.embed_and_classify(x)
        z, logits = distributed.all_gather_rows(z, total), distributed.all_gather_rows(logits, total)
        parts = _normalise(z).reshape(count, index.shape[1], -1).split(sizes, dim=1)
        contrastive = losses.cnc_two_sided(parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else None,
                                           self.params.loss.temperature)
        return contrastive, F.cross_entropy(logits, y), torch.tensor(count)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        cnc = self.params.stage2.cnc
        lam = cnc.contrastive_weight
        remaining = len(self.sampler)
        progress = _Progress()
        bar = tqdm(total=remaining, desc=f"epoch {epoch}", leave=False,
                   disable=None if distributed.is_main() else True)
        while remaining > 0:
            step_batches = min(cnc.accumulation, remaining)
            self.optimizer.zero_grad(set_to_none=True)
            done = 0
            while done < step_batches:
                count = min(cnc.forward_chunk, step_batches - done)
                contrastive, ce, _ = self._chunk_loss(count)
                loss = lam * contrastive + (1 - lam) * ce
                ensure_finite(loss, progress.count)
                (loss * (count / step_batches)).backward()
                progress.add(loss=loss.detach(), contrastive=contrastive.detach(), ce=ce.detach())
                done += count
                bar.update(count)
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            remaining -= step_batches
        bar.close()
        return progress.means()


@register_method("cnc")
def cnc_method(inputs: Stage2Inputs) -> Stage2Setup:
    cnc = inputs.params.stage2.cnc
    train = inputs.splits["train"]
    sampler = CNCBatchSampler(train.y, inputs.inferred, cnc.num_positives, cnc.num_negatives, cnc.two_sided,
                              cnc.batches_per_epoch, seed=inputs.params.seed,
                              skip_empty_classes=cnc.skip_empty_classes)
    model = _fresh_model(inputs)
    if cnc.init == "erm":
        if inputs.erm_state is None:
            raise ValueError("stage2.cnc.init = erm needs models/erm.pt; run train_erm first")
        model.load_state_dict(inputs.erm_state)
    optimizer, scheduler = _optimiser(inputs, model.parameters())
    return Stage2Setup(CNCTask(model, optimizer, train, sampler, inputs.params, inputs.generator, inputs.device), model, optimizer,
                       scheduler, report=lambda: {"sampler": sampler.report()})


# --------------------------------------------------------------------------- WCL


class WCLTask(GeneratorTask):
    """Two augmented views per image; E_d: weighted InfoNCE, E_b: triplet loss, head: online probe on E_d."""

    def __init__(self, model: Network, biased: Network, optimizer: torch.optim.Optimizer, train: BiasedSplit,
                 params: Params, generator: torch.Generator, device: torch.device) -> None:
        self.model, self.biased, self.optimizer, self.train = model, biased, optimizer, train
        self.params, self.generator, self.device = params, generator, device

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model, "biased": self.biased}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        wcl = self.params.stage2.wcl
        order = torch.randperm(len(self.train), generator=self.generator)
        progress = _Progress()
        for step, index in enumerate(tqdm(order.split(self.params.stage2.batch_size), desc=f"epoch {epoch}",
                                          leave=False, disable=None if distributed.is_main() else True)):
            if len(index) < 2:
                continue
            images = self.train.x[index]
            local = distributed.shard_slice(len(index))
            anchor = view(images, wcl.max_shift, wcl.noise_std, self.generator)[local].to(self.device)
            positive = view(images, wcl.max_shift, wcl.noise_std, self.generator)[local].to(self.device)
            z_d_a, z_d_p = self.model.embed(anchor), self.model.embed(positive)
            z_b_a, z_b_p = self.biased.embed(anchor), self.biased.embed(positive)
            z_d_a, z_d_p, z_b_a, z_b_p = (distributed.all_gather_rows(_normalise(z), len(index))
                                          for z in (z_d_a, z_d_p, z_b_a, z_b_p))
            _, weighted, triplet = losses.wcl_loss(z_d_a, z_d_p, z_b_a, z_b_p, self.params.loss.temperature,
                                                   wcl.tau_plus, return_parts=True)
            loss = weighted + wcl.triplet_weight * triplet
            ensure_finite(loss, step)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            distributed.sum_gradients(self.optimizer)
            self.optimizer.step()
            progress.add(loss=loss.detach(), weighted_infonce=weighted.detach(), triplet=triplet.detach())
        return progress.means()


@register_method("wcl")
def wcl_method(inputs: Stage2Inputs) -> Stage2Setup:
    model, biased = _fresh_model(inputs), _fresh_model(inputs)
    optimizer, scheduler = _optimiser(inputs, list(model.encoder.parameters()) + list(biased.encoder.parameters()))
    task = WCLTask(model, biased, optimizer, inputs.splits["train"], inputs.params, inputs.generator, inputs.device)
    return Stage2Setup(task, model, optimizer, scheduler)


def setup_method(inputs: Stage2Inputs) -> Stage2Setup:
    """Build the task of ``stage2.method`` from the registry."""
    name = inputs.params.stage2.method
    if name not in METHODS:
        raise ValueError(f"stage2.method = '{name}' is unknown; allowed: {sorted(METHODS)}")
    return METHODS[name](inputs)


def fit_head(model: Network, train: BiasedSplit, batch_size: int, device: torch.device, weight_decay: float = 1e-4,
             max_iter: int = 100) -> None:
    """Fit ``model.head`` to the frozen training features: min CE(W z + b, y) + weight_decay * |W|^2 (L-BFGS)."""
    z, _ = predict(model, train.x, batch_size, device)
    z, y = z.to(device), train.y.to(device)
    head = model.head
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    optimizer = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=max_iter, history_size=20,
                                  line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(z), y) + weight_decay * head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)


def stage2_validator(model: Network, splits: dict[str, BiasedSplit], method: str, batch_size: int,
                     device: torch.device) -> Callable[[], dict[str, float]]:
    """Validation scalars; methods without a jointly trained head get it fitted first (:func:`fit_head`)."""
    check = validator(model, splits["val"], batch_size, device)
    if method in HEAD_TRAINED:
        return check

    def refit_then_check() -> dict[str, float]:
        fit_head(model, splits["train"], batch_size, device)
        return check()

    return refit_then_check


def train_stage2(params: Params, splits: dict[str, BiasedSplit], inferred: torch.Tensor, minority: torch.Tensor,
                 erm_state: dict[str, torch.Tensor] | None, run: StageRun, out: StageOutputs) -> dict[str, dict]:
    """Train ``stage2.method``, keep the selected epoch (best validation worst-group by default), write outputs.

    Under ``torchrun`` every rank trains (joining the process group first); rank 0 writes the
    outputs and returns the accuracy reports, the other ranks return ``{}``.
    """
    s2 = params.stage2
    device = distributed.init_from_env(pick_device())
    generator = seed_everything(params.seed)
    setup = setup_method(Stage2Inputs(splits, inferred, minority, erm_state, params, device, generator))
    check_stage2_fits(s2.method, list(setup.task.modules().values()), setup.optimizer, params, len(splits["train"]),
                      max(len(split) for split in splits.values()), tuple(splits["train"].x.shape[1:]), device)
    key = resume_key({"seed": params.seed, "model": params.model.name, "options": setup.model.encoder.options,
                      "stage2": s2.model_dump(mode="json"), "loss": params.loss.model_dump(mode="json")},
                     {**split_tensors(splits), "inferred": inferred, "minority": minority, "erm_state": erm_state})
    advice = f"stage2.lr (now {s2.lr:g})"
    if s2.method not in HEAD_TRAINED or s2.method == "cnc":
        advice += f" or raise loss.temperature (now {params.loss.temperature:g})"
    result = fit(setup.task, setup.optimizer, s2.epochs,
                 stage2_validator(setup.model, splits, s2.method, s2.eval_batch_size, device),
                 selection=s2.selection, scheduler=setup.scheduler, state_path=out.resume, state_key=key,
                 on_epoch=lambda epoch, metrics: run.log_metrics(metrics, step=epoch), label="train_contrastive",
                 divergence_advice=advice)
    note_resume(run, result)
    reports: dict[str, dict] = {}
    if distributed.is_main():
        reports = write_outputs(setup.model, params.model.name, result, splits, run, out, s2.eval_batch_size, device,
                                label=f"stage2 {s2.method}", extra_metrics={"method": s2.method},
                                meta={"method": s2.method, "head_trained": s2.method in HEAD_TRAINED})
        info_path = out.metrics.with_name(f"{out.metrics.stem}_info.json")
        save_json(info_path, {"method": s2.method, **setup.report()})
        run.log_artifact(info_path)
        finish(out.resume)
    distributed.barrier()
    return reports
