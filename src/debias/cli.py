"""``debias`` command line: ``debias check-params [params.yaml]`` validates without running anything."""

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="debias", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check-params", help="validate params.yaml against the schema")
    check.add_argument("path", nargs="?", default="params.yaml")
    args = parser.parse_args(argv)
    if args.command == "check-params":
        return check_params(args.path)
    return 1  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
