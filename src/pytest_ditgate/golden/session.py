"""One run's golden bookkeeping: lookups with the fallback chain, queued writes, usage for orphans.

Goldens are never written while a test runs: ``freeze``/``refreeze`` queue writes, and :meth:`flush` writes
them when the test ends (the ``golden`` fixture's teardown, so that a write refused or failed errors that
test), merging into the manifest on disk under its file lock (so pytest-xdist workers, which each flush their
own queue, never lose each other's entries); :meth:`finish` writes what is left at the end of the run. In
``check`` mode nothing is written.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from pytest_ditgate.arguments import clip, describe
from pytest_ditgate.errors import DitgateUsageError, GateFailure
from pytest_ditgate.fsutil import lock_for
from pytest_ditgate.golden.comparator import Comparison, TensorComparator
from pytest_ditgate.golden.frozen_with import disagreement as metadata_disagreement
from pytest_ditgate.golden.keys import KeyStep, fallback_chain, is_machine_key, validate_key
from pytest_ditgate.golden.manifest import GoldenEntry, Manifest, ManifestError
from pytest_ditgate.golden.names import match_names
from pytest_ditgate.golden.quality_inputs import PROVENANCE_KEY, disagreement, frozen_record, quality_record
from pytest_ditgate.golden.report import shown_names
from pytest_ditgate.golden.store import LINK_HINT, GoldenIntegrityError, GoldenStore, sha256_bytes, validate_name

if TYPE_CHECKING:
    import torch

MODES = ("check", "freeze", "refreeze")
MACHINE_HINT = ("bitwise claims are judged only against goldens frozen on this machine: run `ditgate baseline` "
                "(or pytest --ditgate --ditgate-freeze) here first")
FREEZE_HINT = "run pytest --ditgate --ditgate-freeze to create it"


@dataclass(frozen=True, repr=False)
class GoldenHit:
    """A golden found for a lookup: its tensors, the key used and the tolerance scale that goes with it.
    ``source`` says where it came from when not the store (a golden frozen earlier in this run)."""

    name: str
    tensors: dict[str, "torch.Tensor"]
    requested_key: str
    step: KeyStep
    entry: GoldenEntry
    source: str = ""

    def __repr__(self) -> str:  # printed by a test: names and shapes, never the values
        return f"<GoldenHit {self.describe()}: {_tensor_summary(self.tensors)}>"

    @property
    def key_used(self) -> str:
        return self.step.key

    @property
    def fallback(self) -> bool:
        return self.step.fallback

    @property
    def tolerance_scale(self) -> float:
        return self.step.tolerance_scale

    def describe(self) -> str:
        if self.source:
            return f"golden {self.name!r} for {self.key_used} ({self.source})"
        if not self.fallback:
            return f"golden {self.name!r} for {self.key_used}"
        return (f"golden {self.name!r} for {self.requested_key} via fallback {self.key_used} "
                f"({self.step.rule}, tolerance x{self.tolerance_scale:g})")


@dataclass(frozen=True, repr=False)
class GoldenResult:
    """Outcome of :meth:`Golden.check`: ``matched``, ``written`` (freeze) or ``overwritten`` (refreeze)."""

    name: str
    status: str
    key: str
    hit: GoldenHit | None = None
    comparison: Any = None
    not_compared: tuple[str, ...] = ()  # optional golden tensors the candidate did not produce

    @property
    def key_used(self) -> str:
        return self.hit.key_used if self.hit else self.key

    @property
    def fallback(self) -> bool:
        return bool(self.hit and self.hit.fallback)

    @property
    def tolerance_scale(self) -> float:
        return self.hit.tolerance_scale if self.hit else 1.0

    def __repr__(self) -> str:  # ``print(golden.check(...))``: one short line, never the tensors' values
        parts = [f"{self.status}", f"key {self.key_used}"]
        if self.fallback:
            parts.append(f"via fallback, tolerance x{self.tolerance_scale:g}")
        if self.comparison is not None and hasattr(self.comparison, "lines"):
            parts.append(f"{len(self.comparison.lines())} tensor(s) compared")
        if self.not_compared:
            parts.append(f"not compared: {shown_names(self.not_compared)}")
        return f"<GoldenResult {self.name!r}: {', '.join(parts)}>"


def _tensor_summary(tensors: Mapping[str, Any]) -> str:
    """``{'x': float32[4, 8], ...}``: each tensor by dtype and shape (the first eight)."""
    from pytest_ditgate.dtypes import dtype_name

    shown = [f"{name!r}: {dtype_name(t.dtype)}{list(t.shape)}" for name, t in list(tensors.items())[:8]]
    return "{" + ", ".join(shown) + (", ..." if len(tensors) > 8 else "") + "}"


@dataclass
class PendingWrite:
    entry: GoldenEntry
    data: bytes
    overwrite: bool


@dataclass
class GoldenSession:
    """Mode, store and the run's record of lookups and queued writes."""

    store: GoldenStore
    mode: str = "check"
    provenance: Callable[[], dict[str, Any]] = dict
    pending: dict[str, PendingWrite] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    fallbacks: list[tuple[str, str, str, str]] = field(default_factory=list)  # nodeid, name, requested, used
    not_compared: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # nodeid, name, tensors
    written: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)
    write_errors: list[str] = field(default_factory=list)
    #: goldens this run wrote: a later check of the same name compares with them (refreeze never writes twice)
    frozen: dict[str, PendingWrite] = field(default_factory=dict)
    _manifest: Manifest | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"golden mode must be one of {MODES}, got {self.mode!r}")

    def snapshot(self) -> None:
        """Read the manifest now, at the start of a freeze run: the run's view of the store is the store as the
        run found it plus what it wrote, so that a name another worker froze meanwhile meets this run's value at
        the flush, which names both tests. A corrupt manifest is left for :meth:`manifest` to report."""
        try:
            self.manifest()
        except GateFailure:
            pass

    def manifest(self) -> Manifest:
        """The manifest as read at first use (:meth:`snapshot`), with what this run wrote; read again when a
        lookup finds a golden replaced since (a corrupt one fails every golden test, naming the file)."""
        __tracebackhide__ = True
        if self._manifest is None:
            try:
                self._manifest = self.store.load_manifest()
            except ManifestError as exc:
                raise GateFailure("golden_integrity", str(exc)) from None
        return self._manifest

    # -- lookups ---------------------------------------------------------------------------------
    def lookup(self, name: str, key: str, *, nodeid: str = "") -> GoldenHit:
        """Read the first golden along the fallback chain of ``key``; fail naming what was tried."""
        __tracebackhide__ = True
        validate_name(name)
        self.used.add(name)
        manifest = self.manifest()
        chain = fallback_chain(key, manifest.keys_for(name))
        for step in chain:
            entry = manifest.get(name, step.key)
            if entry is None:
                continue
            current, tensors = self.store.read_current(entry)
            if current != entry:  # a concurrent freeze replaced it since this run read the manifest
                self._manifest = None
            hit = GoldenHit(name, tensors, key, step, current)
            if hit.fallback:
                self.fallbacks.append((nodeid, name, key, step.key))
            return hit
        if is_machine_key(key):
            raise GateFailure("golden_missing", f"no golden {name!r} for this machine ({key}) in "
                                                f"{self.store.manifest_path}; {MACHINE_HINT}")
        tried = ", ".join(step.key for step in chain)
        untracked = self.store.location(name, key)
        extra = f" ({untracked} exists but is not in the manifest)" if untracked.exists() else ""
        raise GateFailure("golden_missing", f"no golden {name!r} for {key} (tried {tried}) in "
                                            f"{self.store.manifest_path}{extra}; {FREEZE_HINT}")

    def check(self, name: str, tensors: Mapping[str, "torch.Tensor"], key: str, *,
              compare: Callable[[Mapping[str, Any], GoldenHit], Any] | None = None,
              nodeid: str = "", metadata: Mapping[str, Any] | None = None,
              optional: tuple[str, ...] = (), quality_inputs: Mapping[str, Any] | None = None,
              frozen_with: tuple[str, ...] = (), allow_dtype_change: bool = False) -> GoldenResult:
        """Compare ``tensors`` with the golden ``name`` (or queue it, in freeze/refreeze mode).

        ``quality_inputs`` (``kinds``, ``labels``: what ``compare`` judges with beyond the tensors) are frozen
        with the golden, so that a judge in another process judges a candidate's tensors as ``compare`` does;
        a check whose inputs differ from the frozen ones fails (``golden_stale``): refreeze. So does a check
        whose ``metadata`` differs from the frozen entry's at a key named in ``frozen_with`` (weights, seed).

        Golden tensors matching an ``optional`` glob may be absent from the candidate (diagnostics it
        cannot produce); they are listed in the result's ``not_compared``. Every other golden tensor is
        required, and a candidate tensor the golden lacks fails too: no silent drops.

        A golden another check of this run queued or wrote (two tests, or one test twice, freezing one name) is
        not queued again: the check compares with it, as it would with the stored golden in a later run.
        ``allow_dtype_change``: the default comparator judges a candidate whose dtype differs from the
        golden's at the coarser dtype's limits; without it a dtype change fails.
        """
        __tracebackhide__ = True
        validate_name(name)
        validate_key(key)
        if not tensors:
            raise ValueError(f"golden {name!r}: no tensors to check")
        unnamed = [k for k in frozen_with if k not in (metadata or {})]
        if unnamed:
            raise ValueError(f"golden {name!r}: frozen_with names {', '.join(unnamed)}, which metadata does not give")
        self.used.add(name)
        ident = f"{key}/{name}"
        pending = self.pending.get(ident) or self.frozen.get(ident)
        exists = pending is not None or self.manifest().get(name, key) is not None
        if pending is None and (self.mode == "refreeze" or (self.mode == "freeze" and not exists)):
            self._queue(name, key, tensors, nodeid=nodeid, metadata=metadata, overwrite=exists,
                        quality=quality_record(quality_inputs))
            return GoldenResult(name, "overwritten" if exists else "written", key)
        hit = (self._queued_hit(pending, key, written=ident not in self.pending) if pending is not None
               else self.lookup(name, key, nodeid=nodeid))
        # the tensor names are checked here, for every comparator; the comparator judges the shared ones
        matched = match_names(hit.tensors, tensors, optional)
        names, not_compared = matched.failures(), matched.not_compared
        shared = {n: tensors[n] for n in matched.shared}
        stale = _stale_inputs(hit, metadata or {}, frozen_with, quality_inputs, shared)
        if stale:
            raise GateFailure("golden_stale", f"{hit.describe()} was frozen for other inputs than this test gives "
                                              f"({stale}): it is not this test's baseline, and a judge would judge by "
                                              "the frozen ones; refreeze it (pytest --ditgate --ditgate-refreeze) "
                                              "if the change is meant")
        comparison = None
        if shared:
            shared_hit = replace(hit, tensors={n: t for n, t in hit.tensors.items() if n in shared})
            comparison = _compared(compare, shared, shared_hit, name, allow_dtype_change)
        if names or not bool(getattr(comparison, "passed", False)):
            lines = [] if comparison is None else _comparison_lines(comparison)
            if not_compared:
                lines.append(_not_compared_line(not_compared))
            raise GateFailure("golden_mismatch", f"{hit.describe()} does not match:\n  " + "\n  ".join(lines + names),
                              report=comparison)
        if not_compared:  # a failed check says so in its message; the summary lists the passed ones
            self.not_compared.append((nodeid, name, not_compared))
        return GoldenResult(name, "matched", key, hit, comparison, not_compared)

    def _queued_hit(self, pending: PendingWrite, key: str, *, written: bool) -> GoldenHit:
        """The golden an earlier check of this run froze (queued, or ``written`` when its test ended), as a
        lookup finds it once written."""
        entry = pending.entry
        who = entry.provenance.get("test") or "an earlier check"
        state = "" if written else ", not yet written"
        return GoldenHit(entry.name, self.store.serializer.deserialize(pending.data), key, KeyStep(key, 1.0, "exact"),
                         entry, source=f"frozen earlier in this run by {who}{state}")

    # -- writes ----------------------------------------------------------------------------------
    def _queue(self, name: str, key: str, tensors: Mapping[str, Any], *, nodeid: str,
               metadata: Mapping[str, Any] | None, overwrite: bool, quality: Mapping[str, Any]) -> None:
        """Queue one golden for :meth:`finish`. Under ``--ditgate-freeze`` a file already on disk that the
        manifest does not list is never replaced: the test fails naming it (it may be someone's work)."""
        __tracebackhide__ = True
        path = self.store.location(name, key)
        escape = self.store.escape(path)
        if escape is not None:
            raise GateFailure("golden_integrity", f"golden {name!r} for {key} was not frozen: {escape}, and goldens "
                                                  "are written only inside the store (a read refuses a file "
                                                  f"elsewhere); {LINK_HINT}")
        if path.is_dir():
            raise GateFailure("golden_integrity", f"golden {name!r} for {key}: {path} is a folder, where its golden "
                                                  "file goes; move it away")
        if self.mode == "freeze" and not overwrite and (path.exists() or path.is_symlink()) \
                and not self._listed_now(name, key):
            raise GateFailure("golden_untracked", _untracked_message(path, self.store.manifest_path))
        twin = _case_twin(name, key, [*self.manifest().entries, *self.pending, *self.frozen])
        if twin is not None:
            raise GateFailure("golden_integrity", f"golden {name!r} for {key} was not frozen: {twin}")
        nonfinite = _nonfinite(tensors)
        if nonfinite:
            raise GateFailure("golden_nonfinite", f"golden {name!r} for {key} was not frozen: {nonfinite}; a golden "
                                                  "that is not finite can never be matched (a candidate's NaN or Inf "
                                                  "always fails): fix the output, or leave that tensor out")
        serializer = self.store.serializer
        data = serializer.serialize(tensors, metadata={"name": name, "key": key})
        provenance = dict(self.provenance())
        provenance.update(test=nodeid, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          metadata=dict(metadata or {}))
        if quality:
            provenance[PROVENANCE_KEY] = dict(quality)
        entry = GoldenEntry(name=name, key=key, file=self.store.relative(name, key), sha256=sha256_bytes(data),
                            size=len(data), tensors=serializer.describe(tensors), provenance=provenance)
        self.pending[entry.id] = PendingWrite(entry, data, overwrite)

    def _listed_now(self, name: str, key: str) -> bool:
        """Whether the manifest lists the golden now, read under its lock: a file another run or xdist worker froze
        since this run's snapshot is listed once its flush lets the lock go (the flush then keeps the first value,
        or names both tests when they differ), where a file nobody froze is not."""
        try:
            with lock_for(self.store.manifest_path):
                return self.store.load_manifest().get(name, key) is not None
        except (OSError, ManifestError):
            return False

    def flush(self) -> list[str]:
        """Write what the checks of the test that just ended queued: the ``golden`` fixture calls it when its
        test ends, so that a golden that could not be written (another worker froze another value first, a
        read-only store) fails that test. The errors of this flush, also kept in ``write_errors``."""
        if self.mode == "check" or not self.pending:
            return []
        before = len(self.write_errors)
        self.finish()
        return self.write_errors[before:]

    def finish(self) -> None:
        """Flush queued writes (:meth:`flush` after each test; at the end of the run, what is left): files
        first, then the manifest merged under its lock. Never raises on I/O: errors go to ``write_errors``.

        Under the lock, temporary files of killed writes are removed first. ``--ditgate-freeze`` never
        replaces a file it did not write in this run: a golden another run froze meanwhile is kept (a
        different value is an error naming both), and so is a file the manifest does not list.
        """
        if self.mode == "check" or (not self.pending and not self.store.root.exists()):
            return  # nothing to write, and no store whose killed writes need cleaning: create nothing
        from pytest_ditgate.fsutil import remove_stale_temps

        from pytest_ditgate.golden import journal

        try:
            with lock_for(self.store.manifest_path):
                remove_stale_temps(self.store.root)
                manifest = journal.settle(self.store)  # complete a flush an earlier run left half done
                if not self.pending:
                    return
                writes = []
                for ident, write in sorted(self.pending.items()):
                    refusal = self._refusal(manifest, write)
                    if refusal is None:
                        writes.append((ident, write))
                    elif refusal:
                        self.write_errors.append(refusal)
                if not writes:
                    return
                # a run killed from here on leaves files the journal names: the next reader counts those
                # written whole, the next flush completes the manifest (``journal.py``)
                journal.begin(self.store.root, [write.entry for _, write in writes])
                for ident, write in writes:
                    self.store.write(write.entry.file, write.data)
                    manifest.put(write.entry)
                manifest.save()
                journal.end(self.store.root)
                for ident, write in writes:
                    (self.overwritten if write.overwrite else self.written).append(ident)
                    self.frozen[ident] = write
                    if self._manifest is not None:
                        self._manifest.put(write.entry)
        except (OSError, ManifestError, GoldenIntegrityError) as exc:
            self.write_errors.append(f"could not write goldens to {self.store.root}: {exc}; make the golden folder "
                                     "writable (its key folders real folders inside it), then freeze again")
        finally:
            self.pending.clear()

    def _refusal(self, manifest: Manifest, write: PendingWrite) -> str | None:
        """Why a queued freeze must not be written (``""``: silently skip, the same golden is already there),
        or None to write it. Refreeze always writes."""
        entry = write.entry
        escape = self.store.escape(self.store.root / entry.file)
        if escape is not None:  # a link made since the check queued it
            return f"golden {entry.id!r} was not written: {escape}; {LINK_HINT}"
        twin = _case_twin(entry.name, entry.key, manifest.entries)
        if twin is not None:  # another run or worker froze it since this check was queued
            return f"golden {entry.id!r} was not written: {twin}"
        if self.mode != "freeze" or write.overwrite:
            return None
        current = manifest.get(entry.name, entry.key)
        if current is not None:
            if current.sha256 == entry.sha256 or self._same_tensors(current, write.data):
                return ""  # a concurrent run froze the very same values
            return (f"golden {entry.id!r} was frozen by another run or worker while this one ran "
                    f"({current.provenance.get('test') or '?'}: {current.provenance.get('command', '?')}, "
                    f"{current.provenance.get('created', '?')}), and {entry.provenance.get('test') or 'this run'} froze "
                    "a different value for it: kept the first, did not write this one. Tests that freeze one golden "
                    "name must produce one value; give each its own name, or re-run to compare against the one kept")
        path = self.store.root / entry.file
        if path.exists() or path.is_symlink():
            return _untracked_message(path, self.store.manifest_path)
        return None


    def _same_tensors(self, current: GoldenEntry, data: bytes) -> bool:
        """Whether the golden on disk holds exactly the tensors in ``data`` (the file's header may order its
        metadata differently from run to run, so equal values need not mean equal bytes)."""
        try:
            theirs = self.store.serializer.deserialize((self.store.root / current.file).read_bytes())
        except Exception:  # unreadable: not the same
            return False
        ours = self.store.serializer.deserialize(data)
        return theirs.keys() == ours.keys() and all(
            theirs[n].dtype == ours[n].dtype and theirs[n].shape == ours[n].shape
            and theirs[n].view(-1).view(dtype=_bytes_dtype()).equal(ours[n].view(-1).view(dtype=_bytes_dtype()))
            for n in ours)


