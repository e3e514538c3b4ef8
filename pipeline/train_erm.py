"""Stage train_erm: cross-entropy training (models/erm.pt), embeddings and logits per split, metrics."""

from debias.core import paths
from debias.data.store import load_splits
from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.params import Params
from debias.training.erm import train_erm
from debias.training.outputs import StageOutputs

OUTPUTS = StageOutputs(model=paths.ERM_MODEL, embeddings_dir=paths.ERM_DIR, metrics=paths.METRICS / "erm.json",
                       curves=paths.PLOTS / "erm_curves.csv", resume=paths.RESUME_FILES["train_erm"])


def run(params: Params, run: StageRun) -> None:
    train_erm(load_splits(paths.BIASED), params.model, params.erm, params.seed, run, OUTPUTS, params.health)


if __name__ == "__main__":
    main("train_erm", run)
