"""The per-epoch linear head: a cold start (zeros, every epoch) against warm starts (the previous epoch's head) at
several L-BFGS tolerances, on one stage-2 training run per seed.

The encoder's training does not read the head (methods without a CE-trained head), so one run per seed serves every
head setting: after each epoch every setting fits its own head (from zero, or from its own previous fit) on the
frozen training features and is validated; the selection rule (``stage2.selection``) then picks an epoch per
setting. Printed and written (``--out``: Markdown): per setting and seed the head fits' total time and L-BFGS
iterations, the selected epoch and its validation / test accuracies.

    python -m benchmarks.head_warm_start WORKSPACE [--seeds 0 1 2] [--tolerances 1e-7 1e-5 1e-4] [-S key=value ...]
        [--out benchmarks/results/head_warm_start.md]

``WORKSPACE`` holds data/biased and data/groups (``dvc repro infer_groups`` there) and params.yaml.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
import time
from pathlib import Path

import torch
import yaml


from debias.core.runtime import seed_everything
from debias.data.store import load_splits
from debias.groups import GROUPS_TABLE, load_groups
from debias.metrics import scalars
from debias.schema import validate
from debias.training.classifier import evaluate
from debias.training.loop import selection_score
from debias.training.methods import Stage2Inputs, fit_head, method_spec, setup_method
from benchmarks.stage2_epochs import set_value


def run_seed(workspace: Path, raw: dict, seed: int, settings: list[tuple[str, bool, float]]) -> list[dict]:
    """One training run; per setting: head time, iterations, selected epoch and its metrics."""
    raw = copy.deepcopy(raw)
    raw["seed"] = seed
    params = validate(raw)
    s2, device = params.stage2, torch.device("cpu")
    if method_spec(s2.method).head_trained:
        raise SystemExit(f"stage2.method = {s2.method} trains its head with the encoder: no per-epoch head to fit")
    splits = load_splits(workspace / "data/biased")
    groups = load_groups(workspace / GROUPS_TABLE, y=splits["train"].y)
    setup = setup_method(Stage2Inputs(splits, groups.inferred_label, groups.minority, None, params, device,
                                      seed_everything(seed)))
    heads = {name: copy.deepcopy(setup.model.head.state_dict()) for name, _, _ in settings}
    rows = {name: {"time": 0.0, "iterations": [], "history": []} for name, _, _ in settings}
    for epoch in range(s2.epochs):
        setup.model.train()
        setup.task.train_epoch(epoch)
        if setup.scheduler is not None:
            setup.scheduler.step()
        setup.model.eval()
        for name, warm, tolerance in settings:
            setup.model.head.load_state_dict(heads[name])
            started = time.perf_counter()
            iterations = fit_head(setup.model, splits["train"], s2.eval_batch_size, device, s2.head.weight_decay,
                                  s2.head.max_iter, warm_start=warm, tolerance=tolerance)
            rows[name]["time"] += time.perf_counter() - started
            rows[name]["iterations"].append(iterations)
            heads[name] = copy.deepcopy(setup.model.head.state_dict())
            metrics = {"epoch": float(epoch), **scalars(evaluate(setup.model, splits["val"], s2.eval_batch_size,
                                                                 device), "val/"),
                       **scalars(evaluate(setup.model, splits["test"], s2.eval_batch_size, device), "test/")}
            rows[name]["history"].append(metrics)
    out = []
    for name, warm, tolerance in settings:
        history = rows[name]["history"]
        best = max(history, key=lambda row: selection_score(row, s2.selection))
        out.append({"setting": name, "seed": seed, "head_s": rows[name]["time"],
                    "iterations": sum(rows[name]["iterations"]), "selected_epoch": int(best["epoch"]),
                    **{k: best[k] for k in ("val/worst_group", "val/avg", "test/worst_group", "test/avg",
                                            "test/unbiased")}})
        print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in out[-1].items()), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tolerances", type=float, nargs="+", default=[1e-7, 1e-5, 1e-4])
    parser.add_argument("-S", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("DEBIAS_THREADS", "1")))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    raw = yaml.safe_load((args.workspace / "params.yaml").read_text())
    for item in args.overrides:
        key, _, text = item.partition("=")
        set_value(raw, key, yaml.safe_load(text))
    cold_tolerance = validate(raw).stage2.head.tolerance
    settings = [("cold", False, cold_tolerance)] + [(f"warm tol {t:g}", True, t) for t in args.tolerances]
    rows = [row for seed in args.seeds for row in run_seed(args.workspace.resolve(), raw, seed, settings)]
    header = ["setting", "seed", "head_s", "iterations", "selected_epoch", "val/worst_group", "val/avg",
              "test/worst_group", "test/avg", "test/unbiased"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{row[k]:.4f}" if isinstance(row[k], float) else str(row[k]) for k in header) + " |"
              for row in rows]
    command = shlex.join(["python", "-m", "benchmarks.head_warm_start", *sys.argv[1:]])
    text = (f"# Per-epoch head: cold start against warm starts\n\n- Command: `{command}`\n"
            f"- torch threads {args.threads}, CPU; head_s: the head fits' total wall time over the run\n\n"
            + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
