"""The ``ditgate`` command line: ``ditgate doctor`` (and further subcommands registered in ``COMMANDS``).

Every command works from the project root, found as pytest finds its rootdir
(:func:`~pytest_ditgate.project_config.find_project_root`), and reads the artefact folder through the one
resolver pytest uses too (:func:`~pytest_ditgate.artefacts.command_artefact_dir`): ``--dir`` (relative to the
current folder), else ``$DITGATE_DIR``, else ``[tool.ditgate] artefact_dir``, else ``<root>/.ditgate``. So a
command run from a subfolder sees what ``pytest --ditgate`` wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence


def _given(text: str) -> str:
    """``type=`` of an argument that names something (a lane, a folder, a target): an empty one (an unset
    variable in a script) is a usage error, never the default."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (an unset variable in a script?): give a value, or leave the "
                                         "option out for its default")
    return text


def _count(text: str) -> int:
    """``type=`` of ``summary -n``: how many rows, at least one (``-n -3`` sliced the rows from the other end)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def artefact_dir(args: argparse.Namespace) -> "Path":
    """The artefact folder a command reads: ``--dir`` (from the current folder), else what pytest run at the
    project root uses (``$DITGATE_DIR``, ``[tool.ditgate] artefact_dir``, ``.ditgate``)."""
    from pytest_ditgate.artefacts import command_artefact_dir

    return command_artefact_dir(getattr(args, "dir", None))


def _doctor(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pytest_ditgate.artefacts import resolve_artefact_dir
    from pytest_ditgate.doctor import render_text, run_doctor
    from pytest_ditgate.doctor_project import check_project
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.project_config import find_project_root

    root = find_project_root()
    try:
        folder = artefact_dir(args)
    except DitgateUsageError:  # a bad [tool.ditgate]: the project section names every problem; the default folder
        folder = resolve_artefact_dir(root, str(Path(args.dir).expanduser().absolute()) if args.dir else None)
    report = run_doctor(target=args.target, artefact_dir=str(folder), deep=args.deep)
    report.add_project(check_project(root, deep=args.deep))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str))
    else:
        print(render_text(report))
    return 0 if report.ok else 1


def _add_doctor(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="show the device, capabilities, dependencies and what is missing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--target", default=None, type=_given, help="also check the device against a target (profile or sm_XY)")
    parser.add_argument("--dir", default=None, type=_given, help="artefact folder to report (default: $DITGATE_DIR, [tool.ditgate] "
                                                    "artefact_dir, else .ditgate in the project root)")
    parser.add_argument("--deep", action="store_true",
                        help="import every optional dependency too (slower; finds broken binary installs)")
    parser.set_defaults(handler=_doctor)


def _summary(args: argparse.Namespace) -> int:
    from pytest_ditgate.verdict.ledger import read_experiments, read_results

    root = artefact_dir(args)
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
    parser.add_argument("--dir", default=None, type=_given, help="ledger folder (default: $DITGATE_DIR, [tool.ditgate] "
                                                    "artefact_dir, else .ditgate in the project root)")
    parser.add_argument("--lane", default=None, type=_given, help="only this lane")
    parser.add_argument("-n", "--limit", type=_count, default=20, help="how many (default 20)")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=_summary)


def _report(args: argparse.Namespace) -> int:
    """Write the HTML page; what had to be left out (bad ledger lines, plots without matplotlib) is
    listed on stderr, and the page is written anyway."""
    from pathlib import Path

    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.fsutil import atomic_write_text
    from pytest_ditgate.verdict.report import build_report

    root = artefact_dir(args)
    if not root.is_dir():
        from pytest_ditgate.artefacts import named_by

        source = named_by(f"--dir {args.dir}" if args.dir else None, "the artefact folder")
        raise DitgateUsageError(f"{source}: no such ledger folder {root} (run pytest --ditgate first, or name the "
                                "folder given to --ditgate-dir with --dir or DITGATE_DIR)")
    out = Path(args.out or root / "report.html")
    if args.out:
        from pytest_ditgate.project_config import find_project_root, output_file_problem

        problem = output_file_problem(out, find_project_root())
        if problem is not None:
            raise DitgateUsageError(f"--out {args.out}: {problem}")
    page = build_report(root)
    for note in page.notes:
        print(f"ditgate report: note: {note}", file=sys.stderr)
    atomic_write_text(out, page.html)
    print(f"wrote {out}")
    return 0


def _add_report(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("report", help="an HTML page: benchmark history per lane and arch, quality, heat maps")
    parser.add_argument("--dir", default=None, type=_given, help="ledger folder (default: $DITGATE_DIR, [tool.ditgate] "
                                                    "artefact_dir, else .ditgate in the project root)")
    parser.add_argument("--out", default=None, type=_given, help="output file (default <dir>/report.html)")
    parser.set_defaults(handler=_report)


def _judge(args: argparse.Namespace) -> int:
    """Hand over to the judge process (``experiment/judge.py``), started clean: no project bytecode, no
    current folder on ``sys.path`` (``experiment/bootstrap.py``)."""
    import os
    import subprocess
    from pathlib import Path

    from pytest_ditgate.experiment.bootstrap import JUDGE

    argv = [args.command, "--lane", args.lane]
    if getattr(args, "cls", None) is not None:
        argv += ["--class", args.cls]
    if getattr(args, "description", None):
        argv += ["--description", args.description]
    from pytest_ditgate.project_config import find_project_root

    root = str(find_project_root())
    command = [sys.executable, "-B", "-P", "-c", JUDGE, root, *argv]
    judge = subprocess.Popen(command, cwd=root, env=dict(os.environ))
    while True:
        try:
            return judge.wait()
        except KeyboardInterrupt:
            # Ctrl-C reaches the judge too (same process group): it stops its run and puts the tree back
            # (a baseline is one transaction), which must not be cut short by killing it here
            continue


def _add_baseline(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("baseline", help="a maintainer's step, once per lane: run the lane's tests from "
                                             "[tool.ditgate.lanes], freeze missing goldens, relock the fixed paths, "
                                             "commit, and start the lane's history with its first best")
    parser.add_argument("--lane", required=True, type=_given)
    parser.set_defaults(handler=_judge)


def _add_experiment(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("experiment", help="judge the checked-out commit in a lane: exit 0 KEEP, 10-14 "
                                               "DISCARD (quality, performance, integrity, scope, class), 15 CRASH")
    parser.add_argument("--lane", required=True, type=_given)
    from pytest_ditgate.quality.specs import EXPERIMENT_CLASSES

    parser.add_argument("--class", dest="cls", default=None, choices=EXPERIMENT_CLASSES,
                        help="the class you claim (exact, numerical, approximate, quantization); default: the lane's")
    parser.add_argument("--description", default="", help="one line: the causal hypothesis of this commit")
    parser.set_defaults(handler=_judge)


#: subcommand name -> function adding its parser (each sets ``handler``)
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "doctor": _add_doctor,
    "baseline": _add_baseline,
    "experiment": _add_experiment,
    "summary": _add_summary,
    "report": _add_report,
}


#: exit status of a usage error (bad argument, profile, contract, ledger folder...), as pytest's
EXIT_USAGE = 4


class _Once(argparse._StoreAction):
    """An option that takes a value once: ``--lane fwd --lane kernels`` (a script appending to a command line) is a
    usage error naming both, not the last one silently (there is no ini file here for a command line to override)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        seen = f"_given_{self.dest}"
        if getattr(namespace, seen, False):
            parser.error(f"argument {option_string}: given twice ({getattr(namespace, self.dest)!r} and {values!r}); "
                         "give it once")
        setattr(namespace, seen, True)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse that exits with :data:`EXIT_USAGE` on a bad argument, like every other ditgate usage error; an
    option with a value may be given once."""

    def add_argument(self, *names, **kwargs):  # type: ignore[override]
        if names and names[0].startswith("-") and "action" not in kwargs:
            kwargs["action"] = _Once
        return super().add_argument(*names, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from pytest_ditgate import __version__

    parser = _Parser(prog="ditgate", description="GPU correctness, speed and quality gates")
    parser.add_argument("--version", action="version", version=f"ditgate (pytest-ditgate) {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. Bad input is one line on stderr and exit 4; an I/O failure one line and exit 1;
    Ctrl-C one line and exit 130, wherever it lands (in the imports too); never a traceback for any."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("ditgate: interrupted", file=sys.stderr)
        return 130


def _run(argv: Sequence[str] | None) -> int:
    from pytest_ditgate.errors import DitgateUsageError
    from pytest_ditgate.fsutil import CorruptFile

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (DitgateUsageError, CorruptFile) as exc:
        print(f"ditgate {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"ditgate {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
