"""The judge times a lane itself: two server processes, rounds on its own clock, audits of what was timed.

The **candidate** server runs in the candidate's tree and builds each region's ``candidate``; the
**comparator** runs in a read-only checkout of the lane best's commit and builds the best's ``candidate`` and
the ``baseline`` (``timing_server.py``). Neither can see the other's memory, and while one is timed the other's
whole process group is stopped (SIGSTOP), so a candidate cannot slow its comparators down from its own process,
and nothing the candidate's process writes becomes a timing.

Each round draws a fresh key and a seed per call; every implementation runs the same calls on the same inputs, in
a random order, each timed from the judge's ``go`` to the server's ``done``. A call's seed is sent only after the
previous call's commitment arrived, so a server never holds the inputs of a call it has not reached. After the rounds, the judge audits
``audits`` of them, chosen at random only then: each server shows that round's outputs, which must match the
commitments it sent (``commitment.py``) and, for the candidate and the best, the baseline's outputs for the
same inputs within the region's ``audit_rel_l2`` (or the bound its ``audit_by_class`` gives the candidate's judged
class). Where that bound is None (the class changes the outputs by design: fewer sampling steps), each of the
candidate and the best is audited instead against a fresh, untimed process of its own tree that recomputes the
audited rounds' calls from the same seeds. A server whose thread count grew after its warm-up, whose
timers or synchronisation were replaced, or whose answers left the sequence is refused.

The ratios come from the rounds by the paired bootstrap (``bench.stats``), with rounds added (up to the region's
``max_rounds``) while the interval is wider than the lane's noise floor can resolve.
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pytest_ditgate.verdict.objective import LANE_BEST_LABEL as BEST_LABEL
from pytest_ditgate.verdict.outcome import Category

#: seconds a server may take to answer (a build may compile; a round is sized to tens of milliseconds)
BUILD_TIMEOUT_S = 900.0
ROUND_TIMEOUT_S = 120.0
#: rounds added at a time while the interval is too wide
EXTRA_ROUNDS = 8
#: the rounds' statistic: this quantile of each side's per-call times (a round slowed by something else on the
#: machine reads slower, never faster: a low quantile is the least disturbed reading)
QUANTILE = 0.2
#: a gain timed on the host (a CPU region) must be at least this large: two processes running the same code
#: read up to 0.89..1.03 apart against each other on a loaded two-core host
HOST_GAIN_FLOOR = 0.15


class ServerFailed(RuntimeError):
    """A server crashed, broke the protocol or timed out (the reason says which)."""


@dataclass(eq=False)
class Endpoint:
    """One server process: its pipes, its process group, and the requests it has answered."""

    label: str
    process: subprocess.Popen
    to_server: int
    from_server: int
    seq: int = 0
    buffer: bytes = b""
    stopped: bool = False
    closed: bool = False
    #: the answer to the last ``build`` (its device, or why it skipped)
    last_build: dict[str, Any] = field(default_factory=dict)

    def request(self, timeout: float = ROUND_TIMEOUT_S, **message: Any) -> dict[str, Any]:
        """Send one request and read its answer (ServerFailed on a crash, a timeout or a broken sequence)."""
        self.send(**message)
        return self.answer(timeout)

    def send(self, **message: Any) -> None:
        payload = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        os.write(self.to_server, payload)
        self.seq += 1

    def answer(self, timeout: float = ROUND_TIMEOUT_S) -> dict[str, Any]:
        """The answer to the last request sent."""
        reply = self._line(timeout)
        if reply.get("seq") != self.seq:
            raise ServerFailed(f"the {self.label} server's answer left the sequence (got {reply.get('seq')!r}, "
                               f"expected {self.seq}): something else wrote to its pipe")
        if "refused" in reply:
            raise Refusal(f"the {self.label} server's timed output: {reply['refused']}")
        if "error" in reply:
            raise ServerFailed(f"the {self.label} server failed: {reply['error']}")
        return reply

    def _line(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServerFailed(f"the {self.label} server did not answer within {timeout:.0f} s")
            ready, _, _ = select.select([self.from_server], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_server, 65536)
            if not chunk:
                code = self.process.poll()
                raise ServerFailed(f"the {self.label} server ended (exit {code})")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise ServerFailed(f"the {self.label} server wrote a line that is not a message: {line[:80]!r}") from None

    def stop(self) -> None:
        if not self.stopped:
            os.killpg(self.process.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self) -> None:
        if self.stopped:
            os.killpg(self.process.pid, signal.SIGCONT)
            self.stopped = False

    def close(self) -> None:
        """Say goodbye, then make sure the whole process group is gone (once: its pipes' numbers may be reused)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.cont()
            os.write(self.to_server, b'{"op":"bye"}\n')
            self.process.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        self.process.wait()
        for fd in (self.to_server, self.from_server):
            try:
                os.close(fd)
            except OSError:
                pass


def start_server(label: str, root: Path, timing: Path, impls: list[str], env: dict[str, str],
                 log: Path) -> Endpoint:
    """A server in ``root`` building ``impls`` of the regions of ``timing`` (its own process group)."""
    from pytest_ditgate.experiment.bootstrap import SERVER, command

    judge_read, server_write = os.pipe()
    server_read, judge_write = os.pipe()
    out = log.open("w")
    process = subprocess.Popen(command(SERVER, str(root), str(timing), ",".join(impls), str(server_read),
                                       str(server_write)),
                               cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                               pass_fds=(server_read, server_write), start_new_session=True)
    out.close()
    os.close(server_read)
    os.close(server_write)
    endpoint = Endpoint(label, process, judge_write, judge_read)
    ready = endpoint._line(BUILD_TIMEOUT_S)
    if "error" in ready or not ready.get("ready"):
        endpoint.close()
        raise ServerFailed(f"the {label} server could not start: {ready.get('error', ready)}")
    endpoint.threads_at_start = ready.get("threads")  # type: ignore[attr-defined]
    return endpoint


@dataclass
class RegionTiming:
    """What the judge measured of one region: per implementation, ms per call of each round."""

    name: str
    skipped: str | None = None
    device: str = ""
    calls: int = 0
    samples: dict[str, list[float]] = field(default_factory=dict)
    audited: list[int] = field(default_factory=list)
    #: what the audited rounds were checked against (for the verdict's detail)
    audit: str = ""
    #: per implementation, the host ms per call of its server's untimed warm-up (its work without the protocol)
    warm_ms: dict[str, float] = field(default_factory=dict)

    def round_trip(self) -> tuple[float | None, str | None]:
        """The judge's cost per call beyond the work (the median timed call less the warm-up's), and a note
        where it outweighs the work of both the candidate and the best: every implementation pays it alike, so a
        gain in the work reads less than half its size (an honest 4x cut of a call's work read 0.87 on a loaded
        host whose round trip was several times the work)."""
        extra, works = [], []
        for impl in ("candidate", "best"):
            times, work = self.samples.get(impl) or [], self.warm_ms.get(impl)
            if not times or work is None:
                return None, None
            median = upper_median(times)
            extra.append(max(0.0, median - work))
            works.append(work)
        trip = min(extra)
        if trip <= max(works):
            return trip, None
        return trip, (f"the calls do {min(works):.3g} to {max(works):.3g} ms of work, and the judge's round trip "
                      f"costs about {trip:.3g} ms per call on this host, which every implementation pays: a gain in "
                      "the work reads smaller than it is; give each call more work (larger inputs) for a sharper "
                      "ratio")

    def comparisons(self, arch: str) -> list[dict[str, Any]]:
        """The region's ratios, in the form the objective reads (``evidence.judge_timings``)."""
        out = []
        for other, versus_best in (("baseline", False), ("best", True)):
            a, b = self.samples.get("candidate", []), self.samples.get(other, [])
            if len(a) < 4 or len(a) != len(b):
                continue
            ratio, low, high = quantile_ratio(a, b)
            label = BEST_LABEL if versus_best else "baseline"
            out.append({"name": f"{self.name} (timed by the judge): candidate / {label}", "test": self.name,
                        "ratio": ratio, "ci_low": low, "ci_high": high,
                        "method": f"paired bootstrap of the {QUANTILE:.0%} quantile", "mechanism": "judge",
                        "arch": arch, "device": self.device, "reference_median_ms": upper_median(b),
                        "versus_best": versus_best, "rounds": len(a), "calls_per_round": self.calls})
        return out


def upper_median(values: list[float]) -> float:
    """The middle value (the upper of the two middle ones for an even count), as the records give it."""
    return sorted(values)[len(values) // 2]


def quantile_ratio(a: list[float], b: list[float], *, q: float = QUANTILE, confidence: float = 0.95,
                   resamples: int = 2000) -> tuple[float, float, float]:
    """(ratio, low, high): the ratio of the ``q`` quantiles of two paired series of round times, with a paired
    bootstrap interval (rounds resampled together; a fixed seed, so the same rounds give the same interval)."""
    from pytest_ditgate.bench.stats import quantile

    def ratio(indices: list[int]) -> float:
        return quantile([a[i] for i in indices], q) / quantile([b[i] for i in indices], q)

    n = len(a)
    rng = random.Random(0x5EED)
    values = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return (ratio(list(range(n))), values[int(tail * (resamples - 1))], values[int((1 - tail) * (resamples - 1))])


class LaneTimer:
    """Times every region of a lane on the two servers; problems go to ``problems`` with their category."""

    def __init__(self, candidate: Endpoint, comparator: Endpoint, specs: dict[str, Any], audit_dir: Path,
                 problems: list[tuple[Category, str]], *, floor: float, rng: random.Random | None = None,
                 experiment_class: str = "numerical", auditor: Callable[[str], Endpoint] | None = None) -> None:
        self.servers = {"candidate": candidate, "best": comparator, "baseline": comparator}
        self.experiment_class = experiment_class
        #: starts a fresh, untimed server of ``impl``'s tree (the self-audit of a class the baseline cannot vouch for)
        self.auditor = auditor
        self.specs = specs
        self.audit_dir = audit_dir
        self.problems = problems
        self.floor = floor
        self.rng = rng or random.SystemRandom()
        self.threads: dict[str, int] = {}
        #: (round, impl) -> the commitments its server sent when the round ended
        self._commitments: dict[tuple[int, str], list[str]] = {}

    # -- one implementation, one request -----------------------------------------------------------------
    def _only(self, impl: str) -> Endpoint:
        """The server of ``impl``, running; every other server stopped."""
        server = self.servers[impl]
        for other in set(self.servers.values()):
            if other is not server:
                other.stop()
        server.cont()
        return server

    def _check_idle(self, label: str, server: Endpoint) -> None:
        left = strays({s.process.pid for s in set(self.servers.values())})
        if left:
            raise Refusal(f"a process outside the servers' groups is running beside the rounds: {', '.join(left[:3])}")
        state = server.request(op="idle")
        if state.get("replaced"):
            raise Refusal(f"the {label} server's timing functions were replaced: {', '.join(state['replaced'])}")
        threads = int(state.get("threads") or 0)
        known = self.threads.setdefault(label, threads)
        if threads > known:
            raise Refusal(f"the {label} server started {threads - known} thread(s) after its warm-up: work beside "
                          "the timed calls is not timed")

    def time_region(self, name: str) -> RegionTiming:
        spec = self.specs[name]
        result = RegionTiming(name)
        skips = {}
        pair = (("candidate", self.servers["candidate"]), ("comparator", self.servers["best"]))
        for _, server in pair:  # both build at once (nothing is timed yet)
            server.cont()
            server.send(op="build", region=name)
        for label, server in pair:
            server.last_build = server.answer(BUILD_TIMEOUT_S)
            skips[label] = server.last_build.get("skip")
        if any(skips.values()):
            result.skipped = "; ".join(sorted({str(v) for v in skips.values() if v}))
            return result
        result.device = str(self.servers["candidate"].last_build.get("device", ""))
        warm = {}
        for impl in ("candidate", "best", "baseline"):
            warm[impl] = float(self._only(impl).request(timeout=BUILD_TIMEOUT_S, op="warm", region=name,
                                                        impl=impl, seed=self.rng.getrandbits(62))["ms"])
        for label, server in (("candidate", self.servers["candidate"]), ("comparator", self.servers["best"])):
            server.cont()
            self._check_idle(label, server)  # the thread counts after the warm-up are the reference
        result.warm_ms = dict(warm)
        result.calls = spec.calls or max(1, math.ceil(spec.round_ms / max(max(warm.values()), 1e-3)))
        result.samples = {impl: [] for impl in ("candidate", "best", "baseline")}
        rounds, done = spec.rounds, 0
        keys: list[tuple[list[int], int]] = []
        while done < rounds:
            for _ in range(rounds - done):
                keys.append(self._round(name, result))
            done = rounds
            if done < spec.max_rounds and self._too_wide(result):
                rounds = min(spec.max_rounds, rounds + EXTRA_ROUNDS)
        for server in set(self.servers.values()):
            server.cont()
        result.audited = sorted(self.rng.sample(range(len(keys)), min(spec.audits, len(keys))))
        return result if not result.audited else self._audit(name, spec, result, keys)

    def _round(self, name: str, result: RegionTiming) -> tuple[list[int], int]:
        seeds = [self.rng.getrandbits(62) for _ in range(result.calls)]
        key = self.rng.getrandbits(63)
        order = ["candidate", "best", "baseline"]
        self.rng.shuffle(order)
        for impl in order:
            server = self._only(impl)
            self._check_idle("candidate" if impl == "candidate" else "comparator", server)
            start = time.perf_counter()
            reply = server.request(op="go", region=name, impl=impl, seed=seeds[0], key=key, calls=result.calls)
            for seed in seeds[1:]:  # each call's seed only once the previous call is committed
                reply = server.request(op="next", seed=seed)
            took = time.perf_counter() - start
            commitments = reply.get("done")
            if not isinstance(commitments, list) or len(commitments) != result.calls:
                raise Refusal(f"the {impl} server answered a round without one commitment per call")
            index = len(result.samples[impl])
            result.samples[impl].append(took * 1e3 / result.calls)
            self._commitments[(index, impl)] = [str(c) for c in commitments]
            # every round's outputs go to the judge's folder right away (untimed; a server keeps only its last
            # round): the judge picks the rounds it audits only after all of them ran
            path = self.audit_dir / f"{name}-{index:03d}-{impl}.safetensors"
            server.request(timeout=BUILD_TIMEOUT_S, op="dump", path=str(path), impl=impl)
        return seeds, key

    def _too_wide(self, result: RegionTiming) -> bool:
        ratio, low, high = quantile_ratio(result.samples["candidate"], result.samples["best"], resamples=500)
        return (high - low) / max(ratio, 1e-9) > 2 * max(self.floor, 0.02)

    def _audit(self, name: str, spec: Any, result: RegionTiming, keys: list[tuple[list[int], int]]) -> RegionTiming:
        """Each audited round: the dumped outputs match the commitments, and the candidate's and the best's
        match the baseline's within the region's bound for the judged class (or, where the class has none, a
        fresh process's recomputation of the same calls)."""
        from safetensors.torch import load_file

        from pytest_ditgate.experiment.commitment import commit_call
        from pytest_ditgate.quality.metrics import rel_l2

        auditors: dict[str, Endpoint] = {}
        try:
            return self._audit_rounds(name, spec, result, keys, auditors)
        finally:
            for server in auditors.values():
                server.close()

    def _audit_rounds(self, name: str, spec: Any, result: RegionTiming, keys: list[tuple[list[int], int]],
                      auditors: dict[str, Endpoint]) -> RegionTiming:
        from safetensors.torch import load_file

        from pytest_ditgate.experiment.commitment import commit_call
        from pytest_ditgate.quality.metrics import rel_l2

        for index in result.audited:
            _, key = keys[index]
            shown = {}
            for impl in ("candidate", "best", "baseline"):
                path = self.audit_dir / f"{name}-{index:03d}-{impl}.safetensors"
                try:
                    tensors = load_file(str(path))
                except Exception as exc:  # noqa: BLE001 - a missing or unreadable dump is the server's fault
                    raise Refusal(f"{name}: round {index}: the {impl} server's outputs cannot be read ({exc})") from None
                calls = _by_call(tensors, result.calls)
                for call, outputs in enumerate(calls):
                    if str(commit_call(outputs, key ^ call)) != self._commitments[(index, impl)][call]:
                        raise Refusal(f"{name}: round {index}, call {call}: the {impl} server's outputs are not the "
                                      "ones it committed to when the round ended")
                shown[impl] = calls
            bound = spec.audit_bound(self.experiment_class)
            for impl in ("candidate", "best"):
                if bound is None:
                    reference, what, limit = self._recompute(name, impl, index, keys, result.calls, auditors), \
                        "a fresh process of its own tree", spec.self_audit_rel_l2
                else:
                    reference, what, limit = shown["baseline"], "the baseline's", bound
                for call, (mine, base) in enumerate(zip(shown[impl], reference)):
                    for got, want in zip(mine, base):
                        error = float(rel_l2(got.double(), want.double())) if got.shape == want.shape else math.inf
                        if not math.isfinite(error) or error > limit:
                            raise Refusal(f"{name}: round {index}, call {call}: the {impl}'s timed output differs "
                                          f"from {what} for the same inputs (rel-L2 {error:.3g}, bound {limit}): "
                                          "what was timed is not what the tests judged")
        bound = spec.audit_bound(self.experiment_class)
        result.audit = (f"against the baseline's outputs, rel-L2 <= {bound}" if bound is not None else
                        f"against a fresh process of each tree, rel-L2 <= {spec.self_audit_rel_l2} (a "
                        f"{self.experiment_class} candidate's outputs differ from the baseline's by design)")
        return result

    def _recompute(self, name: str, impl: str, index: int, keys: list[tuple[list[int], int]], calls: int,
                   auditors: dict[str, Endpoint]) -> list[list[Any]]:
        """The audited round's calls run again, untimed, by a fresh server of ``impl``'s tree, from the same
        seeds: what an honest timed process must have produced (one per tree and region, closed before the next
        region is timed)."""
        from safetensors.torch import load_file

        if self.auditor is None:
            raise Refusal(f"{name}: the {self.experiment_class} class has no baseline bound and no auditor")
        if impl not in auditors:
            auditors[impl] = self.auditor(impl)
            built = auditors[impl].request(timeout=BUILD_TIMEOUT_S, op="build", region=name)
            if built.get("skip") or "error" in built:
                raise ServerFailed(f"the {impl} auditor could not build {name}: {built.get('skip') or built['error']}")
        server = auditors[impl]
        seeds, key = keys[index]
        reply = server.request(op="go", region=name, impl=impl, seed=seeds[0], key=key, calls=calls)
        for seed in seeds[1:]:
            if "error" in reply:
                break
            reply = server.request(op="next", seed=seed)
        if "error" in reply:
            raise ServerFailed(f"the {impl} auditor failed: {reply['error']}")
        path = self.audit_dir / f"{name}-{index:03d}-{impl}-auditor.safetensors"
        server.request(timeout=BUILD_TIMEOUT_S, op="dump", path=str(path), impl=impl)
        return _by_call(load_file(str(path)), calls)


class Refusal(RuntimeError):
    """An integrity failure of a timing run (exit 12)."""


def become_subreaper() -> bool:
    """Make the judge the reaper of its descendants (Linux ``PR_SET_CHILD_SUBREAPER``): a process a server starts
    in a session of its own, whose parent then exits, stays the judge's descendant and can be found."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def strays(allowed_groups: set[int]) -> list[str]:
    """The judge's descendants outside ``allowed_groups`` (the servers' process groups), as ``pid (command)``:
    work the timed processes left running beside the rounds, which stopping their groups does not stop."""
    parents: dict[int, int] = {}
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 3 and fields[0] not in ("Z", "X"):  # an ended process waiting to be reaped runs nothing
            parents[int(entry)], groups[int(entry)] = int(fields[1]), int(fields[2])
    me = os.getpid()
    found = []
    for pid in parents:
        ancestor, seen = parents.get(pid), 0
        while ancestor not in (None, 0, 1, me) and seen < 64:
            ancestor, seen = parents.get(ancestor), seen + 1
        if ancestor == me and groups.get(pid) not in allowed_groups and pid != me:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                command = "?"
            found.append(f"{pid} ({command.strip()[:80]})")
    return found


def _by_call(tensors: dict[str, Any], calls: int) -> list[list[Any]]:
    out: list[list[Any]] = [[] for _ in range(calls)]
    for name in sorted(tensors, key=lambda n: tuple(int(p) for p in n.split("."))):
        call, _ = name.split(".")
        if int(call) < calls:
            out[int(call)].append(tensors[name])
    return out


def load_specs(path: Path, root: Path) -> dict[str, Any]:
    """The regions the lane's timing module declares, read in the judge: the module must import nothing of the
    project's mutable code when loaded (its functions run only in the servers)."""
    import importlib.util
    import sys

    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("ditgate_lane_timing_spec", path)
    if spec is None or spec.loader is None:
        raise Refusal(f"cannot read the lane's timing module {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = str(Path(__file__).resolve().parents[1])
    imported = [name for name in set(sys.modules) - before
                if (getattr(sys.modules.get(name), "__file__", None) or "").startswith(str(root))
                and not str(Path(sys.modules[name].__file__).resolve()).startswith(plugin)]
    if imported:
        raise Refusal(f"the lane's timing module {path.name} imports project code when loaded "
                      f"({', '.join(sorted(imported)[:3])}): import inside build() and make_inputs()")
    regions = getattr(module, "REGIONS", None)
    from pytest_ditgate.timed_region import TimedRegion

    if not isinstance(regions, (list, tuple)) or not regions or not all(isinstance(r, TimedRegion) for r in regions):
        raise Refusal(f"{path.name} must declare REGIONS, a list of pytest_ditgate.timed_region.TimedRegion")
    names = [region.name for region in regions]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise Refusal(f"{path.name} declares more than one region named {', '.join(map(repr, twice))}: each region "
                      "needs a name of its own (the judge times and records regions by name, so one would replace "
                      "the other)")
    return {region.name: region for region in regions}


def time_lane(candidate_root: Path, best_root: Path, timing: Path, env: dict[str, str], folder: Path, arch: str,
              floor: float, problems: list[tuple[Category, str]], *,
              experiment_class: str = "numerical") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time the lane: (comparisons for the objective, a record of the timing for the verdict's detail); the
    audits follow ``experiment_class``, the class the candidate is judged as."""
    record: dict[str, Any] = {"protocol": "judge's clock, fresh seeded inputs per round, keyed commitments, audits",
                              "regions": {}}
    try:
        specs = load_specs(timing, candidate_root)
    except Refusal as exc:
        problems.append((Category.INTEGRITY, str(exc)))
        return [], record
    folder.mkdir(parents=True, exist_ok=True)
    servers: list[Endpoint] = []
    comparisons: list[dict[str, Any]] = []
    become_subreaper()
    try:
        candidate = start_server("candidate", candidate_root, timing, ["candidate"], env, folder / "candidate.log")
        servers.append(candidate)
        comparator = start_server("comparator", best_root, timing, ["best", "baseline"], env,
                                  folder / "comparator.log")
        servers.append(comparator)
        audit_dir = Path(tempfile.mkdtemp(prefix="audit-", dir=folder))

        def auditor(impl: str) -> Endpoint:
            root = candidate_root if impl == "candidate" else best_root
            server = start_server(f"{impl} auditor", root, timing, [impl], env, folder / f"{impl}-auditor.log")
            servers.append(server)  # closed by the timer after its region's audit; here too if that fails
            return server

        timer = LaneTimer(candidate, comparator, specs, audit_dir, problems, floor=floor,
                          experiment_class=experiment_class, auditor=auditor)
        for name in specs:
            timing_result = timer.time_region(name)
            trip, note = timing_result.round_trip()
            entry: dict[str, Any] = {"skipped": timing_result.skipped, "calls_per_round": timing_result.calls,
                                     "rounds": len(timing_result.samples.get("candidate", [])),
                                     "audited_rounds": timing_result.audited, "audit": timing_result.audit,
                                     "median_ms": {k: upper_median(v) for k, v in timing_result.samples.items() if v},
                                     "warm_ms": timing_result.warm_ms, "round_trip_ms": trip}
            if note:
                entry["note"] = note
            record["regions"][name] = entry
            if timing_result.skipped is None:
                comparisons += timing_result.comparisons(arch)
    except Refusal as exc:
        problems.append((Category.INTEGRITY, f"judge timing: {exc}"))
        comparisons = []
    except (ServerFailed, OSError) as exc:
        problems.append((Category.CRASH, f"judge timing: {exc}"))
        comparisons = []
    finally:
        for server in servers:
            server.close()
        for left in strays(set()):  # nothing of the timing outlives it
            try:
                os.kill(int(left.split(" ", 1)[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    if not comparisons and not any(category in (Category.INTEGRITY, Category.CRASH) for category, _ in problems):
        problems.append((Category.CRASH, "judge timing: no region could be timed here ("
                         + "; ".join(f"{n}: {e.get('skipped')}" for n, e in record["regions"].items()) + ")"))
    return comparisons, record