def _nonfinite(tensors: Mapping[str, Any]) -> str | None:
    """``tensor 'x' holds 3 NaN/Inf value(s), the first at index (0, 2)`` for the first tensor that is not
    finite (None when all are)."""
    import torch

    for tname, tensor in tensors.items():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        values = tensor.detach()
        if values.dtype.itemsize == 1 and values.is_floating_point():  # fp8: no isfinite of its own
            values = values.float()
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            index = tuple(int(i) for i in bad.nonzero()[0].tolist())
            return f"tensor {tname!r} holds {int(bad.sum())} NaN/Inf value(s), the first at index {index}"
    return None


def _compared(compare: Callable[[Mapping[str, Any], GoldenHit], Any] | None, shared: Mapping[str, Any],
              hit: GoldenHit, name: str, allow_dtype_change: bool = False) -> Any:
    """The comparator's result; a user's comparator that raises is reported as its own error, and one that
    returns no boolean ``passed`` is a usage error (a bare bool would otherwise always read as a mismatch)."""
    if compare is None:
        return TensorComparator(allow_dtype_change=allow_dtype_change)(shared, hit)
    from pytest_ditgate.arguments import callable_name, raised_by

    try:
        result = compare(shared, hit)
    except (GateFailure, DitgateUsageError):  # a gate inside the comparator (quality_gate.check) said no
        raise
    except Exception as exc:
        raised_by(exc, f"the comparator `{callable_name(compare)}` of golden {name!r}")
        raise
    if getattr(result, "passed", None) is None:
        raise DitgateUsageError(f"golden {name!r}: compare must return a result with a boolean passed (and "
                                f"optionally lines()), got {describe(result)}")
    return result


