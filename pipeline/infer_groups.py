"""Stage infer_groups: inferred bias labels of the training split (data/groups/train.parquet), UMAP coordinates, quality
metrics; the validation split's groups by the same fitted inference (data/groups/val.parquet) and a summary of every
inferred group (data/groups/summary.json: size, ERM's accuracy, attribute share, example images)."""

import os

# Before torch/numba load OpenMP: busy-waiting OpenMP threads left by UMAP slow torch ~10x (cpu-measurements.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from debias.core import paths  # noqa: E402
from debias.data.store import load_split  # noqa: E402
from debias.groups import (GROUPS_METRICS, GROUPS_TABLE, UMAP_TRAIN, groups_report, infer_groups,  # noqa: E402
                           report_scalars, save_embedding, save_groups)
from debias.groups.discovered import (GROUPS_SUMMARY, GROUPS_VAL_TABLE, group_summary,  # noqa: E402
                                      infer_val_groups, save_summary)
from debias.core.io import save_json  # noqa: E402
from debias.harness.stage import main  # noqa: E402
from debias.harness.tracking import StageRun  # noqa: E402
from debias.params import Params  # noqa: E402
from debias.training.outputs import load_embeddings  # noqa: E402


def run(params: Params, run: StageRun) -> None:
    train = load_split(paths.BIASED / "train.pt")
    erm = load_embeddings(paths.ERM_DIR, "train")
    inference = infer_groups(params.groups.method, train, erm["z"], erm["logits"], params.groups, params.seed)
    report = groups_report(params.groups.method, inference, train, erm["logits"].argmax(1))
    save_groups(GROUPS_TABLE, inference)
    val = load_split(paths.BIASED / "val.pt")
    erm_val = load_embeddings(paths.ERM_DIR, "val")
    save_groups(GROUPS_VAL_TABLE, infer_val_groups(params.groups.method, val, erm_val["z"], erm_val["logits"], erm["z"],
                                                   inference, params.groups))
    save_summary(GROUPS_SUMMARY, group_summary(inference, train, erm["logits"], params.seed), params.groups.method)
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
