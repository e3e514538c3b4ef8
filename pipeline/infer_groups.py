"""Stage infer_groups: inferred bias labels of the training split (data/groups/train.parquet), UMAP coordinates, quality metrics."""

import os

# Before torch/numba load OpenMP: busy-waiting OpenMP threads left by UMAP slow torch ~10x (cpu-measurements.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from debias import paths  # noqa: E402
from debias.data.store import load_split  # noqa: E402
from debias.groups import (GROUPS_METRICS, GROUPS_TABLE, UMAP_TRAIN, groups_report, infer_groups,  # noqa: E402
                           report_scalars, save_embedding, save_groups)
from debias.io import save_json  # noqa: E402
from debias.params import Params  # noqa: E402
from debias.stage import main  # noqa: E402
from debias.tracking import StageRun  # noqa: E402
from debias.training.outputs import load_embeddings  # noqa: E402


def run(params: Params, run: StageRun) -> None:
    train = load_split(paths.BIASED / "train.pt")
    erm = load_embeddings(paths.ERM_DIR, "train")
    inference = infer_groups(params.groups.method, train, erm["z"], erm["logits"], params.groups, params.seed)
    report = groups_report(params.groups.method, inference, train, erm["logits"].argmax(1))
    save_groups(GROUPS_TABLE, inference)
    save_embedding(UMAP_TRAIN, inference)
    save_json(GROUPS_METRICS, report)
    save_json(paths.GROUPS_TIMINGS, inference.timings)  # seconds per step, kept out of the metrics file
    run.log_metrics(report_scalars(report, inference.timings))
    run.log_warnings(report["warnings"])
    run.log_artifact(GROUPS_METRICS)
    print(f"[infer_groups] {params.groups.method}: {report['n_inferred_minority']} inferred minority points, "
          f"minority recall {rounded(report['minority_recall'])}, precision {rounded(report['minority_precision'])}, "
          f"matched accuracy {rounded(report['matched_accuracy'])}")
    for message in report["warnings"]:
        print(f"[infer_groups] WARNING {message}", flush=True)


def rounded(value: float | str | None) -> str:
    """Three decimals; 'n/a' where the value is undefined (e.g. no inferred minority point: no precision); the
    'needs bias labels' marker as itself."""
    return "n/a" if value is None else value if isinstance(value, str) else f"{value:.3f}"


if __name__ == "__main__":
    main("infer_groups", run)
