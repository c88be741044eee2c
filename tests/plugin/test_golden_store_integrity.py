"""The golden store, nothing lost and nothing silent (issue 51, item 4): one golden name frozen by two tests;
a golden that is not finite; a dtype change; a freeze interrupted at random points (SIGINT) that the next
freeze or check accepts or repairs by itself; clear errors naming the golden instead of tracebacks (a folder
where a golden file goes, an unreadable file, tensors sharing memory, meta and sparse tensors, a device this
machine lacks); a result that prints as one line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from pytest_ditgate.golden.session import GoldenSession  # noqa: E402
from pytest_ditgate.golden.store import GoldenStore  # noqa: E402


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--ditgate", "-p", "no:cacheprovider", "-rf", *args)


def manifest(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "golden" / "manifest.json").read_text())


TWO_TESTS_ONE_NAME = """
import torch

def test_first(golden):
    golden.check("shared", {{"x": torch.full((3,), 1.0)}})

def test_second(golden):
    golden.check("shared", {{"x": torch.full((3,), {value})}})
"""


def test_two_tests_freezing_one_name_are_compared_with_each_other(pytester: pytest.Pytester) -> None:
    """The second used to fail with a misleading "golden_missing: run --ditgate-freeze" (same value or not)."""
    pytester.makepyfile(test_gold=TWO_TESTS_ONE_NAME.format(value="1.0"))
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=2)
    assert list(manifest(pytester)["entries"]) == ["cpu/shared"]
    run(pytester).assert_outcomes(passed=2)
    pytester.makepyfile(test_gold=TWO_TESTS_ONE_NAME.format(value="2.0"))
    (pytester.path / "golden").rename(pytester.path / "old")
    result = run(pytester, "--ditgate-freeze")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["E   *GateFailure: [[]golden_mismatch[]] golden 'shared' for cpu (frozen earlier in this "
                                 "run by test_gold.py::test_first) does not match:"])
    assert "golden_missing" not in result.stdout.str()


@pytest.mark.slow  # two xdist workers each import torch
def test_two_workers_freezing_one_name_with_different_values_fail_the_run(pytester: pytest.Pytester) -> None:
    """Under -n 2 one value used to be dropped silently, and the run exited 0."""
    pytest.importorskip("xdist")
    pytester.makepyfile(test_a="import torch\ndef test_a(golden):\n    golden.check('shared', {'x': torch.ones(3)})\n",
                        test_b="import torch\ndef test_b(golden):\n    golden.check('shared', {'x': torch.zeros(3) + 2})\n")
    result = run(pytester, "--ditgate-freeze", "-n", "2", "-p", "xdist", "--dist", "loadfile")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    text = result.stdout.str()
    assert "golden 'cpu/shared' was frozen by another run or worker while this one ran" in text
    assert "test_a.py::test_a" in text and "test_b.py::test_b" in text


@pytest.mark.parametrize("value", ["float('nan')", "float('inf')", "-float('inf')"])
def test_a_golden_that_is_not_finite_is_not_frozen(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(test_gold=f"""
        import torch
        def test_nonfinite(golden):
            x = torch.ones(2, 3)
            x[1, 2] = {value}
            golden.check("bad", {{"ok": torch.ones(2), "x": x}})
    """)
    result = run(pytester, "--ditgate-freeze")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E   *GateFailure: [[]golden_nonfinite[]] golden 'bad' for cpu was not frozen: tensor 'x' "
                                 "holds 1 NaN/Inf value(s), the first at index (1, 2)*"])
    assert not (pytester.path / "golden" / "cpu" / "bad.safetensors").exists()


DTYPES = """
import torch

def value():
    return torch.linspace(1.0, 2.0, 256)

def test_dtype(golden):
    if golden.mode != "check":
        golden.check("d", {{"x": value()}})
        return
    candidate = (value() * 1.003).to(torch.bfloat16)  # 0.3 %: bf16's limits allow it, float32's do not
    golden.check("d", {{"x": candidate}}{extra})
"""


@pytest.mark.parametrize(("extra", "outcome", "line"), [
    ("", "failed", "*FAIL x: dtype bfloat16 != golden float32: a dtype change is judged only when the check says so "
                   "(golden.check(..., allow_dtype_change=True) judges it at bfloat16's limits)*"),
    (", allow_dtype_change=True", "passed", None),
    (", allow_dtype_change=True, compare=lambda c, h: None", "failed",
     "*allow_dtype_change is for the default comparator; a compare= of your own judges dtypes itself*"),
])
def test_a_dtype_change_is_judged_only_when_declared(pytester: pytest.Pytester, extra: str, outcome: str,
                                                     line: str | None) -> None:
    """A bf16 candidate against a float32 golden was silently judged at bf16's limits."""
    pytester.makepyfile(test_gold=DTYPES.format(extra=extra))
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester)
    result.assert_outcomes(**{outcome: 1})
    if line:
        result.stdout.fnmatch_lines([line])


