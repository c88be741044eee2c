"""The ``ditgate`` command line: ``ditgate doctor`` (and further subcommands registered in ``COMMANDS``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


def _doctor(args: argparse.Namespace) -> int:
    from pytest_ditgate.doctor import render_text, run_doctor

    report = run_doctor(target=args.target, artefact_dir=args.dir)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(render_text(report))
    return 0 if report.ok else 1


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="show the device, capabilities, dependencies and what is missing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--target", default=None, help="also check the device against a target (profile or sm_XY)")
    parser.add_argument("--dir", default=None, help="artefact folder to report (default: ./.ditgate)")
    parser.set_defaults(handler=_doctor)


#: subcommand name -> function adding its parser (each sets ``handler``)
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {"doctor": _add_doctor}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ditgate", description="GPU correctness, speed and quality gates")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
