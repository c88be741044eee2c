"""The ``ditgate`` command line: ``ditgate doctor`` (and further subcommands registered in ``COMMANDS``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence


def _doctor(args: argparse.Namespace) -> int:
    from pytest_ditgate.doctor import render_text, run_doctor

    report = run_doctor(target=args.target, artefact_dir=args.dir, deep=args.deep)
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
    parser.add_argument("--deep", action="store_true",
                        help="import every optional dependency too (slower; finds broken binary installs)")
    parser.set_defaults(handler=_doctor)


def _summary(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pytest_ditgate.verdict.ledger import read_experiments, read_results

    root = Path(args.dir)
    skipped: list[str] = []
    rows = read_results(root, skipped)
    if args.lane:
        lanes = {r.get("commit"): r for r in read_experiments(root, skipped)
                 if isinstance(r.get("verdict"), dict) and r["verdict"].get("lane") == args.lane}
        rows = [r for r in rows if r.get("commit") in lanes]
    for message in skipped:
        print(f"warning: {message}", file=sys.stderr)
    rows = rows[-args.limit:]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no experiments recorded under {root}")
        return 0
    columns = ("timestamp", "commit", "status", "class", "best_before", "candidate", "improvement_pct", "description")
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    widths["description"] = min(widths["description"], 60)
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(row.get(c, "")[: widths[c]].ljust(widths[c]) for c in columns))
    return 0


def _add_summary(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("summary", help="recent experiments from the ledger (results.tsv)")
    parser.add_argument("--dir", default=".ditgate", help="ledger folder (default .ditgate)")
    parser.add_argument("--lane", default=None, help="only this lane")
    parser.add_argument("-n", "--limit", type=int, default=20, help="how many (default 20)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=_summary)


def _report(args: argparse.Namespace) -> int:
    """Write the HTML page; what had to be left out (bad ledger lines, plots without matplotlib) is
    listed on stderr, and the page is written anyway."""
    from pathlib import Path

    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.fsutil import atomic_write_text
    from pytest_ditgate.verdict.report import build_report

    root = Path(args.dir)
    if not root.is_dir():
        raise DitgateUsageError(f"--dir {root}: no such ledger folder (run pytest --ditgate first, or name the "
                                "folder given to --ditgate-dir)")
    out = Path(args.out or root / "report.html")
    page = build_report(root)
    for note in page.notes:
        print(f"ditgate report: note: {note}", file=sys.stderr)
    atomic_write_text(out, page.html)
    print(f"wrote {out}")
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="an HTML page: benchmark history per lane and arch, quality, heat maps")
    parser.add_argument("--dir", default=".ditgate", help="ledger folder (default .ditgate)")
    parser.add_argument("--out", default=None, help="output file (default <dir>/report.html)")
    parser.set_defaults(handler=_report)


def _baseline(args: argparse.Namespace) -> int:
    import subprocess

    from pathlib import Path

    from pytest_ditgate.verdict.ledger import load_best

    from pytest_ditgate.device import real_device

    arch = real_device().arch
    try:
        best = None if args.force else load_best(Path(args.dir), args.lane, arch)
    except ValueError as exc:
        print(f"ditgate baseline: {exc}", file=sys.stderr)
        return 2
    if best is not None:
        print(f"lane {args.lane!r} already has a best on {arch}: a baseline is recorded once "
              "(use a new lane, or --force to record another first best)")
        return 2
    command = [sys.executable, "-m", "pytest", "--ditgate", "--ditgate-freeze", f"--ditgate-lane={args.lane}",
               f"--ditgate-dir={args.dir}", "--ditgate-description=baseline",
               "--ditgate-base=HEAD",  # the baseline is the tree as it is: only uncommitted edits are in scope
               *args.pytest_args]
    print("running:", " ".join(command[2:]))
    return subprocess.run(command).returncode


def _add_baseline(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("baseline", help="freeze missing goldens, lock the fixed paths and record the lane's "
                                             "first best (runs pytest --ditgate --ditgate-freeze --ditgate-lane)")
    parser.add_argument("--lane", required=True)
    parser.add_argument("--dir", default=".ditgate", help="ledger folder (default .ditgate)")
    parser.add_argument("--force", action="store_true", help="record even when the lane already has a best")
    parser.add_argument("pytest_args", nargs="*", help="test paths and extra pytest options (after --)")
    parser.set_defaults(handler=_baseline)


#: subcommand name -> function adding its parser (each sets ``handler``)
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "doctor": _add_doctor,
    "baseline": _add_baseline,
    "summary": _add_summary,
    "report": _add_report,
}


#: exit status of a usage error (bad argument, profile, contract, ledger folder...), as pytest's
EXIT_USAGE = 4


class _Parser(argparse.ArgumentParser):
    """argparse that exits with :data:`EXIT_USAGE` on a bad argument, like every other ditgate usage error."""

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ditgate", description="GPU correctness, speed and quality gates")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Bad input is one line on stderr and exit 4; an I/O failure one line and exit 1;
    never a traceback for either."""
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.fsutil import CorruptFile

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        return 130
    except (DitgateUsageError, CorruptFile) as exc:
        print(f"ditgate {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"ditgate {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
