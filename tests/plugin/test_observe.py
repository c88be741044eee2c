"""The child's class observation (:mod:`pytest_ditgate.experiment.observe`): what it finds, what it leaves
alone, and that a repeat scan reads no values it has judged already unless they were written since."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_ditgate.experiment import observe  # noqa: E402
from pytest_ditgate.experiment.observe import Evidence, make_observer, scan_modules  # noqa: E402


def on_grid(weight: "torch.Tensor", levels: int = 255) -> "torch.Tensor":
    """int8-style fake quantization: every row on a grid of ``levels`` steps, stored as float32."""
    scale = weight.abs().amax(1, keepdim=True) / (levels // 2)
    return (weight / scale).round() * scale


class Held(torch.nn.Module):
    def __init__(self, weight: "torch.Tensor") -> None:
        super().__init__()
        self.proj = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(weight)


@pytest.fixture
def evidence():
    return Evidence()


@pytest.fixture
def weight():
    return torch.randn(256, 256, generator=torch.Generator().manual_seed(0))


def observed(evidence: Evidence, run) -> None:
    with make_observer(evidence):
        run()
    evidence.settle()


def test_honest_float_work_leaves_no_evidence(evidence, weight) -> None:
    x = torch.randn(8, 256)
    observed(evidence, lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, weight)).sum())
    assert evidence.items == []
    assert evidence.ops >= 3 and evidence.gemms >= 1


def test_grid_weight_in_a_gemm_is_found_after_the_call(evidence, weight) -> None:
    x = torch.randn(8, 256)
    observed(evidence, lambda: torch.nn.functional.linear(x, on_grid(weight)))
    assert any("weight (256, 256) float32: values on a grid" in e for e in evidence.items), evidence.items


def test_fp8_round_trip_and_integer_operand_are_found(evidence) -> None:
    x = torch.randn(64, 64)
    ints = torch.randint(-8, 8, (64, 64))

    def run():
        x.to(torch.float8_e4m3fn).to(torch.float32)
        torch.mm(ints, ints)

    observed(evidence, run)
    assert any("on a float8_e4m3fn tensor" in e for e in evidence.items), evidence.items
    assert any("mm with a int64 operand" in e for e in evidence.items), evidence.items


@pytest.fixture
def tf32_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_host_gemms_are_never_tf32(evidence, weight, tf32_flags) -> None:
    """TF32 exists on NVIDIA GPUs only: a CPU's float32 GEMM is float32 whatever the switches say."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    x = torch.randn(8, 256)
    observed(evidence, lambda: (torch.nn.functional.linear(x, weight),
                                torch.nn.functional.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))))
    assert evidence.gemms >= 2 and evidence.tf32_gemms == 0


