"""Stage train_contrastive: the stage-2 method (stage2.method) on the biased splits with inferred groups."""

from debias.core import paths
from debias.data.store import load_splits
from debias.groups import GROUPS_TABLE, load_groups
from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.models import load_initial_weights
from debias.params import Params
from debias.schema.applicability import RunContext, weak_warnings
from debias.training.methods.registry import method_spec
from debias.training.methods.run import train_stage2
from debias.training.outputs import StageOutputs

OUTPUTS = StageOutputs(model=paths.STAGE2_MODEL, embeddings_dir=paths.STAGE2_DIR,
                       metrics=paths.METRICS / "stage2_train.json", curves=paths.PLOTS / "stage2_curves.csv",
                       resume=paths.RESUME_FILES["train_contrastive"])


def run(params: Params, run: StageRun) -> None:
    splits = load_splits(paths.BIASED)
    groups = load_groups(GROUPS_TABLE, y=splits["train"].y)
    # The validation split's inferred groups: what stage2.selection = best_worst_inferred_group selects by (without
    # them, e.g. outputs of an older infer_groups, that rule is refused before training and the others run as before).
    val_groups = load_groups(paths.GROUPS_VAL_TABLE, y=splits["val"].y) if paths.GROUPS_VAL_TABLE.exists() else None
    train = splits["train"]
    spec = method_spec(params.stage2.method)
    erm_state = None
    if spec.needs_erm_weights(params):
        erm_state = load_initial_weights(str(paths.ERM_MODEL), params.model, train.n_classes, tuple(train.x.shape[1:]),
                                         spec.feature_activation)
    train_stage2(params, splits, groups.inferred_label, groups.minority, erm_state, run, OUTPUTS,
                 inferred_group=groups.inferred_group, bias_scores=groups.bias_scores,
                 val_inferred_group=None if val_groups is None else val_groups.inferred_group,
                 params_warnings=weak_warnings(RunContext(params)))


if __name__ == "__main__":
    main("train_contrastive", run)