FREEZER = r"""
import json, random, signal, sys
from pathlib import Path
import torch
from pytest_ditgate.golden.session import GoldenSession
from pytest_ditgate.golden.store import GoldenStore

root, rounds, names = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
armed = False
def on_sigint(signum, frame):
    if armed:
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, on_sigint)

def tensors(i, r):
    return {"x": torch.full((64, 64), float(i + r)), "y": torch.arange(i + 1.0)}

def session(mode, r):
    s = GoldenSession(GoldenStore(root / f"store{r}"), mode=mode)
    for i in range(names):
        s.check(f"g{i}", tensors(i, r), "cpu")
    return s

import time
spans = []
for c in range(3):  # how long an uninterrupted flush takes here: the parent aims its signals within it
    calibration = GoldenSession(GoldenStore(root / f"calibration{c}"), mode="freeze")
    for i in range(names):
        calibration.check(f"g{i}", tensors(i, 0), "cpu")
    start = time.perf_counter()
    calibration.finish()
    spans.append(time.perf_counter() - start)
print(f"flush {sorted(spans)[1]:.6f}", flush=True)

for r in range(rounds):
    first = session("freeze", r)
    interrupted = False
    print("ready", flush=True)
    try:
        try:
            armed = True
            first.finish()
        finally:
            armed = False
    except KeyboardInterrupt:
        interrupted = True
    sys.stdin.readline()  # the parent's SIGINT has been sent (a late one is ignored: not armed)
    store = root / f"store{r}"
    on_disk = sorted(p.name for p in (store / "cpu").glob("*.safetensors")) if (store / "cpu").exists() else []
    checked = GoldenSession(GoldenStore(store), mode="check")  # a check before any repair
    check_ok = []
    for i in range(names):
        try:
            checked.check(f"g{i}", tensors(i, r), "cpu")
            check_ok.append(i)
        except AssertionError:
            pass
    second = session("freeze", r)  # the next freeze
    second.finish()
    third = GoldenSession(GoldenStore(store), mode="check")
    for i in range(names):
        third.check(f"g{i}", tensors(i, r), "cpu")  # raises on any problem
    temps = [str(p) for p in store.rglob("*.tmp")] + [str(p) for p in store.glob(".freeze-journal*")]
    untracked = GoldenStore(store).untracked_files(GoldenStore(store).load_manifest())
    print(json.dumps({"round": r, "interrupted": interrupted, "files_before": len(on_disk),
                      "checked_before_repair": len(check_ok), "next_freeze_errors": second.write_errors,
                      "left": temps, "untracked": untracked}), flush=True)
"""


@pytest.mark.slow
def test_a_freeze_interrupted_at_random_points_is_repaired_by_the_next(tmp_path: Path) -> None:
    """SIGINT at 20 random points of a flush of 24 goldens. It used to leave golden files the manifest did not
    list (or no manifest), and the next freeze failed them as golden_untracked. Now whatever the interruption
    left, a check accepts every golden that was written whole, the next freeze completes the store without an
    error, and nothing is left over (no temporary file, no journal, no untracked golden)."""
    script = tmp_path / "freezer.py"
    script.write_text(FREEZER)
    rounds, names = 20, 24
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(rounds), str(names)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rng = random.Random(51)
    results = []
    try:
        flush_s = float(child.stdout.readline().split()[1])
        for _ in range(rounds):
            assert child.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, flush_s))  # anywhere in the flush
            os.kill(child.pid, signal.SIGINT)
            time.sleep(0.01)
            child.stdin.write("go\n")
            child.stdin.flush()
            results.append(json.loads(child.stdout.readline()))
    finally:
        child.stdin.close()
        assert child.wait(timeout=120) == 0
    interrupted = [r for r in results if r["interrupted"]]
    assert len(interrupted) >= 5, results  # most signals land inside a flush
    assert any(0 < r["files_before"] < names for r in interrupted), results  # some mid-way, files half there
    for r in results:
        assert r["next_freeze_errors"] == [] and r["left"] == [] and r["untracked"] == [], r
        assert r["checked_before_repair"] == r["files_before"], r  # every file written whole counts already


def _session(root: Path, mode: str = "check") -> GoldenSession:
    return GoldenSession(GoldenStore(root), mode=mode)


def test_a_folder_where_a_golden_file_goes_is_named(tmp_path: Path) -> None:
    from pytest_ditgate.errors import GateFailure

    freeze = _session(tmp_path, "freeze")
    freeze.check("a", {"x": torch.ones(3)}, "cpu")
    freeze.finish()
    (tmp_path / "cpu" / "a.safetensors").unlink()
    (tmp_path / "cpu" / "a.safetensors").mkdir()
    with pytest.raises(GateFailure, match=r"\[golden_integrity\] golden 'cpu/a': .*a.safetensors is a folder, where its "
                                          r"golden file should be"):
        _session(tmp_path).check("a", {"x": torch.ones(3)}, "cpu")
    (tmp_path / "cpu" / "b.safetensors").mkdir()
    with pytest.raises(GateFailure, match=r"\[golden_integrity\] golden 'b' for cpu: .*b.safetensors is a folder, where "
                                          r"its golden file goes"):
        _session(tmp_path, "freeze").check("b", {"x": torch.ones(3)}, "cpu")


