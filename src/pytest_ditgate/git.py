"""The one git helper of the plugin: every ``git`` call goes through :func:`git`.

The judge trusts git's object store for its anchors (the lane's baseline commit, the best's commit) and
the working tree for what the candidate changed; nothing here takes a base from the caller. The provenance
of a run (``environment.json``, a golden's manifest entry) names its commit with :func:`commit_id`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

#: names the measured commit where git cannot (a copied tree on a GPU host, perhaps with a stale .git)
COMMIT_ENV = "DITGATE_COMMIT"


class GitError(RuntimeError):
    """A git command failed (its stderr is in the message)."""


def git(root: str | Path | None, *args: str, stdin: str | None = None, timeout: float = 120,
        check: bool = True) -> str:
    """Run ``git args`` in ``root`` (None: the current folder); stdout, or :class:`GitError` (when git cannot
    run, or with ``check`` when it exits non-zero)."""
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout, input=stdin)
    except (OSError, subprocess.SubprocessError) as exc:
        raise GitError(f"git {' '.join(args)}: {exc}") from None
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def rev(root: str | Path, name: str) -> str | None:
    """The full commit id ``name`` resolves to, or None."""
    try:
        return git(root, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}").strip() or None
    except GitError:
        return None


def head(root: str | Path) -> str | None:
    return rev(root, "HEAD")


def main_worktree(root: str | Path) -> Path | None:
    """The main worktree's folder where ``root`` is in a linked one (``git worktree add``), else None: refs
    are shared between worktrees, files outside git (such as ``.ditgate/``) are each worktree's own."""
    try:
        own = git(root, "rev-parse", "--path-format=absolute", "--git-dir", timeout=10).strip()
        common = git(root, "rev-parse", "--path-format=absolute", "--git-common-dir", timeout=10).strip()
        if os.path.realpath(own) == os.path.realpath(common):
            return None
        listing = git(root, "worktree", "list", "--porcelain", timeout=10)
    except GitError:
        return None
    first = next((line[len("worktree "):] for line in listing.splitlines() if line.startswith("worktree ")), None)
    return Path(first) if first else None


def commit_id(root: str | Path | None = None) -> str | None:
    """The commit measured: ``$DITGATE_COMMIT`` when set, else the checked-out commit (with ``-dirty`` when
    the tree has changes), else None outside git."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        commit = git(root, "rev-parse", "HEAD", timeout=10).strip()
        changes = git(root, "status", "--porcelain", "--untracked-files=no", timeout=10, check=False)
    except GitError:
        return None
    return commit + ("-dirty" if changes.strip() else "")


def short(commit: str | None) -> str | None:
    return commit[:12] if commit else None


def is_ancestor(root: str | Path, ancestor: str, descendant: str = "HEAD") -> bool:
    try:
        git(root, "merge-base", "--is-ancestor", ancestor, descendant)
        return True
    except GitError:
        return False


#: ``git -c`` settings of every call that reads the working tree's state: a file system monitor (a hook the
#: user configures) answers for git without git looking at the files
_UNMONITORED = ("-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false")


def _paths(out: str) -> list[str]:
    """The paths of a ``-z`` listing (NUL-separated, never quoted: a name such as ``ümlaut.py`` stays itself)."""
    return [path for path in out.split("\0") if path]


def changed_since(root: str | Path, commit: str) -> list[str]:
    """Every path that differs between ``commit`` and the working tree: committed, staged, unstaged and
    untracked (files git ignores are the lock's business, not scope's), submodules included whatever the
    user's ``diff.ignoreSubmodules`` or ``.gitmodules`` says. Paths are read with ``-z``: without it git quotes
    a non-ASCII name (``"candidate/\\303\\274mlaut.py"``), which then matches no mutable path."""
    changed = set(_paths(git(root, *_UNMONITORED, "diff", "--name-only", "-z", "--no-renames",
                             "--ignore-submodules=none", commit)))
    changed.update(_paths(git(root, *_UNMONITORED, "ls-files", "-z", "--others", "--exclude-standard")))
    return sorted(changed)


def changed_between(root: str | Path, old: str, new: str) -> list[str]:
    """Every path that differs between the commits ``old`` and ``new``, sorted."""
    return sorted(set(_paths(git(root, "diff", "--name-only", "-z", "--no-renames", "--ignore-submodules=none",
                                 old, new))))


def distance(root: str | Path, ancestor: str, descendant: str) -> int:
    """How many commits ``descendant`` is past ``ancestor`` (``git rev-list --count``)."""
    return int(git(root, "rev-list", "--count", f"{ancestor}..{descendant}").strip() or 0)


def dirty(root: str | Path) -> bool:
    return bool(git(root, "status", "--porcelain").strip())


def uncommitted(root: str | Path) -> list[str]:
    """Every path whose working-tree state is not its committed state: staged, unstaged, untracked (files git
    ignores are not listed), relative to the repository's top level, sorted."""
    out = git(root, *_UNMONITORED, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
              "--ignore-submodules=none")
    return sorted({entry[3:] for entry in out.split("\0") if len(entry) > 3})


