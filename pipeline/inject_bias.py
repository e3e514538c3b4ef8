"""Stage inject_bias: bias the splits with a protocol (data/biased/), summary and sample grid."""

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.io import save_json
from debias.data.bias import check_colourable, inject_bias, resolve_protocol, summarise
from debias.data.store import load_raw_data, save_split
from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.params import Params
from debias.report.figures import feature_summary, sample_grid

# The declared figure: images per group, or (feature vectors) each feature's mean per group.
SAMPLE_FIGURES = {"image": sample_grid, "tabular": feature_summary}


def run(params: Params, run: StageRun) -> None:
    raw = load_raw_data(paths.RAW_SPLITS)
    protocol = resolve_protocol(params.bias.protocol, raw.splits, raw.source, raw.protocol)
    print(f"[inject_bias] {protocol}: biasing {sum(len(s) for s in raw.splits.values())} samples", flush=True)
    uncolourable = check_colourable(raw.splits, params.bias, protocol)  # refused above bias.max_uncolourable
    biased = inject_bias(raw.splits, params.bias, params.seed, source=raw.source, source_protocol=raw.protocol)
    for name, split in biased.items():
        save_split(paths.BIASED / f"{name}.pt", split)
    summary = summarise(biased, params.bias, protocol, uncolourable)
    save_json(paths.BIAS_SUMMARY, summary)
    print("[inject_bias] drawing the sample figure", flush=True)
    SAMPLE_FIGURES[biased["train"].modality](biased["train"], paths.SAMPLE_GRID, seed=params.seed)
    run.log_metrics({f"{name}.{key}": stats[key] for name, stats in summary["splits"].items()
                     for key in ("n", "realised_correlation", "n_conflicting", "empty_groups")})
    run.log_artifact(paths.BIAS_SUMMARY)
    run.log_artifact(paths.SAMPLE_GRID, "figures")
    train = summary["splits"]["train"]
    requested = "" if protocol == params.bias.protocol else f" (bias.protocol = {params.bias.protocol})"
    found = (f"train correlation {train['realised_correlation']:.4f}, {train['n_conflicting']} bias-conflicting of "
             f"{train['n']}, {train['empty_groups']} empty groups") if biased["train"].has_attribute else (
        f"{train['n']} training images without bias labels: groups are inferred, numbers of the true attribute "
        f"say '{NEEDS_BIAS_LABELS}'")
    print(f"[inject_bias] {protocol}{requested} on {raw.source or 'unrecorded source'} ({summary['modality']}): {found}")


if __name__ == "__main__":
    main("inject_bias", run)
