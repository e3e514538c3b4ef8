"""Stage evaluate: representation metrics of the frozen encoders (alignment loss, mutual information,
distance statistics) in reports/metrics/representation.json, and UMAP embeddings in data/evaluate/."""

import os
from pathlib import Path

# Before torch and numba load their OpenMP runtimes: passive waits (numba threads otherwise slow torch down
# about 10x in the same process) and a disk cache for numba's compiled UMAP code.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path("~/.cache/debias/numba").expanduser()))

from debias.core import paths  # noqa: E402
from debias.core.io import save_json, save_torch  # noqa: E402
from debias.core.runtime import pick_device, seed_everything  # noqa: E402
from debias.data.store import load_splits  # noqa: E402
from debias.evaluation.probe import flat_scalars, load_encoders  # noqa: E402
from debias.evaluation.representation import evaluate_encoders  # noqa: E402
from debias.harness.stage import main  # noqa: E402
from debias.harness.tracking import StageRun  # noqa: E402
from debias.metrics import shown  # noqa: E402
from debias.params import Params  # noqa: E402

REPRESENTATION_METRICS = paths.METRICS / "representation.json"


def umap_path(encoder: str, split: str) -> Path:
    return paths.EVALUATE_DIR / f"umap_{encoder}_{split}.pt"


def run(params: Params, run: StageRun) -> None:
    seed_everything(params.seed)
    splits = load_splits(paths.BIASED, tuple(params.evaluate.splits))
    encoders = load_encoders({"erm": paths.ERM_MODEL, "stage2": paths.STAGE2_MODEL})
    metrics, umaps = evaluate_encoders(encoders, splits, params.evaluate, params.seed, pick_device())
    save_json(REPRESENTATION_METRICS, metrics)
    paths.EVALUATE_DIR.mkdir(parents=True, exist_ok=True)
    for (encoder, split), payload in umaps.items():
        save_torch(umap_path(encoder, split), payload, kind="umap")
    run.log_metrics(flat_scalars(metrics))
    run.log_artifact(REPRESENTATION_METRICS)
    for (encoder, split) in umaps:
        run.log_artifact(umap_path(encoder, split), "umap")
    for name, result in metrics.items():
        if not result["trained"]:
            print(f"[evaluate] {name}: {result['note']}")
            continue
        for split in params.evaluate.splits:
            r = result[split]
            print(f"[evaluate] {name} {split}: alignment {shown(r['alignment_loss'])}, I(Y;Z) {r['mi_y']:.3f} / H(Y) "
                  f"{r['h_y']:.3f}, I(A;Z) {shown(r['mi_a'])} / H(A) {shown(r['h_a'])} nats")


if __name__ == "__main__":
    main("evaluate", run)