def toplevel(root: str | Path) -> Path:
    """The repository's top folder (the paths git lists are relative to it)."""
    return Path(git(root, "rev-parse", "--show-toplevel", timeout=30).strip())


def _object_id(data: bytes, kind: str, algorithm: str) -> str:
    import hashlib

    return hashlib.new(algorithm, f"{kind} {len(data)}\0".encode() + data).hexdigest()


def unlike_head(root: str | Path) -> list[str]:
    """Every path HEAD tracks whose working-tree state is not HEAD's, found by hashing the bytes, not by asking
    ``git status``: a file marked ``--skip-worktree`` or ``--assume-unchanged`` (flags the user sets, which
    ``git status`` and ``git diff`` obey) is listed when its bytes differ from its blob; a symlink when its
    target differs; a submodule when its checked-out commit differs or its own tree has changes. Files are
    read as they are, no clean filter or end-of-line conversion applied (both are the user's settings): a
    file git stores through one reads as changed. Relative to the repository's top level, sorted."""
    top = toplevel(root)
    algorithm = git(root, "rev-parse", "--show-object-format", timeout=30, check=False).strip() or "sha1"
    listing = git(root, "ls-tree", "-r", "-z", "--full-tree", "HEAD")
    changed = []
    for entry in _paths(listing):
        meta, _, path = entry.partition("\t")
        mode, kind, oid = meta.split()
        file = top / path
        try:
            if mode == "120000":
                same = os.path.islink(file) and _object_id(os.fsencode(os.readlink(file)), "blob", algorithm) == oid
            elif mode == "160000":
                same = _submodule_clean(file, oid)
            else:
                same = (not file.is_symlink() and file.is_file()
                        and _object_id(file.read_bytes(), "blob", algorithm) == oid)
        except OSError:
            same = False
        if not same:
            changed.append(path)
    return sorted(changed)


def _submodule_clean(folder: Path, oid: str) -> bool:
    """Whether the submodule at ``folder`` has ``oid`` checked out with nothing changed in it (an absent,
    uninitialised submodule is clean: no file of it can run)."""
    if not (folder / ".git").exists():
        return not any(folder.iterdir()) if folder.is_dir() else not folder.exists()
    if head(folder) != oid:
        return False
    return not uncommitted(folder) and not unlike_head(folder)


def untracked(root: str | Path) -> set[str]:
    """Untracked files git does not ignore, relative to ``root``."""
    return set(_paths(git(root, *_UNMONITORED, "ls-files", "-z", "--others", "--exclude-standard")))


