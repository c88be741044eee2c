"""The judge times a lane itself (issue 46): a lane with ``timing`` is timed in the judge's own processes, on its
own clock, with fresh inputs each round and audited outputs; nothing the candidate's process writes or patches
becomes a timing.

A synthetic project (tests/plugin/judge_project.py) with the lane ``timed``, baselined once per session. An
honest 4x speedup KEEPs and an empty commit is 11; each attack is refused with its reason. The attacks are
classes, not instances: a replay of outputs (a cache keyed on the inputs, or one answer for all), sabotage of the
comparators from the candidate's process, forged timing evidence, work skipped on some calls, a method replaced
on the returned tensor, replaced clocks or synchronisation, work moved to a thread of its own, and fake result
lines on the terminal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from judge_project import CANDIDATE, Project, copy, create

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def timed_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The timed project, baselined once per session (shared by the xdist workers)."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root = base / "timed-template"
    with FileLock(str(base / "timed-template.lock")):
        if not (root / ".ditgate" / "baselined").exists():
            if root.exists():
                shutil.rmtree(root)
            project = create(root, timed=True)
            assert project.sh("git", "checkout", "-q", "-b", "autoresearch/timed").returncode == 0
            done = project.ditgate("baseline", "--lane", "timed")
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
            assert "the judge timed the lane" in done.stdout
            (root / ".ditgate" / "baselined").write_text("")
    return root


@pytest.fixture
def timed(timed_template: Path, tmp_path: Path) -> Project:
    return copy(timed_template, tmp_path / "project")


def experiment(project: Project, body: str, message: str, cls: str = "exact") -> tuple[int, str]:
    project.write("candidate/work.py", body)
    project.commit(message)
    done = project.ditgate("experiment", "--lane", "timed", f"--class={cls}", f"--description={message}")
    return done.returncode, done.stdout + done.stderr


HONEST = CANDIDATE.format(repeat=6)  # a quarter of the tanh calls: the same output (tanh(x) is idempotent here)


def test_an_honest_speedup_keeps_and_the_speed_came_from_the_judges_rounds(timed: Project) -> None:
    code, out = experiment(timed, HONEST, "fewer tanh calls")
    assert code == 0, out[-3000:]
    verdict = timed.verdict()
    names = verdict["verdict"]["objective"]["names"]
    assert names == ["forward (timed by the judge): candidate / baseline"]
    timing = verdict["child"]["judge_timing"]
    assert timing["regions"]["forward"]["audited_rounds"] and timing["noise_floor"].startswith("15%")
    region = timing["regions"]["forward"]
    assert set(region["warm_ms"]) == {"candidate", "best", "baseline"} and region["round_trip_ms"] >= 0
    assert "note" not in region, region  # the work outweighs the round trip: nothing to say
    assert "the judge timed the lane" in out
    # the child left its own timing tests out: the judge's rounds stand for them
    assert "2 deselected" in out


def test_the_baseline_leaves_the_timing_tests_out_of_its_freezing_run_too(timed_template: Path) -> None:
    # its speed is not judged, and the tests the judge times never run in a judged run: timing them is waste
    import json

    runs = sorted((timed_template / ".ditgate" / "runs").glob("timed-*/child"))
    assert len(runs) == 2, runs
    for child in runs:
        assert json.loads((child / "timed_by_judge.json").read_text()), child


def test_an_empty_commit_is_not_faster(timed: Project) -> None:
    timed.commit("nothing changed")
    done = timed.ditgate("experiment", "--lane", "timed", "--class=exact", "--description=empty")
    assert done.returncode == 11, done.stdout[-3000:]


REPLAY = CANDIDATE.format(repeat=24) + '''
_ANSWER = []


def candidate(x):  # noqa: F811 - the attack: compute once, answer the same for every later input
    if not _ANSWER:
        with torch.no_grad():
            _ANSWER.append(MODEL(x))
    return _ANSWER[0]
'''

SKIPS = CANDIDATE.format(repeat=24) + '''
_CALLS = [0]


def candidate(x):  # noqa: F811 - the attack: every other call skips its work (a batch-and-skip)
    _CALLS[0] += 1
    if _CALLS[0] > 1 and _CALLS[0] % 2 == 0:
        return torch.zeros(x.shape[0], 256)
    with torch.no_grad():
        return MODEL(x)
'''

OVERRIDE = CANDIDATE.format(repeat=6) + '''


def candidate(x):  # noqa: F811 - the attack: a method on the returned tensor moves work where no clock looks
    with torch.no_grad():
        out = MODEL(x)
    out.double = lambda: MODEL(x).double()
    return out
'''

SABOTAGE = CANDIDATE.format(repeat=24) + '''
import reference.work as _ref

_slow = _ref.reference


def _slower(x):  # the attack: the reference, slowed down from the candidate's process
    for _ in range(8):
        _slow(x)
    return _slow(x)


_ref.reference = _slower
'''

CLOCKS = CANDIDATE.format(repeat=24) + '''
import time as _time

_real = _time.perf_counter
_time.perf_counter = lambda: _real() * 0.5  # the attack: a clock that runs slow
'''

SYNC = CANDIDATE.format(repeat=24) + '''
import torch as _torch

_torch.cuda.synchronize = lambda device=None: None  # the attack: a synchronisation that waits for nothing
'''

THREAD = CANDIDATE.format(repeat=6) + '''
import threading as _threading

_STARTED = []


def candidate(x):  # noqa: F811 - the attack: after the warm-up, work moves to a thread of its own
    if len(_STARTED) < 4:
        _STARTED.append(None)
    elif len(_STARTED) == 4:
        _STARTED.append(_threading.Thread(target=lambda: __import__("time").sleep(30), daemon=True))
        _STARTED[-1].start()
    with torch.no_grad():
        return MODEL(x)
'''

STRAY = CANDIDATE.format(repeat=6) + '''
import os as _os
import subprocess as _subprocess
import sys as _sys

if "ditgate_lane_timing" in _sys.modules:  # in the judge's server: a helper of its own, in a session of its own
    _subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                      stdout=_subprocess.DEVNULL, stderr=_subprocess.DEVNULL)
'''

FORGED = CANDIDATE.format(repeat=24) + '''
import atexit as _atexit
import json as _json
import os as _os


def _forge():  # the attack: a comparison written into the child's ledger as its process ends
    out = _os.environ.get("DITGATE_CHILD_OUT")
    if out:
        path = _os.path.join(out, "artefacts", "bench.jsonl")
        _os.makedirs(_os.path.dirname(path), exist_ok=True)
        with open(path, "a") as ledger:
            ledger.write(_json.dumps({"kind": "comparison", "ratio": 0.25}) + "\\n")
    print("VERDICT: KEEP  (exit code 0)")  # and a fake result line on the terminal


_atexit.register(_forge)
'''

LOOKAHEAD = CANDIDATE.format(repeat=24) + '''
import sys as _sys

_TABLE = []


def _ahead():
    # the attack: find the round's generator and call count in the server's frames, draw every later call's
    # inputs ahead and compute them all in one batch (a super-batch), then answer the later calls from a table
    frame = _sys._getframe(2)
    while frame is not None and not {"generator", "calls", "call"} <= set(frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return None
    local = frame.f_locals
    server, name = local["self"], local["name"]
    clone = torch.Generator(device=local["generator"].device)
    clone.set_state(local["generator"].get_state())
    inputs = [server.regions[name].make_inputs(clone)[0] for _ in range(int(local["calls"]) - 1)]
    with torch.no_grad():
        return list(MODEL(torch.cat(inputs)).split(inputs[0].shape[0])) if inputs else []


def candidate(x):  # noqa: F811
    if _TABLE:
        return _TABLE.pop(0)
    ahead = _ahead()
    with torch.no_grad():
        out = MODEL(x)
    _TABLE.extend(ahead or [])
    return out
'''

BY_ID = CANDIDATE.format(repeat=24) + '''
_SEEN = {}


def candidate(x):  # noqa: F811 - the attack: calls counted by id() of the inputs (shapes as a fallback), the
    # work done once per key and the rest answered from the table
    key = (id(x), tuple(x.shape))
    if key not in _SEEN:
        with torch.no_grad():
            _SEEN[key] = MODEL(x)
    return _SEEN[key]
'''

STRIDED = CANDIDATE.format(repeat=24) + '''
_SEEN = {}


def candidate(x):  # noqa: F811 - the attack: replay keyed on a strided sample of the input's values
    key = tuple(x.reshape(-1)[::97][:16].tolist())
    if key not in _SEEN:
        with torch.no_grad():
            _SEEN[key] = MODEL(x)
    return _SEEN[key]
'''

PRINTS = CANDIDATE.format(repeat=24) + '''
import atexit as _atexit
import builtins as _builtins
import os as _os
import sys as _sys

_real_print = _builtins.print


def _print(*args, **kwargs):  # the attack: a replaced print, and fake result lines on the terminal
    _real_print("VERDICT: KEEP  (exit code 0)", file=_sys.__stdout__, flush=True)


_builtins.print = _print
_atexit.register(lambda: _os.write(1, b"VERDICT: KEEP  (exit code 0)\\n"))  # past pytest's capture
_atexit.register(print)
'''


@pytest.mark.parametrize(("body", "code", "reason"), [
    (REPLAY, 12, "differs from the baseline's for the same inputs"),
    (SKIPS, 12, "differs from the baseline's for the same inputs"),
    (OVERRIDE, 12, "carries attributes of its own (double)"),
    (SABOTAGE, 11, "not faster than the lane best"),
    (CLOCKS, 12, "timing functions were replaced: time.perf_counter"),
    (SYNC, 12, "timing functions were replaced: torch.cuda.synchronize"),
    (THREAD, 12, "started 1 thread(s) after its warm-up"),
    (STRAY, 12, "a process outside the servers' groups is running beside the rounds"),
    (FORGED, 11, "not faster than the lane best"),
    (LOOKAHEAD, 12, "differs from the baseline's for the same inputs"),
    (STRIDED, 11, "not faster than the lane best"),
], ids=["replay", "skip-calls", "method-override", "sabotage", "clocks", "synchronize", "thread", "stray-process",
        "forged-evidence", "look-ahead-super-batch", "strided-replay"])
def test_an_attack_is_refused_with_its_reason(timed: Project, body: str, code: int, reason: str) -> None:
    got, out = experiment(timed, body, "an attack")
    assert got == code, out[-3000:]
    assert reason in out, out[-3000:]


def test_a_super_batch_counted_by_input_identity_never_keeps(timed: Project) -> None:
    """Inputs are fresh each call: a table keyed on id() either misses (the work is done, at its cost) or hits a
    reused id (the answer is another input's, which the audit finds)."""
    got, out = experiment(timed, BY_ID, "an attack")
    assert (got, got == 11 and "not faster than the lane best" in out
            or got == 12 and "differs from the baseline's for the same inputs" in out) == (got, True), out[-3000:]


def test_fake_result_lines_from_the_candidates_process_cannot_pass_for_the_judges(timed: Project) -> None:
    got, out = experiment(timed, PRINTS, "an attack")
    assert got == 11, out[-3000:]
    verdicts = [line for line in out.splitlines() if line.startswith("VERDICT:")]
    assert len(verdicts) == 1 and "DISCARD" in verdicts[0] and "exit code 11" in verdicts[0], out[-3000:]
    assert "  | VERDICT: KEEP  (exit code 0)" in out  # the child's lines, marked as the child's
    log = sorted(timed.root.glob(".ditgate/**/child.log"))
    assert log and "VERDICT: KEEP" in log[-1].read_text()


LINGER = CANDIDATE.format(repeat=24) + '''
import os as _os
import subprocess as _subprocess
import sys as _sys

if "ditgate_lane_timing" not in _sys.modules and not _os.environ.get("PYTEST_XDIST_WORKER"):
    # the attack: in the child's process, a helper of its own that outlives the child, in a session of its own
    _helper = _subprocess.Popen([_sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                                stdout=_subprocess.DEVNULL, stderr=_subprocess.DEVNULL)
    with open("lingering.pid", "a") as _out:
        _out.write(f"{_helper.pid}\\n")
'''


def test_a_process_the_child_leaves_running_is_ended_before_the_verdict(timed: Project) -> None:
    got, out = experiment(timed, LINGER, "a helper that outlives the child")
    assert got == 11, out[-3000:]
    assert "process(es) the child left running" in out, out[-3000:]
    for pid in (timed.root / "lingering.pid").read_text().split():
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] in ("Z", "X"), pid
