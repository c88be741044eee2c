"""What must hold before the judge writes anything: the preconditions of ``ditgate baseline``, the clean
tree ``ditgate experiment`` judges, and the checks of :class:`Preflight` (environment, lock, the judge's own
modules, scope, and the fixed files the judge reads, hashed before the candidate's process runs and after).

A baseline that fails half-way is undone (``transaction.py``), but one that cannot succeed is refused before
it starts: outside a git working tree, or where git does not know who commits, it would run the lane's tests
for minutes and then fail at the commit. An experiment judges a commit: an uncommitted edit would be judged
and recorded under a HEAD that lacks it, a best nobody can reproduce.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pytest_ditgate import git
from pytest_ditgate.experiment.policy import refused_environment
from pytest_ditgate.golden.store import sha256_bytes
from pytest_ditgate.quality.contract import contract_path_for
from pytest_ditgate.verdict.outcome import Category
from pytest_ditgate.verdict.scope import scope_problems

if TYPE_CHECKING:
    from pytest_ditgate.golden.fixed_paths import LockSettings


def baseline_problems(root: Path, project: Mapping[str, Any], lane_tests: tuple[str, ...], artefacts: Path,
                      history_file: Path, golden_store: Path) -> list[str]:
    """Why ``ditgate baseline`` cannot run here (empty when it can); reads only. A mutable path that does not
    exist at the baseline is a typo: every later edit would be out of scope (13)."""
    from pytest_ditgate.golden.fixed_paths import LockSettings, unlocated_fixed_paths
    from pytest_ditgate.project_config import missing_folder_problem, missing_paths, string_list, timing_module_problem

    problems = [p for p in (git.work_tree_problem(root),) if p]
    if not problems:
        problems += [p for p in (git.branch_problem(root), git.identity_problem(root)) if p]
    if not problems:
        from pytest_ditgate.experiment.history import ref_lock_problem

        problems += [p for p in (ref_lock_problem(root, history_file.stem),) if p]
    if history_file.exists():
        problems.append(f"the lane history {history_file} exists, but no baseline of the lane is recorded (neither "
                        "the fixed-paths lock nor the lane's git ref names it): move it away before a new baseline")
    problems += unlocated_fixed_paths(LockSettings.from_rootdir(root), golden_store)
    problems += missing_paths(root, string_list(project, "mutable_paths"), "[tool.ditgate] mutable_paths")
    problems += missing_paths(root, list(lane_tests), "the lane's tests")
    lanes = project.get("lanes")
    for name, lane in (lanes.items() if isinstance(lanes, dict) else ()):
        timing = lane.get("timing") if isinstance(lane, dict) else None
        problem = timing_module_problem(root, timing, f"[tool.ditgate.lanes.{name}] timing") if timing else None
        if problem:
            problems.append(problem)
    folder = missing_folder_problem(artefacts, root)
    if folder:
        problems.append(f"the artefact folder: {folder}")
    return problems


def uncommitted_changes(root: Path, artefacts: Path, mutable: list[str]) -> list[str]:
    """The paths an experiment would judge although HEAD lacks them: every staged, unstaged or untracked change,
    and every file git ignores inside the mutable paths (a prebuilt library, a module a committed
    ``.gitignore`` hides: the candidate's code could load them); the artefact folder, ``__pycache__`` folders
    and bytecode aside (the judge reads neither, and compiles every module from source)."""
    try:
        skip = artefacts.resolve().relative_to(root.resolve()).as_posix() + "/"
    except ValueError:
        skip = None
    paths = git.uncommitted(root) + git.unlike_head(root) + git.ignored(root, list(mutable))
    return sorted({path for path in paths
                   if not (skip and (path.rstrip("/") + "/").startswith(skip))
                   and "__pycache__" not in path.split("/") and not path.endswith((".pyc", ".pyo"))})


def paths_leaving_project(root: Path, mutable: list[str]) -> list[str]:
    """The mutable paths, and the symlinks in them, that resolve outside the project: git tracks a symlink as its
    target's name, so an edit made where it points is a change no commit holds and no diff shows."""
    real_root = root.resolve()
    found = []
    for entry in mutable:
        start = root / entry
        candidates = [start]
        if start.is_dir() and not start.is_symlink():
            candidates += [path for path in start.rglob("*") if path.is_symlink()]
        for path in candidates:
            if not (path.is_symlink() or path == start):
                continue
            try:
                path.resolve().relative_to(real_root)
            except ValueError:
                found.append(f"{path.relative_to(root).as_posix()} -> {path.resolve()}")
            except OSError as exc:  # a symlink loop
                found.append(f"{path.relative_to(root).as_posix()} ({exc})")
    return sorted(set(found))


def quality_contract(root: Path, project: Mapping[str, Any]) -> Path:
    """The contract the child's quality session reads (a project without one gets the packaged default)."""
    raw = project.get("quality_contract")
    return contract_path_for(root, str(raw) if raw is not None else None)


@dataclass
class Preflight:
    """The judge's checks of the tree it runs in: each ``check_*`` adds what it finds to :attr:`problems`."""

    root: Path
    lock: LockSettings
    project: Mapping[str, Any]
    artefacts: Path
    env: Mapping[str, str]
    mutable: list[str]
    problems: list[tuple[Category, str]] = field(default_factory=list)
    #: relative path -> sha256 of every fixed file, as check_lock found them
    fixed_files: dict[str, str] | None = None

    def fixed_patterns(self) -> list[str]:
        lock_rel = self.lock.lock_path.relative_to(self.root).as_posix()
        return [*self.lock.patterns, lock_rel, "golden/"]

    def refuse_uncommitted(self) -> bool:
        """Whether the working tree has changes HEAD lacks, said on stderr: a verdict recorded under HEAD would
        name code it never saw."""
        leaving = paths_leaving_project(self.root, self.mutable)
        if leaving:
            print(f"ditgate: refused: mutable paths lead out of the project ({', '.join(leaving)}); what they point "
                  "at is no part of any commit, so an edit there is judged under a HEAD that lacks it: keep the "
                  "candidate's files inside the project", file=sys.stderr)
            return True
        dirty = uncommitted_changes(self.root, self.artefacts, self.mutable)
        if dirty:
            shown = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
            print(f"ditgate: refused: the working tree has uncommitted changes ({shown}); the judge judges the "
                  "checked-out commit, which lacks them: commit them (or stash them) and run again",
                  file=sys.stderr)
        return bool(dirty)

    def check_environment(self) -> None:
        for line in refused_environment(self.env, self.root, self.fixed_patterns()):
            self.problems.append((Category.INTEGRITY, line))

    def check_lock(self) -> None:
        from pytest_ditgate.golden.fixed_paths import evaluate_lock, expand

        self.fixed_files = expand(self.lock)  # hashed once: check_own_modules needs the same list
        verdict = evaluate_lock(self.lock, now=self.fixed_files)
        for line in verdict.lines() if verdict.changed else []:
            self.problems.append((Category.INTEGRITY, f"fixed paths: {line.strip()}"))

    def judged_files(self, known: dict[str, str] | None = None) -> dict[str, str]:
        """sha256 of every file the judge reads once the child ran: the lock's files (the classifier's module
        and weights among them), and the goldens, their manifest and the quality contract even where the lock
        does not name them. ``known``: digests taken a moment before (no candidate code ran since). A contract
        outside the project (an absolute path, the packaged default of an installed plugin) is hashed too,
        under its absolute path."""

        from pytest_ditgate.golden.fixed_paths import expand

        extras = ["golden/"]
        contract = quality_contract(self.root, self.project)
        relative = self._relative(contract)
        if relative:
            extras.append(relative.rstrip("/"))
        digests = expand(replace(self.lock, patterns=tuple(dict.fromkeys([*self.lock.patterns, *extras]))), known)
        if not relative:
            try:
                digests[str(contract.resolve())] = sha256_bytes(contract.read_bytes())
            except OSError:
                pass  # no contract to read: the quality session in the child says so
        return digests

    def check_judged_files_kept(self, before: dict[str, str], problems: list[tuple[Category, str]]) -> None:
        """The candidate's process runs as this user: it could rewrite a golden, its manifest or the contract
        while it runs, and be judged against its own. What the judge read must be what it hashed before."""
        now = self.judged_files()
        for path in sorted(before.keys() | now.keys()):
            if before.get(path) != now.get(path):
                what = "removed" if path not in now else "added" if path not in before else "rewritten"
                problems.append((Category.INTEGRITY, f"{path}: {what} while the candidate's process ran (a fixed "
                                                     "file the judge reads)"))

    def check_own_modules(self) -> None:
        """Every module this process imported from inside the project must be a locked, unchanged file."""
        from pytest_ditgate.golden.fixed_paths import expand

        locked = self.fixed_files if self.fixed_files is not None else expand(self.lock)
        real_root = self.root.resolve()
        for name, module in sorted(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if not file:
                continue
            try:
                relative = Path(file).resolve().relative_to(real_root).as_posix()
            except ValueError:
                continue
            if relative.startswith((".venv/", "venv/")) or "/site-packages/" in relative:
                continue
            if relative not in locked:
                self.problems.append((Category.INTEGRITY, f"the judge imported {name} from {relative}, which the "
                                                          "fixed-paths lock does not cover"))

    def check_scope(self, anchors: list[tuple[str, str]], baselines: list[tuple[str, str]] = ()) -> list[str]:
        """The paths changed since each anchor, their scope problems added. ``baselines``: ``(lane, commit)`` of
        other lanes' recorded baseline commits; what such a commit itself changed (its goldens, manifest and
        lock) is not this lane's change, when it lies between the anchor and HEAD (see
        :meth:`_changed_besides_baselines`)."""
        artefacts = self._relative(self.artefacts)
        fixed = self.fixed_patterns()
        changed: set[str] = set()
        for label, commit in anchors:
            try:
                paths = self._changed_besides_baselines(commit, baselines)
            except git.GitError as exc:
                self.problems.append((Category.INTEGRITY, f"cannot diff against the {label} {commit[:12]}: {exc}"))
                continue
            changed.update(p for p in paths if not (artefacts and (p + "/").startswith(artefacts)))
        self.problems.extend(scope_problems(sorted(changed), self.mutable, fixed))
        return sorted(changed)

    def _changed_besides_baselines(self, anchor: str, baselines: list[tuple[str, str]] | tuple = ()) -> list[str]:
        """The paths changed since ``anchor``, less those that only other lanes' baseline commits changed: the
        history from the anchor to the working tree is cut at each such commit between the anchor and HEAD, and
        a path counts where it changed in a piece between them (a change made before or after a baseline
        commit, or uncommitted, still counts; a change the baseline commit made does not)."""
        paths = set(git.changed_since(self.root, anchor))
        inside = {commit for _, commit in baselines
                  if commit != anchor and git.is_ancestor(self.root, anchor, commit) and git.is_ancestor(self.root, commit)}
        if not paths or not inside:
            return sorted(paths)
        touched: set[str] = set()
        start = anchor
        for commit in sorted(inside, key=lambda c: git.distance(self.root, anchor, c)):
            parent = git.rev(self.root, f"{commit}^")
            if parent and parent != start:
                touched.update(git.changed_between(self.root, start, parent))
            start = commit
        touched.update(git.changed_since(self.root, start))
        return sorted(paths & touched)

    def _relative(self, path: Path) -> str | None:
        try:
            return path.resolve().relative_to(self.root.resolve()).as_posix() + "/"
        except ValueError:
            return None
