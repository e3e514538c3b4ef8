"""Stage inject_bias: colour the splits with a bias protocol (data/biased/), summary and sample grid."""

from debias import paths
from debias.data.bias import check_colourable, inject_bias, summarise
from debias.data.store import load_raw_splits, save_split
from debias.io import save_json
from debias.params import Params
from debias.report.figures import sample_grid
from debias.stage import main
from debias.tracking import StageRun


def run(params: Params, run: StageRun) -> None:
    raw = load_raw_splits(paths.RAW_SPLITS)
    uncolourable = check_colourable(raw, params.bias)  # images the colour does not show on (refused above a fraction)
    biased = inject_bias(raw, params.bias, params.seed)
    for name, split in biased.items():
        save_split(paths.BIASED / f"{name}.pt", split)
    summary = summarise(biased, params.bias, uncolourable)
    save_json(paths.BIAS_SUMMARY, summary)
    sample_grid(biased["train"], paths.SAMPLE_GRID, seed=params.seed)
    run.log_metrics({f"{name}.{key}": stats[key] for name, stats in summary["splits"].items()
                     for key in ("n", "realised_correlation", "n_conflicting", "empty_groups")})
    run.log_artifact(paths.BIAS_SUMMARY)
    run.log_artifact(paths.SAMPLE_GRID, "figures")
    train = summary["splits"]["train"]
    print(f"[inject_bias] {params.bias.protocol}: train correlation {train['realised_correlation']:.4f}, "
          f"{train['n_conflicting']} bias-conflicting of {train['n']}, {train['empty_groups']} empty groups")


if __name__ == "__main__":
    main("inject_bias", run)