def ignored(root: str | Path, paths: list[str]) -> list[str]:
    """Files and folders (a folder ends in ``/``) that git ignores under ``paths`` (pathspecs relative to
    ``root``), sorted; none when ``paths`` is empty."""
    if not paths:
        return []
    out = git(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory", "--", *paths)
    return sorted(line for line in out.split("\0") if line)


def work_tree_problem(root: str | Path) -> str | None:
    """Why ``root`` cannot hold a commit (None when it can): not inside a git working tree, or git is missing."""
    try:
        inside = git(root, "rev-parse", "--is-inside-work-tree", timeout=30, check=False).strip()
    except GitError as exc:
        return f"git cannot run here ({exc})"
    if inside != "true":
        return f"{root} is not inside a git working tree (run `git init` and commit the project first)"
    return None


#: files in the git folder that say an operation is half-done, and how to finish or leave it
_IN_PROGRESS = (("MERGE_HEAD", "a merge", "git merge --continue or git merge --abort"),
                ("rebase-merge", "a rebase", "git rebase --continue or git rebase --abort"),
                ("rebase-apply", "a rebase or git am", "git rebase --continue or git rebase --abort"),
                ("CHERRY_PICK_HEAD", "a cherry-pick", "git cherry-pick --continue or git cherry-pick --abort"),
                ("REVERT_HEAD", "a revert", "git revert --continue or git revert --abort"),
                ("BISECT_LOG", "a bisect", "git bisect reset"))


def branch_problem(root: str | Path) -> str | None:
    """Why a commit made in ``root`` now would not be a branch's next commit (None when it would): a merge, rebase,
    cherry-pick, revert or bisect is half-done, another git process holds the index (committing would finish it with whatever the tree holds, conflict
    markers included), or HEAD is detached (the commit would belong to no branch, and git's garbage collection
    would delete it once HEAD moves on)."""
    def path(name: str) -> Path:
        return Path(root, git(root, "rev-parse", "--git-path", name, timeout=30).strip())

    def exists(name: str) -> bool:
        return path(name).exists()

    for name, what, remedy in _IN_PROGRESS:
        if exists(name):
            return f"{what} is in progress in {root}: finish or abandon it first ({remedy})"
    if exists("index.lock"):
        return (f"another git process is using {root} ({path('index.lock')} exists): wait for it to end, or, if none "
                "runs (one was killed), remove that file")
    if git(root, "symbolic-ref", "-q", "HEAD", timeout=30, check=False).strip() == "":
        return (f"HEAD is detached in {root}: a commit there belongs to no branch (git deletes it in time once HEAD "
                "moves on); check out a branch first (git checkout -b autoresearch/<tag>)")
    return None


def identity_problem(root: str | Path) -> str | None:
    """Why a commit in ``root`` would fail for want of an author or committer (None when git knows both):
    ``git var`` asks exactly what ``git commit`` would."""
    for what in ("GIT_AUTHOR_IDENT", "GIT_COMMITTER_IDENT"):
        try:
            git(root, "var", what, timeout=30)
        except GitError as exc:
            detail = str(exc).splitlines()[-1] if str(exc) else what
            return (f"git does not know who commits here ({what}: {detail}); set it with "
                    "`git config user.name \"...\"` and `git config user.email ...` (or GIT_AUTHOR_NAME/EMAIL and "
                    "GIT_COMMITTER_NAME/EMAIL)")
    return None


def write_tree(root: str | Path) -> str:
    """The tree object of the index as it is now (to put the index back with :func:`read_tree`)."""
    return git(root, "write-tree").strip()


def read_tree(root: str | Path, tree: str) -> None:
    """Make the index exactly ``tree`` (the working tree is not touched)."""
    git(root, "read-tree", tree)


def move_head(root: str | Path, commit: str | None) -> None:
    """Point the current branch at ``commit`` without touching the index or the working tree (None: back to an
    unborn branch, as before a repository's first commit)."""
    if commit is None:
        git(root, "update-ref", "-d", "HEAD")
    else:
        git(root, "update-ref", "HEAD", commit)


def delete_ref(root: str | Path, ref: str) -> None:
    git(root, "update-ref", "-d", ref)


def commit_all(root: str | Path, message: str) -> str:
    """``git add -A`` and commit (empty allowed); the new commit id."""
    git(root, "add", "-A")
    git(root, "commit", "-q", "--allow-empty", "--no-verify", "-m", message)
    commit = head(root)
    if commit is None:
        raise GitError("no HEAD after committing")
    return commit


def read_blob_ref(root: str | Path, ref: str) -> str | None:
    """The text of the blob a ref points at, or None when the ref does not exist."""
    try:
        return git(root, "cat-file", "blob", ref)
    except GitError:
        return None


def write_blob_ref(root: str | Path, ref: str, text: str) -> None:
    """Store ``text`` as a blob and point ``ref`` at it (outside every branch: ``git reset`` keeps it)."""
    blob = git(root, "hash-object", "-w", "--stdin", stdin=text).strip()
    git(root, "update-ref", ref, blob)


def ref_lock(root: str | Path, ref: str) -> Path:
    """The file git creates beside ``ref`` while it moves it (``<ref>.lock``): one left by a killed git process
    makes every later update of the ref fail."""
    return Path(root, git(root, "rev-parse", "--git-path", f"{ref}.lock", timeout=30).strip())


def show(root: str | Path, commit: str, path: str) -> str | None:
    """The text of ``path`` at ``commit``, or None when it does not exist there."""
    try:
        return git(root, "show", f"{commit}:{path}")
    except GitError:
        return None


@contextlib.contextmanager
def read_only_checkout(root: str | Path, commit: str, parent: str | Path) -> Iterator[Path]:
    """A checkout of ``commit`` in a new folder under ``parent`` (a detached ``git worktree``), its files made
    read-only, removed with its worktree record afterwards: the lane best's code, as committed, for the judge's
    comparator process."""
    folder = Path(tempfile.mkdtemp(prefix="best-", dir=parent)) / "tree"
    git(root, "worktree", "add", "--detach", "--quiet", str(folder), commit, timeout=600)
    try:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o222)
        yield folder
    finally:
        for path in folder.rglob("*"):
            if not path.is_symlink():
                try:
                    path.chmod(path.stat().st_mode | 0o200)
                except OSError:
                    pass
        git(root, "worktree", "remove", "--force", str(folder), check=False)
        git(root, "worktree", "prune", check=False)
        shutil.rmtree(folder.parent, ignore_errors=True)
