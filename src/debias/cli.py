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
    from debias.tracking import repo_root

    written = write_plots_template(path or repo_root() / PLOTS_TEMPLATE)
    print(f"wrote {written}: `dvc plots show` and `dvc plots diff` render offline with it")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="debias", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-params", help="validate params.yaml against the schema")
    check.add_argument("path", nargs="?", default="params.yaml")
    page = commands.add_parser("plots-template", help="write the offline HTML page DVC's plots fill "
                                                      "(.dvc/config plots.html_template)")
    page.add_argument("path", nargs="?", help="default: reports/plots_template.html in the repository root")
    args = parser.parse_args(argv)
    if args.command == "check-params":
        return check_params(args.path)
    if args.command == "plots-template":
        return plots_template(args.path)
    return 1  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