@pytest.mark.requires_gpu(why="TF32 GEMMs")
def test_float32_gemms_with_tf32_allowed_are_counted_on_a_gpu(evidence, tf32_flags) -> None:
    x, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    images, filters = torch.randn(1, 3, 8, 8, device="cuda"), torch.randn(4, 3, 3, 3, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    observed(evidence, lambda: (x @ w, torch.nn.functional.conv2d(images, filters)))
    assert evidence.tf32_gemms == 0
    torch.backends.cuda.matmul.allow_tf32 = True
    observed(evidence, lambda: (x @ w, x.bfloat16() @ w.bfloat16(), torch.nn.functional.conv2d(images, filters)))
    assert evidence.tf32_gemms == 1  # the float32 matmul; bf16 is not TF32, the conv follows cuDNN's switch
    torch.backends.cudnn.allow_tf32 = True
    observed(evidence, lambda: torch.nn.functional.conv2d(images, filters))
    assert evidence.tf32_gemms == 2


@pytest.mark.parametrize("where", ["in a list argument", "written through out=", "as the output only"])
def test_fp8_is_found_wherever_an_op_holds_it(evidence, where) -> None:
    """An fp8 tensor nested one list deep (``cat``), passed as the ``out=`` keyword, or only produced is seen:
    the observer reads arguments at any depth, keyword arguments and outputs."""
    x = torch.randn(16, 16)
    low = x.to(torch.float8_e4m3fn)  # made outside observation

    def run():
        if where == "in a list argument":
            torch.cat([low, low])
        elif where == "written through out=":
            torch.ops.aten.add.out(x, x, out=torch.empty_like(low))
        else:
            torch.empty_like(x, dtype=torch.float8_e5m2)

    observed(evidence, run)
    assert any("float8" in e for e in evidence.items), (where, evidence.items)


def test_scan_finds_grid_weights_int8_attributes_and_ignores_masks(evidence, weight) -> None:
    held = Held(on_grid(weight))
    held.qweight = torch.randint(-127, 127, (256, 256), dtype=torch.int8)
    held.mask = torch.randint(0, 2, (256, 256), dtype=torch.uint8)
    scan_modules(evidence)
    found = "\n".join(evidence.items)
    assert "Linear.weight (float32, shape (256, 256)): values on a grid" in found
    assert "Held.qweight holds int8 values" in found
    assert "mask" not in found
    del held


def test_repeat_scan_reads_only_new_or_written_tensors(evidence, weight, monkeypatch) -> None:
    held = Held(weight)
    scan_modules(evidence)
    assert evidence.items == []
    sampled = []
    real = observe.grid_sample
    monkeypatch.setattr(observe, "grid_sample", lambda t: sampled.append(tuple(t.shape)) or real(t))
    scan_modules(evidence)
    assert (256, 256) not in sampled  # judged before, unchanged: not read again

    with torch.no_grad():
        held.proj.weight.copy_(on_grid(weight))  # written in place: the version counter moved
    scan_modules(evidence)
    assert (256, 256) in sampled
    assert any("Linear.weight" in e and "values on a grid" in e for e in evidence.items), evidence.items


def test_repointed_weight_is_judged_again(evidence, weight) -> None:
    held = Held(weight)
    scan_modules(evidence)
    assert evidence.items == []
    held.proj.weight.data = on_grid(weight)  # same Parameter object, new storage
    scan_modules(evidence)
    assert any("Linear.weight" in e and "values on a grid" in e for e in evidence.items), evidence.items


def test_module_built_after_a_scan_is_scanned(evidence, weight) -> None:
    scan_modules(evidence)
    late = Held(on_grid(weight))
    scan_modules(evidence)
    assert any("values on a grid" in e for e in evidence.items), evidence.items
    del late


def test_samples_of_many_tensors_are_read_in_one_copy(weight, monkeypatch) -> None:
    copies = []
    real_to = torch.Tensor.to

    pending = [(f"w{i}", observe.grid_sample(on_grid(weight) if i % 2 else weight)) for i in range(6)]

    def counting_to(self, *args, **kwargs):
        if args and args[0] == "cpu":
            copies.append(self.shape)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    verdicts = dict(observe.read_samples(pending))
    assert len(copies) == 1
    assert [bool(verdicts[f"w{i}"]) for i in range(6)] == [False, True] * 3


def test_watched_scan_sees_modules_built_since_without_the_collector(evidence, weight, monkeypatch) -> None:
    observe.watch_modules(evidence)
    try:
        scan_modules(evidence)  # the first scan: every module, through the collector
        late = Held(on_grid(weight))  # registers its parameters and submodule: the hooks see it
        monkeypatch.setattr(observe.gc, "get_objects", lambda *a: pytest.fail("a watched scan walked the collector"))
        scan_modules(evidence, full=False)
        assert any("Linear.weight" in e and "values on a grid" in e for e in evidence.items), evidence.items
        del late
    finally:
        for handle in evidence.watching:
            handle.remove()


def test_a_deep_copy_escapes_the_watch_until_the_next_full_scan(evidence, weight) -> None:
    import copy

    observe.watch_modules(evidence)
    try:
        original = Held(weight)
        scan_modules(evidence)
        twin = copy.deepcopy(original)  # no registration hook runs for a copy
        with torch.no_grad():
            twin.proj.weight.copy_(on_grid(weight))
        scan_modules(evidence, full=False)
        assert evidence.items == []
        scan_modules(evidence, full=True)  # the child's last test and session end are full scans
        assert any("values on a grid" in e for e in evidence.items), evidence.items
        del twin
    finally:
        for handle in evidence.watching:
            handle.remove()
