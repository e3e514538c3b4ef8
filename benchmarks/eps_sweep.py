"""Stage 2 of the default pipeline under several objectives and ε values, 3 seeds: the numbers behind params.yaml's
default objective and README's ε table.

For each seed a workspace (a clone of this repository's committed tree, ``seed`` set) runs the upstream stages
(``dvc repro infer_groups``, DEBIAS_THREADS from ``--threads``); then every (objective, ε) runs stage 2 with
``benchmarks/stage2_epochs.py`` (the stage's method, per-epoch validation and selection rule, in one process; its
numbers differ from the stage's in the last digits) and the epoch the selection rule keeps is recorded.

    python -m benchmarks.eps_sweep --workdir SCRATCH --seeds 0 1 2 --objectives kl_a1_l05 released_a003_l05 \
        --epsilons 0 0.25 0.5 1 --out benchmarks/results/eps_sweep

Rows already in ``OUT.csv`` (same objective, ε, seed) are kept, so an interrupted sweep resumes; ``OUT.md`` is
rewritten from the whole CSV: per (objective, ε) the means over seeds with a 95 % t-interval of the mean, and per
seed the validation / test worst-group and the epoch kept.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from debias.metrics.paired import paired
# Every objective sets all four loss keys it depends on, so the committed params.yaml's values do not leak in.
OBJECTIVES: dict[str, dict[str, object]] = {
    "released_a003_l05": {"loss.fairkl.variant": "released", "loss.alpha": 0.03, "loss.fairkl.weight": 0.5},
    "released_a1_l05": {"loss.fairkl.variant": "released", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l05": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.5},
    "kl_a1_l075": {"loss.fairkl.variant": "kl", "loss.alpha": 1.0, "loss.fairkl.weight": 0.75},
}
FIELDS = ["objective", "epsilon", "seed", "epoch", "val_worst", "val_unbiased", "val_avg", "test_avg", "test_worst",
          "test_unbiased", "loss_epoch0", "loss_last", "command"]
METRICS = {"val_worst": "val/worst_group", "val_unbiased": "val/unbiased", "val_avg": "val/avg",
           "test_avg": "test/avg", "test_worst": "test/worst_group", "test_unbiased": "test/unbiased"}


def workspace(workdir: Path, seed: int, threads: int) -> Path:
    """A clone of the committed tree with ``seed`` set and its upstream stages run (reused when already there)."""
    path = workdir / f"seed{seed}"
    if not (path / "data/groups").exists():
        if not path.exists():
            subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
        params = path / "params.yaml"
        params.write_text(re.sub(r"(?m)^seed: .*$", f"seed: {seed}", params.read_text()))
        env = {**os.environ, "DEBIAS_THREADS": str(threads), "DEBIAS_TRACKING": "off"}
        subprocess.run(["dvc", "repro", "infer_groups"], cwd=path, env=env, check=True)
    return path


def run_one(path: Path, objective: str, epsilon: float, seed: int, threads: int) -> dict[str, object]:
    """Stage 2 of one (objective, ε, seed): the kept epoch's metrics and the first / last epoch's training loss."""
    sets = {**OBJECTIVES[objective], "loss.epsilon": epsilon, "seed": seed}
    command = [sys.executable, "-m", "benchmarks.stage2_epochs", str(Path(path).resolve()), "--threads", str(threads)]
    for key, value in sets.items():
        command += ["-S", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    epochs = {}
    for line in out.splitlines():
        if line.startswith("epoch "):
            number = int(line.split()[1])
            epochs[number] = {k: float(v) for k, v in re.findall(r"(\S+)=(-?[0-9.]+(?:e-?\d+)?)", line)}
    kept = int(re.search(r"^selected epoch (\d+)", out, re.M).group(1))
    row: dict[str, object] = {"objective": objective, "epsilon": epsilon, "seed": seed, "epoch": kept}
    row.update({name: round(epochs[kept][key], 4) for name, key in METRICS.items()})
    row["loss_epoch0"] = round(epochs[0]["train/loss"], 5)
    row["loss_last"] = round(epochs[max(epochs)]["train/loss"], 5)
    return row


def interval(values: list[float]) -> str:
    """Mean in % with the 95 % t-interval of the mean over the seeds (``mean [low, high]``), clipped to [0, 100]."""
    found = paired(values)
    if found.n < 2:
        return f"{100 * found.mean:.1f}"
    return f"{100 * found.mean:.1f} [{100 * max(0.0, found.low):.1f}, {100 * min(1.0, found.high):.1f}]"


def table(rows: list[dict[str, str]]) -> str:
    """The Markdown summary of every (objective, ε) in ``rows``, with the commands that produced them."""
    order = list(dict.fromkeys(r["objective"] for r in rows))
    keys = sorted(dict.fromkeys((r["objective"], r["epsilon"]) for r in rows),
                  key=lambda k: (order.index(k[0]), float(k[1])))
    commands = "".join(f"\n  - `{c}`" for c in dict.fromkeys(r["command"] for r in rows))
    lines = ["# Stage 2 of the default pipeline by objective and ε", "",
             f"- Commands (SCRATCH: any empty folder):{commands}",
             f"- Date: {dt.date.today().isoformat()}; CPU, torch threads as --threads",
             "- Means over seeds in %, with the 95 % t-interval of the mean (3 seeds: mean ± 4.30 × sd / √3, "
             "clipped to [0, 100]); the "
             "epoch kept is the selection rule's (best validation worst-group, ties by validation unbiased)", "",
             "| objective | ε | seeds | val worst-group | val unbiased | test average | test unbiased "
             "| test worst-group | per seed: val wg / test wg (epoch kept) |", "|---|---|---|---|---|---|---|---|---|"]
    for objective, epsilon in keys:
        group = sorted((r for r in rows if (r["objective"], r["epsilon"]) == (objective, epsilon)),
                       key=lambda r: int(r["seed"]))
        cells = [interval([float(r[m]) for r in group]) for m in
                 ("val_worst", "val_unbiased", "test_avg", "test_unbiased", "test_worst")]
        seeds = "; ".join(f"s{r['seed']}: {100 * float(r['val_worst']):.1f} / {100 * float(r['test_worst']):.1f} "
                          f"({r['epoch']})" for r in group)
        lines.append(f"| {objective} | {epsilon} | {len(group)} | " + " | ".join(cells) + f" | {seeds} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True, help="scratch folder for the per-seed workspaces")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="+", default=["kl_a1_l05"], choices=sorted(OBJECTIVES))
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.0, 0.25, 0.5, 1.0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/eps_sweep")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    shown = ["SCRATCH" if i and given[i - 1] == "--workdir" else a for i, a in enumerate(given)]
    command = "python -m benchmarks.eps_sweep " + " ".join(map(shlex.quote, shown))
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    rows = list(csv.DictReader(csv_path.open())) if csv_path.exists() else []
    done = {(r["objective"], float(r["epsilon"]), int(r["seed"])) for r in rows}
    for seed in args.seeds:
        path = workspace(args.workdir.resolve(), seed, args.threads)
        for objective in args.objectives:
            for epsilon in args.epsilons:
                if (objective, epsilon, seed) in done:
                    continue
                row = {**run_one(path, objective, epsilon, seed, args.threads), "command": command}
                rows.append({k: str(v) for k, v in row.items()})
                print(", ".join(f"{k}={v}" for k, v in row.items() if k != "command"), flush=True)
                with csv_path.open("w", newline="") as handle:
                    writer = csv.DictWriter(handle, FIELDS)
                    writer.writeheader()
                    writer.writerows(rows)
    md_path.write_text(table(rows))
    print(md_path.read_text())


if __name__ == "__main__":
    main()
