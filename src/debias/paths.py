"""Where each stage writes: the same paths dvc.yaml declares (a test keeps them in step)."""

from pathlib import Path

RAW = Path("data/raw")
RAW_SPLITS = RAW / "splits.pt"
BIASED = Path("data/biased")
BIAS_SUMMARY = BIASED / "summary.json"
SAMPLE_GRID = Path("reports/figures/samples.png")
ERM_MODEL = Path("models/erm.pt")
ERM_DIR = Path("data/erm")
METRICS = Path("reports/metrics")
PLOTS = Path("reports/plots")
RUNS = Path("reports/runs")
RESUME = Path("models/.resume")


def embeddings_path(directory: Path, split: str) -> Path:
    return directory / f"embeddings_{split}.pt"
STAGE2_MODEL = Path("models/stage2.pt")
STAGE2_DIR = Path("data/stage2")
EVALUATE_DIR = Path("data/evaluate")
GROUPS_DIR = Path("data/groups")
GROUPS_TABLE = GROUPS_DIR / "train.parquet"
UMAP_TRAIN = GROUPS_DIR / "umap_train.pt"
GROUPS_METRICS = METRICS / "groups.json"
GROUPS_TIMINGS = RUNS / "infer_groups_timings.json"
