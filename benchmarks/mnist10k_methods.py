"""Method comparison on real MNIST digits (mnist10k.npz) under the CMNIST* protocol, several seeds.

Runs the same library functions as the pipeline stages (download -> inject_bias -> train_erm ->
infer_groups -> train_contrastive), in one process per seed and setting, with MLflow off, and
writes mean +- std of test accuracy per method as CSV and Markdown. The configuration (data,
ERM, and each method's params overrides) is benchmarks/mnist10k_methods.yaml.

    python benchmarks/mnist10k_methods.py --npz ../shared/datasets/mnist10k.npz --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["DEBIAS_TRACKING"] = "off"

import torch  # noqa: E402
import yaml  # noqa: E402

from debias.data.bias import inject_bias, summarise  # noqa: E402
from debias.data.sources import load_source  # noqa: E402
from debias.groups import infer_groups  # noqa: E402
from debias.params import Params, validate  # noqa: E402
from debias.tracking import StageRun  # noqa: E402
from debias.training.erm import StageOutputs, load_embeddings, train_erm  # noqa: E402
from debias.training.methods import train_stage2  # noqa: E402

HERE = Path(__file__).resolve().parent
METRICS = ("avg", "unbiased", "worst_group", "conflicting")


def merge(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def outputs(folder: Path, name: str) -> StageOutputs:
    return StageOutputs(folder / f"{name}.pt", folder / name, folder / f"{name}.json", folder / f"{name}.csv",
                        folder / f"{name}.resume.pt")


def run_setting(base: dict, methods: dict[str, dict], seed: int, work: Path) -> list[dict]:
    """ERM once, then every method on its inferred groups; one row per method with test metrics and seconds."""
    params = validate(merge(base, {"seed": seed}))
    rows = []
    start = time.time()
    splits = inject_bias(load_source(params.data, work / "raw", seed), params.bias, seed)
    summary = summarise(splits, params.bias)["splits"]["train"]
    data_seconds = time.time() - start
    start = time.time()
    erm = train_erm(splits, params.model.name, params.erm, seed, StageRun(None, None), outputs(work, "erm"))
    rows.append({"method": "erm", "seconds": time.time() - start, **{k: erm["test"][k] for k in METRICS}})
    embeddings = load_embeddings(work / "erm", "train")
    for name, overrides in methods.items():
        method_params: Params = validate(merge(merge(base, overrides), {"seed": seed}))
        start = time.time()
        groups = infer_groups(method_params.groups.method, splits["train"], embeddings["z"], embeddings["logits"],
                              method_params.groups, seed)
        reports = train_stage2(method_params, splits, groups.inferred_label, groups.minority, None,
                               StageRun(None, None), outputs(work, name))
        rows.append({"method": name, "seconds": time.time() - start, **{k: reports["test"][k] for k in METRICS}})
    for row in rows:
        row.update(seed=seed, n_train=summary["n"], n_conflicting=summary["n_conflicting"],
                   data_seconds=round(data_seconds, 2))
    return rows


def table(rows: list[dict], settings: list[str]) -> str:
    """Markdown: one row per (setting, method), mean +- std over seeds in percent, mean seconds."""
    lines = ["| setting | method | test avg | test unbiased | test worst-group | seconds (stage 2) | seeds |",
             "|---|---|---|---|---|---|---|"]
    for setting in settings:
        methods = dict.fromkeys(r["method"] for r in rows if r["setting"] == setting)
        for method in methods:
            group = [r for r in rows if r["setting"] == setting and r["method"] == method]

            def stat(key: str) -> str:
                values = [100 * r[key] for r in group]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                return f"{statistics.mean(values):.1f} ± {spread:.1f}"

            seconds = statistics.mean(r["seconds"] for r in group)
            lines.append(f"| {setting} | {method} | {stat('avg')} | {stat('unbiased')} | {stat('worst_group')} | "
                         f"{seconds:.0f} | {len(group)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", required=True, help="path to mnist10k.npz (x uint8 [N,28,28], y)")
    parser.add_argument("--config", default=str(HERE / "mnist10k_methods.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--settings", nargs="*", help="subset of the config's settings")
    parser.add_argument("--methods", nargs="*", help="subset of the config's methods")
    parser.add_argument("--out", default=str(HERE / "results" / "mnist10k_methods"))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 was fastest on 2 shared cores)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = yaml.safe_load(Path(args.config).read_text())
    base = merge(config["base"], {"data": {"path": str(Path(args.npz).resolve())}})
    methods = {k: v for k, v in config["methods"].items() if not args.methods or k in args.methods}
    settings = {k: v for k, v in config["settings"].items() if not args.settings or k in args.settings}
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for setting, overrides in settings.items():
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as work:
                for row in run_setting(merge(base, overrides), methods, seed, Path(work)):
                    rows.append({"setting": setting, **row})
                    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            with open(out.with_suffix(".csv"), "w", newline="") as handle:  # rewritten after every seed
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    markdown = table(rows, list(settings))
    command = "python benchmarks/mnist10k_methods.py " + " ".join(sys.argv[1:])
    out.with_suffix(".md").write_text(f"Command: `{command}`\n\n{markdown}\n")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
