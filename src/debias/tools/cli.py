"""The debias command line (plain text: argparse prints this as it is)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from debias.params import ParamsError
from debias.schema import load_params

DESCRIPTION = ("debias: tools around the DVC pipeline (the pipeline itself runs with dvc repro and dvc exp run). "
               'Run "debias COMMAND --help" for the options of a command.')


def check_params(path: str, label: str | None = None, changed: dict[str, str] | None = None) -> int:
    """Validate the params file ``path`` (0, or 2 with one line naming the problem); warn of each param that weighs
    almost nothing (negligible-param) and of each ``changed`` one (the ``-S`` keys) the run does not read."""
    from debias.core.errors import DeclarationError
    from debias.data.sources.checks import DataSourceError, check_source

    try:
        params = load_params(path)
        check_source(params)  # the files the source reads, and params that need the class count (cheap)
    except (ParamsError, DataSourceError, DeclarationError) as exc:  # a broken method module too: one line
        print(f"{label}: {exc}" if label else exc, file=sys.stderr)
        return 2
    print(f"{label or path}: valid (source={params.data.source}, protocol={params.bias.protocol}, "
          f"model={params.model.name}, groups={params.groups.method}, stage2={params.stage2.method})")
    from debias.schema.applicability import RunContext, unread_warnings, weak_warnings

    context = RunContext(params)
    # valid, but a -S param the run does not read, or one that weighs almost nothing: say so
    for message in unread_warnings(context, changed or {}) + weak_warnings(context):
        print(f"{label or path}: WARNING {message}")
    return 0


def check_overrides(path: str, items: list[str]) -> int:
    """``check-params -S ...``: each combination the overrides expand to (a sweep: one per value), applied by DVC to
    a temporary copy of ``path`` and checked like ``path`` itself; ``path`` is only read. 0 when all are valid."""
    from debias.tools.overrides import override_files

    try:
        with override_files(path, items) as combinations:
            codes = []
            for overrides, applied in combinations:
                label = f"{path} with -S {' -S '.join(overrides)}"
                if isinstance(applied, ParamsError):
                    print(applied, file=sys.stderr)
                    codes.append(2)
                else:
                    changed = dict(item.lstrip("+~").partition("=")[::2] for item in overrides)
                    codes.append(check_params(str(applied), label, changed))
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    if len(codes) > 1:
        print(f"{codes.count(0)} of {len(codes)} combinations valid; {path} unchanged")
    return max(codes, default=0)


def plots_template(path: str | None) -> int:
    from debias.core.paths import repo_root
    from debias.report.plots_page import PLOTS_TEMPLATE, write_plots_template

    try:
        written = write_plots_template(path or repo_root() / PLOTS_TEMPLATE)
    except ValueError as exc:  # an existing file that is not a plots template, or a folder: left as it is
        print(f"debias plots-template: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written}: `dvc plots show` and `dvc plots diff` render offline with it")
    return 0


def deps(write: bool) -> int:
    from debias.core.paths import repo_root
    from debias.tools.deps import stage_differences, write_deps

    dvc_yaml = repo_root() / "dvc.yaml"
    if write:
        changed = write_deps(dvc_yaml)
        print(f"{dvc_yaml}: code deps of {', '.join(changed) or 'no stage'} rewritten from their imports")
        return 0
    differences = stage_differences(dvc_yaml)
    for stage, (missing, extra) in differences.items():
        for dep in missing:
            print(f"{stage}: imports {dep}, which dvc.yaml does not list")
        for dep in extra:
            print(f"{stage}: dvc.yaml lists {dep}, which its entrypoint does not import")
    if differences:
        print("run `debias deps --write` to derive them", file=sys.stderr)
        return 1
    print(f"{dvc_yaml}: every stage's code deps are what its entrypoint imports")
    return 0


def compare(args: argparse.Namespace) -> int:
    """``debias compare``: its first line at once, then a line at least every 15 s until the table."""
    import time

    from debias.harness.progress import Heartbeat, duration

    started = time.monotonic()
    print("[compare] starting (loading pandas, matplotlib and DVC's experiments takes a while)", file=sys.stderr,
          flush=True)
    with Heartbeat(lambda: f"[compare] still working, {duration(time.monotonic() - started)} since the start",
                   write=lambda line: print(line, file=sys.stderr, flush=True)):
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from debias.core.errors import DebiasError
    from debias.core.paths import repo_root
    from debias.tools.compare import compare as run_compare

    tags = {}
    for item in args.tag:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"--tag {item!r}: expected key=value", file=sys.stderr)
            return 2
        tags[key] = value
    root = repo_root()
    try:
        _, _, text = run_compare(root, args.source, args.method, args.param, args.last, tags,
                                 Path(args.out) if args.out else None, mlflow=not args.no_mlflow, max_width=args.width,
                                 sweep=args.sweep, margin=args.margin, all_commits=args.all_commits)
    except (ValueError, RuntimeError, DebiasError) as exc:
        print(f"debias compare: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


def example_folder(args: argparse.Namespace) -> int:
    from debias.data.examples import write_shapes_folder

    try:
        table = write_shapes_folder(args.root, args.n_train, args.n_eval, args.rho, args.size, args.seed, args.force,
                                    attribute=not args.no_attribute)
    except ValueError as exc:
        print(f"debias example-folder: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {table} and its images; run: {example_run_command(args.root, not args.no_attribute)}")
    return 0


def override_value(value: str) -> str:
    """``value`` as an override's value (``-S key=value``) reads it: as it is when it holds only characters an unquoted
    value may hold, else quoted (in double quotes, or single quotes where it holds a double one, that quote escaped)."""
    import re

    if re.fullmatch(r"[\w./+@~-]+", value):
        return value
    quote = "'" if '"' in value else '"'
    return quote + value.replace(quote, "\\" + quote) + quote


def example_run_command(root: str | Path, attribute: bool) -> str:
    """The shell command that runs the pipeline on the example folder ``root``, each argument quoted for the shell
    (a path with spaces or quotes stays one argument)."""
    import shlex

    sets = ["data.source=imagefolder", f"data.imagefolder.root={override_value(str(root))}"]
    if not attribute:  # without bias labels the default rule (best validation worst-group) has nothing to read
        sets += ["data.imagefolder.attribute_column=null", "stage2.selection=best_worst_inferred_group"]
    return shlex.join(["dvc", "exp", "run", *(part for value in sets for part in ("-S", value))])


PRESET_HELP = """\
Paper presets: named, versioned params sets carrying a paper's protocol and the objective its numbers came
from (src/debias/tools/presets/*.yaml; docs/presets.md). apply composes one over params.yaml and rewrites only the
values that change (comments and layout stay), after validating the result; nothing is written if it fails.

examples:
  debias preset list
  debias preset show fairkl-bmnist-0.997-eps-supcon
  debias preset apply cnc-cmnist --dry-run
  debias preset apply cnc-cmnist@1                       # refuses if the preset's version is no longer 1
  debias preset apply fairkl-bffhq --set data.imagefolder.root=data/external/bffhq
  debias preset apply cnc-waterbirds --print-set | xargs dvc exp run --queue -S seed=1
"""


def preset(args: argparse.Namespace) -> int:
    from debias.core.trees import merge
    from debias.tools import presets

    try:
        if args.action == "list":
            for name in presets.names():
                loaded = presets.load(name)
                print(f"{name:<36} v{loaded.version}  {loaded.title}")
            return 0
        loaded = presets.load(args.name)
        if args.action == "show":
            print(presets.describe(loaded))
            return 0
        sets = presets.parse_sets(args.set)
        path = Path(args.params)
        applied = presets.plan_apply(presets.read_params(path), loaded, sets, str(path))
    except presets.PresetError as exc:
        print(f"debias preset: {exc}", file=sys.stderr)
        return 2
    except ParamsError as exc:
        print(f"debias preset: {exc}", file=sys.stderr)
        return 2
    if args.print_set:
        print(presets.shell_line(presets.set_args(merge(loaded.params(), sets))))
        return 0
    if applied.changes and not args.dry_run:
        try:
            presets.write_atomic(path, applied.text)
        except presets.PresetError as exc:
            print(f"debias preset: {exc}", file=sys.stderr)
            return 2
    for key, (old, new) in applied.changes.items():
        print(f"{key}: {old!r} -> {new!r}" if old is not None else f"{key}: (absent) -> {new!r}")
    if args.dry_run:
        print(f"{path}: {len(applied.changes)} values would change (dry run: nothing written)")
        return 0
    print(f"{path}: preset {loaded.name} version {loaded.version} applied ({len(applied.changes)} values changed)")
    for deviation in loaded.deviations:
        print(f"  deviation from the paper: {deviation}")
    return 0


COMPARE_HELP = """\
Gather experiments into a table (one row per experiment: the params that differ and the headline test
metrics; then grouped by everything but the seed, mean +- std over seeds) printed here at most --width
characters wide, and a self-contained HTML page (reports/compare/index.html: tables, warnings, per-group
heatmaps and validation curves of the runs compared) that opens offline; also logged to MLflow
(experiment "<name>-compare") unless --no-mlflow or DEBIAS_TRACKING=off.

examples:
  debias compare
  debias compare --method cnc --last 6
  debias compare --param loss.epsilon=0.25 --param stage2.method=eps_supinfonce
  debias compare --source mlflow --tag debias.dvc_experiment=my-exp
  debias compare --sweep eps --margin 2
  debias compare --all-commits
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="debias", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    check = commands.add_parser("check-params", help="validate params.yaml (and -S overrides) against the schema, "
                                "running nothing", description="Validate params.yaml against the schema without "
                                "running anything; with -S, params.yaml as `dvc exp run -S` would change it (each "
                                "value of a sweep), leaving the file itself untouched.")
    check.add_argument("path", nargs="?", default="params.yaml")
    check.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="an override as `dvc exp run -S` takes it (repeatable): key=value, a sweep key=v1,v2, "
                            "+key=value, ~key")
    cmp = commands.add_parser("compare", help="compare experiments: a table here and an HTML page",
                              description=COMPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("--source", choices=("dvc", "mlflow", "both"), default="dvc",
                     help="DVC's experiments of this repository (default: dvc exp show) or MLflow's pipeline runs")
    cmp.add_argument("--sweep", metavar="NAME", help="only the experiments of the sweep NAME (debias sweep --name)")
    cmp.add_argument("--method", help="only experiments whose stage2.method is this (e.g. cnc)")
    cmp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="only experiments with this param value (repeatable), e.g. loss.epsilon=0.25")
    cmp.add_argument("--last", type=int, metavar="N", help="only the N most recent experiments (after the filters)")
    cmp.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                     help="--source mlflow: only parent runs with this tag value (repeatable)")
    cmp.add_argument("--out", help="folder of the page (default: reports/compare in the repository root)")
    cmp.add_argument("--width", type=int, default=160, help="widest line of the table printed (default: 160)")
    cmp.add_argument("--no-mlflow", action="store_true", help="do not log the page to MLflow")
    cmp.add_argument("--margin", type=float, metavar="D", help="points: also test equivalence within ±D (two one-sided "
                     "tests); each verdict is then within ±D, differs, or undecided with the seeds that would decide it")
    cmp.add_argument("--all-commits", action="store_true", help="DVC's experiments of every commit (dvc exp show -A), "
                     "not only the current commit's")
    page = commands.add_parser("plots-template", help="write the offline page that dvc plots show / diff fill",
                               description="Write the offline HTML page that dvc plots show / dvc plots diff fill "
                                           "(.dvc/config plots.html_template points at it).")
    page.add_argument("path", nargs="?", help="default: reports/plots_template.html in the repository root")
    code = commands.add_parser("deps", help="check (or --write) each stage's code deps in dvc.yaml",
                               description="Check (or --write) each stage's code deps in dvc.yaml against the "
                                           "imports of its entrypoint.")
    code.add_argument("--write", action="store_true", help="rewrite the code deps in dvc.yaml")
    shapes = commands.add_parser("example-folder", help="write a small biased image folder with a metadata.csv",
                                 description="Write white squares and discs on green or blue backgrounds (the class "
                                             "follows the background in --rho of the training images; val and test "
                                             "balanced) with Waterbirds' metadata.csv layout, for data.source="
                                             "imagefolder.")
    shapes.add_argument("root", help="folder to write (e.g. data/external/shapes: git-ignored)")
    shapes.add_argument("--n-train", type=int, default=400)
    shapes.add_argument("--n-eval", type=int, default=100, help="images in each of val and test")
    shapes.add_argument("--rho", type=float, default=0.95, help="share of training images on their class's background")
    shapes.add_argument("--size", type=int, default=32, help="image side in pixels")
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--no-attribute", action="store_true", help="leave the bias attribute column (place) out of "
                        "metadata.csv: data without bias labels (data.imagefolder.attribute_column: null)")
    shapes.add_argument("--force", action="store_true", help="write into a folder that is not empty (its metadata.csv "
                                                             "and images/ files of the same names are replaced)")
    pre = commands.add_parser("preset", help="list, show or apply the papers' presets (versioned params sets)",
                              description=PRESET_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    pre_actions = pre.add_subparsers(dest="action", required=True, metavar="ACTION")
    pre_actions.add_parser("list", help="the presets, their versions and titles")
    pre_show = pre_actions.add_parser("show", help="a preset's values, each with its source, and its deviations")
    pre_show.add_argument("name", help="a name from `debias preset list`")
    pre_apply = pre_actions.add_parser("apply", help="compose a preset over params.yaml (validated, comments kept)")
    pre_apply.add_argument("name", help="a name from `debias preset list`; NAME@VERSION refuses another version")
    pre_apply.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                           help="a value on top of the preset (repeatable; YAML, as dvc exp run -S)")
    pre_apply.add_argument("--params", default="params.yaml", help="the file to rewrite (default: params.yaml)")
    pre_apply.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    pre_apply.add_argument("--print-set", action="store_true",
                           help="print the preset as `-S key=value` arguments for `dvc exp run` (after validating "
                                "them over params.yaml), write nothing")
    from debias.tools import services, sweep  # light modules: argparse and yaml until a command runs

    sweep.add_parser(commands)
    services.add_parser(commands)
    args = parser.parse_args(argv)
    if args.command in ("sweep", "services"):
        return args.handler(args)
    if args.command == "check-params":
        return check_overrides(args.path, args.overrides) if args.overrides else check_params(args.path)
    if args.command == "compare":
        return compare(args)
    if args.command == "plots-template":
        return plots_template(args.path)
    if args.command == "deps":
        return deps(args.write)
    if args.command == "example-folder":
        return example_folder(args)
    if args.command == "preset":
        return preset(args)
    return 1  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
