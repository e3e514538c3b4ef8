"""Stage download: fetch the data source and make the train/val/test splits (data/raw/)."""

from debias.core import paths
from debias.data.sources import SOURCE_PROTOCOLS, load_source
from debias.data.store import save_raw_splits
from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.params import Params


def run(params: Params, run: StageRun) -> None:
    print(f"[download] reading {params.data.source} and splitting it (seed {params.seed})", flush=True)
    splits = load_source(params.data, paths.RAW, params.seed)
    # inject_bias resolves bias.protocol auto by the recorded protocol, without importing the sources
    save_raw_splits(paths.RAW_SPLITS, splits, source=params.data.source, protocol=SOURCE_PROTOCOLS[params.data.source])
    counts = {f"n_{name}": len(split) for name, split in splits.items()}
    run.log_metrics(counts)
    train = splits["train"]
    print(f"[download] {params.data.source} ({train.modality}, sample shape {tuple(train.x.shape[1:])}): "
          + ", ".join(f"{k}={v}" for k, v in counts.items()))


if __name__ == "__main__":
    main("download", run)
