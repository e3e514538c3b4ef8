"""Where each stage writes: the same paths dvc.yaml declares (a test keeps them in step); the repository root."""

import os
from pathlib import Path

SOURCE_FINGERPRINT = Path("data/source.json")
CODE_FINGERPRINTS = Path("data/code")  # one <stage>.json per stage: the md5 of each code file it runs (``source``)
FINGERPRINT_STAGE = "source"  # the always-run stage that writes the fingerprints (data and code), first on every repro
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
# Each training stage's resume state (written during training, read back by the same stage only)
RESUME_FILES = {"train_erm": RESUME / "erm.pt", "train_contrastive": RESUME / "stage2.pt"}


def embeddings_path(directory: Path, split: str) -> Path:
    return directory / f"embeddings_{split}.pt"
STAGE2_MODEL = Path("models/stage2.pt")
STAGE2_DIR = Path("data/stage2")
EVALUATE_DIR = Path("data/evaluate")
GROUPS_DIR = Path("data/groups")
GROUPS_TABLE = GROUPS_DIR / "train.parquet"
GROUPS_VAL_TABLE = GROUPS_DIR / "val.parquet"  # the validation split's inferred groups
GROUPS_SUMMARY = GROUPS_DIR / "summary.json"  # per (class, inferred group): size, ERM accuracy, attribute share, examples
UMAP_TRAIN = GROUPS_DIR / "umap_train.pt"
GROUPS_METRICS = METRICS / "groups.json"
GROUPS_TIMINGS = RUNS / "infer_groups_timings.json"


def repo_root(start: str | Path | None = None) -> Path:
    """``$DVC_ROOT``, else the nearest ancestor of ``start`` (cwd) holding ``.dvc/``, else ``start``.

    DVC sets ``DVC_ROOT`` to the main repository even in ``dvc exp run --temp`` and queued runs (whose
    working folders are temporary copies without untracked files), so paths anchored here mean the same
    thing under ``dvc repro``, ``--temp`` and the queue.
    """
    if os.environ.get("DVC_ROOT"):
        return Path(os.environ["DVC_ROOT"]).resolve()
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return here


def resolve_data_path(path: str | Path) -> Path:
    """A user's data path from params: absolute as given, relative to the repository root (:func:`repo_root`)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else repo_root() / path



def code_fingerprint_path(stage: str) -> Path:
    """The file ``source`` writes with the md5 of each code file ``stage`` runs: the stage's one code dep."""
    return CODE_FINGERPRINTS / f"{stage}.json"
