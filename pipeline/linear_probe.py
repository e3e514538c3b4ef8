"""Stage linear_probe: frozen encoders (ERM; stage 2 when trained) + multinomial logistic regression.

Writes reports/metrics/probe.json (scalars) and reports/metrics/probe_groups.json (per-group tables).
"""

from debias.core import paths
from debias.core.io import save_json
from debias.core.runtime import pick_device, seed_everything
from debias.data.store import load_splits
from debias.evaluation.probe import flat_scalars, load_encoders, probe_encoders, probe_splits, split_tables
from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.metrics import shown
from debias.params import Params

PROBE_METRICS = paths.METRICS / "probe.json"
PROBE_GROUPS = paths.METRICS / "probe_groups.json"


def run(params: Params, run: StageRun) -> None:
    seed_everything(params.seed)
    splits = load_splits(paths.BIASED, probe_splits(params.probe))
    encoders = load_encoders({"erm": paths.ERM_MODEL, "stage2": paths.STAGE2_MODEL})
    results = probe_encoders(encoders, splits, params.probe, params.seed, pick_device())
    metrics, tables = split_tables(results)
    save_json(PROBE_METRICS, metrics)
    save_json(PROBE_GROUPS, tables)
    run.log_metrics(flat_scalars(metrics))
    run.log_artifact(PROBE_METRICS)
    run.log_artifact(PROBE_GROUPS)
    for name, result in metrics.items():
        if not result["trained"]:
            print(f"[linear_probe] {name}: {result['note']}")
            continue
        test = result["probe"]["test"]
        print(f"[linear_probe] {name} ({result['method']}): C = {result['probe']['c']:g}; test avg {test['avg']:.3f}, "
              f"worst-group {shown(test['worst_group'])}, unbiased {shown(test['unbiased'])}"
              + (f", worst-class {test['worst_class']:.3f}" if "worst_class" in test else "") + fairness_note(test))
        post = result["probe"].get("equalized_odds", {})
        if post.get("test"):
            print(f"[linear_probe] {name} + equalized-odds post-processing: test avg {post['test']['avg']:.3f}"
                  + fairness_note(post["test"]))


def fairness_note(report: dict) -> str:
    fairness = report.get("fairness")
    if not fairness:
        return ""
    value = fairness.get("equalized_odds_difference")
    return f", equalized-odds difference {shown(value)}" if value is not None else f" ({fairness.get('reason')})"


if __name__ == "__main__":
    main("linear_probe", run)