def _bytes_dtype() -> Any:
    import torch

    return torch.uint8


def _case_twin(name: str, key: str, ids: Any) -> str | None:
    """Why ``name`` cannot be frozen under ``key`` beside the goldens ``ids`` (``<key>/<name>``; None when it can): one
    of them differs from it only in case, and on a case-insensitive disk (macOS, Windows) the two are one file,
    each freeze overwriting the other's golden."""
    ident = f"{key}/{name}"
    twin = next((other for other in ids if other != ident and other.lower() == ident.lower()), None)
    if twin is None:
        return None
    return (f"the golden {twin!r} differs from it only in case, and on a case-insensitive disk (macOS, Windows) both "
            "are one file; give the two goldens names that differ otherwise")


def _untracked_message(path: Any, manifest_path: Any) -> str:
    return (f"golden file {path} exists but {manifest_path} does not list it; --ditgate-freeze never replaces a "
            "file it did not write: move it away, or overwrite it on purpose with --ditgate-refreeze")


def _stale_inputs(hit: GoldenHit, metadata: Mapping[str, Any], frozen_with: tuple[str, ...],
                  quality_inputs: Mapping[str, Any] | None, judged: Mapping[str, Any]) -> str | None:
    """Every input this check gives otherwise than the golden was frozen with (None when none does): the
    ``frozen_with`` metadata keys, and the quality inputs of the tensors ``judged``."""
    frozen = hit.entry.provenance.get("metadata")
    reasons = (metadata_disagreement(metadata, frozen if isinstance(frozen, Mapping) else {}, frozen_with),
               disagreement(quality_record(quality_inputs), frozen_record(hit.entry.provenance), judged))
    return "; ".join(reason for reason in reasons if reason) or None


def _comparison_lines(comparison: Any) -> list[str]:
    """A failed comparison as message lines: the default comparator's whole (each is bounded and ends with its
    remedy), another comparator's clipped, one without ``lines()`` described by type."""
    if isinstance(comparison, Comparison):
        return comparison.lines()
    if hasattr(comparison, "lines"):
        return [clip(line) for line in comparison.lines()]
    return [describe(comparison)]


def _not_compared_line(names: tuple[str, ...]) -> str:
    """One line naming the optional golden tensors a candidate did not produce (the first few, and a count)."""
    return f"not compared (optional, not produced by the candidate): {shown_names(names)}"

