"""``python -m kernels``: ``status`` (toolkit, cache, each module's state) and ``build`` (ahead of time)."""

from __future__ import annotations

import argparse
import sys

from kernels import modules
from kernels.jit import env
from kernels.jit.errors import JitError


def _status(args: argparse.Namespace) -> int:
    from kernels.jit.toolkit import find_toolkit

    print(f"cache:     {env.cache_dir()}")
    print(f"generated: {env.gen_dir()}")
    try:
        toolkit = find_toolkit()
        print(f"toolkit:   {toolkit.describe()}")
    except JitError as exc:
        print(f"toolkit:   none ({exc})")
        return 1
    for spec in modules.all_specs():
        try:
            plan = spec.plan(args.archs)
        except JitError as exc:
            print(f"  {spec.name:34s} -- {exc}")
            continue
        meta, why = spec.check_cached(plan)
        where = plan.artefact if meta else why
        print(f"  {spec.name:34s} sm_{', sm_'.join(f'{a}{b}' for a, b in plan.archs):12s} {where}")
    return 0


def _build(args: argparse.Namespace) -> int:
    failed = 0
    for spec in modules.all_specs():
        params = dict(spec.params)
        if (args.ops and params["op"] not in args.ops) or (args.dtypes and params["dtype"] not in args.dtypes):
            continue
        try:
            module = spec.build_and_load(args.archs)
            print(f"{spec.name}: {module.origin} {module.path}")
        except JitError as exc:
            failed += 1
            print(f"{spec.name}: FAILED {exc}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("status", "build"):
        p = sub.add_parser(name)
        p.add_argument("--archs", default=None, help='target archs, e.g. "8.6 9.0" (default: env or visible GPU)')
    build = sub.choices["build"]
    build.add_argument("--ops", nargs="*", default=None, choices=list(modules.OPS), help="ops to build (default: all)")
    build.add_argument("--dtypes", nargs="*", default=None, choices=list(modules.DTYPES),
                       help="dtypes to build (default: all)")
    args = parser.parse_args(argv)
    return _status(args) if args.command == "status" else _build(args)


if __name__ == "__main__":
    raise SystemExit(main())
