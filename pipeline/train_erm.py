"""Stage train_erm: cross-entropy training (models/erm.pt), embeddings and logits per split, metrics."""

from debias import paths
from debias.data.store import load_splits
from debias.params import Params
from debias.stage import main
from debias.tracking import StageRun
from debias.training.erm import train_and_export


def run(params: Params, run: StageRun) -> None:
    splits = load_splits(paths.BIASED)
    train_and_export(
        splits, params.model.name, params.erm, params.seed, run,
        model_path=paths.ERM_MODEL, embeddings_dir=paths.ERM_DIR, metrics_path=paths.METRICS / "erm.json",
        curves_path=paths.PLOTS / "erm_curves.csv", resume_path=paths.RESUME / "erm.pt", name="erm",
    )


if __name__ == "__main__":
    main("train_erm", run)
