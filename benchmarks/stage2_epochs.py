"""One stage-2 configuration, epoch by epoch, in this process: how the numbers behind params.yaml's choices were found.

Runs what train_contrastive runs (the registered method's task, the per-epoch validation, the selection rule) on a
workspace whose upstream stages have run (``dvc repro infer_groups`` there), and prints per epoch the training
losses, validation and test accuracy and the spread of the L2-normalised validation features
(:func:`debias.core.health.feature_spread`; < 0.05 is a collapsed representation), then the epoch the selection rule
keeps. Nothing is written; no MLflow. Results differ from the stage's in the last digits (the stage also profiles
memory before training, which draws from the same RNG).

    python benchmarks/stage2_epochs.py WORKSPACE [--params FILE] [-S stage2.epochs=30 -S loss.epsilon=0.25 ...]
        [--true-groups]

``WORKSPACE`` holds data/biased and data/groups; ``--params`` (default: WORKSPACE/params.yaml) is read and the
``-S`` overrides applied (YAML values); ``--true-groups`` uses the true bias attribute as inferred labels (oracle),
``--groups TABLE`` another groups table than ``data/groups/train.parquet`` (another group source's, same split);
``--history FILE`` also writes every epoch's numbers as a JSON list (what a selection rule can be replayed on).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import yaml


from debias.core import health
from debias.core.runtime import seed_everything
from debias.data.store import load_splits
from debias.groups import GROUPS_TABLE, load_groups
from debias.models import load_initial_weights
from debias.schema import validate
from debias.training.classifier import evaluate, predict, worst_group_n
from debias.training.loop import describe_selection, selection_score
from debias.training.methods import Stage2Inputs, method_spec, setup_method, stage2_validator


def set_value(tree: dict, dotted: str, value: object) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--params", type=Path)
    parser.add_argument("-S", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--true-groups", action="store_true")
    parser.add_argument("--groups", type=Path, help="the groups table to read (default: WORKSPACE/data/groups/train.parquet)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("DEBIAS_THREADS", "1")))
    parser.add_argument("--history", type=Path, help="also write every epoch's numbers here (JSON list)")
    args = parser.parse_args()
    history_file = args.history.resolve() if args.history else None
    groups_table = args.groups.resolve() if args.groups else GROUPS_TABLE  # resolved before the chdir below
    torch.set_num_threads(args.threads)
    raw = yaml.safe_load((args.params or args.workspace / "params.yaml").read_text())
    for item in args.overrides:
        key, _, text = item.partition("=")
        set_value(raw, key, yaml.safe_load(text))
    params = validate(raw)
    os.chdir(args.workspace)
    splits = load_splits(Path("data/biased"))
    train = splits["train"]
    groups = load_groups(groups_table, y=train.y)
    inferred, minority = groups.inferred_label, groups.minority
    if args.true_groups:
        inferred, minority = train.a.clone(), ~train.aligned.bool()
    s2, device = params.stage2, torch.device("cpu")
    erm_state = None
    if s2.method == "cnc" and s2.cnc.init == "erm":
        erm_state = load_initial_weights("models/erm.pt", params.model, train.n_classes, tuple(train.x.shape[1:]),
                                         method_spec(s2.method).feature_activation)
    generator = seed_everything(params.seed)
    setup = setup_method(Stage2Inputs(splits, inferred, minority, erm_state, params, device, generator))
    validate_epoch = stage2_validator(setup.model, splits, s2.method, s2.eval_batch_size, device, s2.head)
    history, started = [], time.perf_counter()
    for epoch in range(s2.epochs):
        for module in setup.task.modules().values():
            module.train()
        metrics = {"epoch": float(epoch), **setup.task.train_epoch(epoch)}
        if setup.scheduler is not None:
            setup.scheduler.step()
        for module in setup.task.modules().values():
            module.eval()
        metrics.update(validate_epoch())
        test = evaluate(setup.model, splits["test"], s2.eval_batch_size, device)
        z, _ = predict(setup.model, splits["val"].x, s2.eval_batch_size, device)
        metrics.update({"test/avg": test["avg"], "test/worst_group": test["worst_group"],
                        "test/unbiased": test["unbiased"],
                        "test/worst_group_n": float(n) if not isinstance(n := worst_group_n(test), str) else 0.0,
                        "val/spread": health.feature_spread(z)})
        history.append(metrics)
        shown = {k: v for k, v in metrics.items() if k != "epoch" and "fairkl_pairs" not in k}
        print(f"epoch {epoch} ({time.perf_counter() - started:.0f} s) "
              + " ".join(f"{k}={v:.3f}" for k, v in shown.items()), flush=True)
    if history_file is not None:
        history_file.write_text(json.dumps(history))
    best = max(history, key=lambda row: selection_score(row, s2.selection))
    selection = describe_selection(history, int(best["epoch"]), s2.selection)
    print(f"selected epoch {selection['selected_epoch']} ({selection['reason']}): test avg {best['test/avg']:.3f}, "
          f"worst-group {best['test/worst_group']:.3f}, unbiased {best['test/unbiased']:.3f}; "
          f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