def test_an_unreadable_golden_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ditgate.errors import GateFailure

    freeze = _session(tmp_path, "freeze")
    freeze.check("a", {"x": torch.ones(3)}, "cpu")
    freeze.finish()
    golden_file = tmp_path / "cpu" / "a.safetensors"
    real = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path == golden_file:
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)  # as root, chmod 000 would not stop a read
    with pytest.raises(GateFailure, match=r"golden 'cpu/a': its file .*a.safetensors cannot be read \(Permission denied\)"):
        _session(tmp_path).check("a", {"x": torch.ones(3)}, "cpu")


def test_tensors_that_share_memory_are_frozen_and_checked(pytester: pytest.Pytester) -> None:
    """safetensors refuses tensors that share memory: a traceback from inside the plugin, at the flush."""
    pytester.makepyfile(test_gold="""
        import torch
        def test_shared(golden):
            base = torch.arange(12.0)
            golden.check("s", {"a": base, "b": base, "head": base[:4], "grid": base.view(3, 4)})
    """)
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize(("tensor", "message"), [
    ("torch.ones(3, device='meta')", "*tensors[[]'x'[]] is a meta tensor (torch.Tensor float32[[]3[]] on meta): it has a "
                                     "shape and no data; golden files hold the values of dense tensors"),
    ("torch.eye(3).to_sparse()", "*tensors[[]'x'[]] is a sparse_coo tensor (*): pass tensor.to_dense()*"),
])
def test_tensors_without_values_are_a_usage_error(pytester: pytest.Pytester, tensor: str, message: str) -> None:
    pytester.makepyfile(test_gold=f"""
        import torch
        def test_k(golden):
            golden.check("m", {{"x": {tensor}}})
    """)
    for mode in (["--ditgate-freeze"], []):
        result = run(pytester, *mode)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["E   *DitgateUsageError: golden.check('m', tensors): " + message.lstrip("*")])
        assert "serializer.py" not in result.stdout.str() and "comparator.py" not in result.stdout.str()


def test_a_device_this_machine_lacks_is_a_usage_error(pytester: pytest.Pytester) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: device='cuda' is one of its devices")
    pytester.makepyfile(test_gold="""
        import torch
        def test_k(golden):
            golden.check("m", {"x": torch.ones(3)}, device="cuda")
        def test_load(golden):
            golden.load("m", device="cuda:1")
    """)
    result = run(pytester, "--ditgate-freeze")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["E   *DitgateUsageError: golden.check('m', tensors): device=str 'cuda' is not a device of "
                                 "this machine (*); give the device the tensors were computed on*",
                                 "E   *DitgateUsageError: golden.load('m'): device=str 'cuda:1' is not a device of this "
                                 "machine*"], consecutive=False)


def test_a_complex_golden_is_judged_on_both_parts(tmp_path: Path) -> None:
    """A cast to float64 dropped the imaginary part: a candidate wrong only there passed."""
    from pytest_ditgate.errors import GateFailure

    value = torch.complex(torch.linspace(1, 2, 64), torch.linspace(3, 4, 64))
    freeze = _session(tmp_path, "freeze")
    freeze.check("c", {"z": value}, "cpu")
    freeze.finish()
    assert _session(tmp_path).check("c", {"z": value.clone()}, "cpu").status == "matched"
    with pytest.raises(GateFailure, match="golden_mismatch"):
        _session(tmp_path).check("c", {"z": torch.complex(value.real, -value.imag)}, "cpu")


def test_a_result_prints_as_one_short_line(pytester: pytest.Pytester) -> None:
    """``print(golden.check(...))`` printed every tensor of the golden, in full."""
    pytester.makepyfile(test_gold=textwrap.dedent("""
        import torch
        def test_print(golden):
            result = golden.check("p", {"x": torch.arange(5000.0).reshape(50, 100)})
            print("RESULT", result)
            if result.hit is not None:
                print("HIT", result.hit)
    """))
    run(pytester, "--ditgate-freeze").assert_outcomes(passed=1)
    result = run(pytester, "-s")
    result.assert_outcomes(passed=1)
    lines = [line[line.index(word):] for line in result.stdout.lines for word in ("RESULT", "HIT") if word in line]
    assert lines == ["RESULT <GoldenResult 'p': matched, key cpu, 1 tensor(s) compared>",
                     "HIT <GoldenHit golden 'p' for cpu: {'x': float32[50, 100]}>"], lines
