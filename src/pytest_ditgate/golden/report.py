"""What the golden store did in a run, as lines for the terminal summary (built here, printed by the plugin).

Orphans: a golden name that no test asked for, whose freezing test either ran in this session, was
collected out of existence (its file was collected but the test id is gone), or whose test file no
longer exists; plus golden files in the directory that the manifest does not list. Goldens of tests
that were not run in this session are never called orphans.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_ditgate.golden.manifest import Manifest


@dataclass(frozen=True)
class RunUsage:
    """Which golden names were used, which tests ran and which were collected (merged across xdist workers)."""

    used: frozenset[str] = frozenset()
    ran: frozenset[str] = frozenset()
    collected: frozenset[str] = frozenset()


def find_orphans(manifest: Manifest, usage: RunUsage, rootdir: Path) -> list[str]:
    """Manifest entries (``key/name``) whose golden is orphaned by the rules in the module docstring."""
    collected_files = {nodeid.split("::", 1)[0] for nodeid in usage.collected}
    orphans = []
    for ident, entry in sorted(manifest.entries.items()):
        if entry.name in usage.used:
            continue
        test = str(entry.provenance.get("test") or "")
        test_file = test.split("::", 1)[0]
        if not test:
            continue
        if (test in usage.ran or (test_file in collected_files and test not in usage.collected)
                or not (rootdir / test_file).exists()):
            orphans.append(ident)
    return orphans


def shown_names(names: tuple[str, ...]) -> str:
    """The optional golden tensors a candidate did not produce, as one line's tail: the first four and a count."""
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


@dataclass
class GoldenReport:
    """Counts and lists for the summary; ``lines()`` never prints."""

    mode: str
    written: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)
    fallbacks: list[tuple[str, str, str, str]] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_compared: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # nodeid, name, tensors

    def lines(self) -> list[tuple[str, dict[str, bool]]]:
        """(text, markup) pairs: red for overwrites and errors, yellow for orphans."""
        out: list[tuple[str, dict[str, bool]]] = []
        if self.written:
            out.append((f"wrote {len(self.written)} new golden(s): {', '.join(self.written)}", {"green": True}))
        if self.overwritten:
            out.append((f"REFREEZE: OVERWROTE {len(self.overwritten)} existing golden(s): "
                        f"{', '.join(self.overwritten)}", {"red": True, "bold": True}))
        for nodeid, name, requested, used in self.fallbacks:
            out.append((f"fallback: {nodeid or name} used golden {name!r} of {used} (no {requested} golden)", {}))
        if self.not_compared:
            tensors = sum(len(t) for _, _, t in self.not_compared)
            out.append((f"{len(self.not_compared)} check(s) judged on required tensors only: {tensors} optional "
                        "golden tensor(s) not produced by the candidate, so not compared", {"yellow": True}))
            for nodeid, name, names in self.not_compared:
                out.append((f"  not compared: {nodeid or name} [{name}]: {shown_names(names)}", {}))
        if self.orphans:
            out.append((f"{len(self.orphans)} orphaned golden(s), used by no test: {', '.join(self.orphans)}",
                        {"yellow": True}))
        if self.untracked:
            out.append((f"{len(self.untracked)} golden file(s) not in the manifest: {', '.join(self.untracked)}",
                        {"yellow": True}))
        for error in self.errors:
            out.append((error, {"red": True}))
        return out
