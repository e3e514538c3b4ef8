"""Stage report: reports/report.md and a self-contained reports/report.html (figures under reports/figures/,
per-group accuracy CSVs under reports/plots/) from every stage's outputs, logged to MLflow; and
reports/plots_template.html, the offline page `dvc plots show` / `dvc plots diff` fill (not logged:
it is the same 0.9 MB of JavaScript for every run). The report is logged on the pipeline's MLflow parent run too."""

import time
from pathlib import Path

from debias.harness.stage import main
from debias.harness.tracking import StageRun
from debias.params import Params
from debias.report.build import REPORT_HTML, REPORT_MD, build_report, params_warnings
from debias.report.plots_page import PLOTS_TEMPLATE, write_plots_template


def run(params: Params, run: StageRun) -> None:
    started = time.perf_counter()
    written = build_report(Path("."), params, run.run_id)
    for path in written:
        rel = Path(path)
        folder = "report" if rel.name in (REPORT_MD.name, REPORT_HTML.name) else f"report/{rel.parent.name}"
        run.log_artifact(path, folder)
        if rel.name in (REPORT_MD.name, REPORT_HTML.name):  # also on the pipeline's parent run, beside its metrics
            run.log_parent_artifact(path, "report")
    write_plots_template(PLOTS_TEMPLATE)
    run.log_warnings(params_warnings(Path(".")))  # the stages log their own; the report, every stage's unread params
    run.log_metrics({"report.build_s": time.perf_counter() - started})
    print(f"[report] wrote {REPORT_MD} and {REPORT_HTML} ({Path(REPORT_HTML).stat().st_size / 1e6:.1f} MB) "
          f"with {len(written) - 2} figures/plots in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main("report", run)
