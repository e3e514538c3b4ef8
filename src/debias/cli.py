"""``debias`` command line: ``debias check-params [params.yaml]`` validates without running anything;
``debias plots-template`` writes the offline page ``dvc plots show``/``diff`` fill (the report stage
writes it too) in a workspace that has none."""

from __future__ import annotations

import argparse
import sys

from debias.params import ParamsError, load_params


def check_params(path: str) -> int:
    try:
        params = load_params(path)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{path}: valid (source={params.data.source}, protocol={params.bias.protocol}, "
          f"model={params.model.name}, groups={params.groups.method}, stage2={params.stage2.method})")
    return 0


def plots_template(path: str | None) -> int:
    from debias.report.plots_page import PLOTS_TEMPLATE, write_plots_template
    from debias.paths import repo_root

    written = write_plots_template(path or repo_root() / PLOTS_TEMPLATE)
    print(f"wrote {written}: `dvc plots show` and `dvc plots diff` render offline with it")
    return 0


def deps(write: bool) -> int:
    from debias.deps import stage_differences, write_deps
    from debias.paths import repo_root

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="debias", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-params", help="validate params.yaml against the schema")
    check.add_argument("path", nargs="?", default="params.yaml")
    page = commands.add_parser("plots-template", help="write the offline HTML page DVC's plots fill "
                                                      "(.dvc/config plots.html_template)")
    page.add_argument("path", nargs="?", help="default: reports/plots_template.html in the repository root")
    code = commands.add_parser("deps", help="check (or --write) each stage's code deps in dvc.yaml against its imports")
    code.add_argument("--write", action="store_true", help="rewrite the code deps in dvc.yaml")
    args = parser.parse_args(argv)
    if args.command == "check-params":
        return check_params(args.path)
    if args.command == "plots-template":
        return plots_template(args.path)
    if args.command == "deps":
        return deps(args.write)
    return 1  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
