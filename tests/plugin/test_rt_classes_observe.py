"""Red-team round on the judge's classes, the observer itself (no judge run): a grid of int8 levels is found under
a dither of a hundredth of a step, honest float weights (fp32, bf16- or fp16-rounded, TF32-truncated) never read as
a grid, an op that turns int8 values into floats is evidence wherever the int8 tensor lives, and the module scan
reaches underscore attributes, containers, numpy arrays, lists of ints, closures and the project's module globals."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from pytest_ditgate.experiment.observe import Evidence, grid_sample, grid_verdict, make_observer, scan_modules  # noqa: E402


def int8_weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(seed)) / 16
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8), scale


@pytest.mark.parametrize("dither", [0.0, 1e-3, 1e-2])
def test_a_dithered_int8_grid_is_still_a_grid(dither: float) -> None:
    found = 0
    for seed in range(10):
        q, scale = int8_weights(seed)
        noise = torch.randn(q.shape, generator=torch.Generator().manual_seed(100 + seed))
        found += bool(grid_verdict(grid_sample(q.float() * scale + noise * scale * dither).tolist()))
    assert found >= 9  # before: 10, 0 and 0 of 10


def test_honest_float_weights_are_no_grid() -> None:
    gen = torch.Generator().manual_seed(1)
    for trial in range(100):
        w = torch.randn(256, 256, generator=gen) / 16 * (1 + trial % 5)
        for t in (w, w.bfloat16().float(), w.half().float(), (w.view(torch.int32) & -8192).view(torch.float32),
                  torch.rand(256, 256, generator=gen)):
            assert grid_verdict(grid_sample(t).tolist()) is None


def test_an_int8_tensor_turned_into_floats_is_evidence_wherever_it_lives() -> None:
    q, scale = int8_weights()
    mask = torch.ones(256, 256, dtype=torch.uint8)
    evidence = Evidence()
    with make_observer(evidence):
        x = torch.randn(8, 256)
        (x[:, None, :] * (q.float() * scale)[None]).sum(-1)  # no GEMM: a multiply and a sum
        x * mask[:8].float()  # a 0/1 mask: no evidence
    evidence.settle()
    assert [e for e in evidence.items if "turns int8 (256, 256) into floats" in e], evidence.items
    assert not [e for e in evidence.items if "uint8" in e], evidence.items


class Holder(torch.nn.Module):
    def __init__(self, **attributes: object) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        for key, value in attributes.items():
            setattr(self, key, value)


def scanned(module: torch.nn.Module) -> list[str]:
    evidence = Evidence()
    scan_modules(evidence, full=True)
    del module
    return evidence.items


def test_the_module_scan_reaches_every_place_a_weight_can_be_kept() -> None:
    q, scale = int8_weights()

    def closure(y: torch.Tensor) -> torch.Tensor:
        return y @ (q.float() * scale).t()

    holder = Holder(_hidden=q.clone(), parts=[q.clone(), scale], arrays={"w": q.numpy().copy()},
                    ints=q.reshape(-1).tolist(), fn=closure)
    items = scanned(holder)
    for where in ("Holder._hidden holds int8", "Holder.parts[0] holds int8", "Holder.arrays['w'] (a numpy array",
                  "Holder.ints is a list of 65536 ints", "Holder.fn closure"):
        assert any(where in item for item in items), (where, items)


def test_honest_attributes_are_no_evidence() -> None:
    holder = Holder(_lookup=torch.arange(4096 * 4).view(64, 256), masks=[torch.ones(64, 256, dtype=torch.uint8)],
                    image=np.zeros((64, 64, 3), dtype=np.uint8), steps=list(range(50)),
                    w=np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32))
    items = [item for item in scanned(holder) if item.startswith("Holder")]
    assert items == []


def test_the_projects_module_globals_are_scanned(tmp_path, monkeypatch) -> None:
    q, scale = int8_weights()
    module = types.ModuleType("rt_candidate_globals")
    module.__file__ = str(tmp_path / "candidate" / "work.py")
    module.WQ = q.float() * scale  # quantized at import time, kept as float32, no module holds it
    test_module = types.ModuleType("rt_test_globals")
    test_module.__file__ = str(tmp_path / "tests" / "test_x.py")
    test_module.WQ = q.float() * scale  # a test file's globals are the project's fixed data, not the candidate
    monkeypatch.setitem(sys.modules, "rt_candidate_globals", module)
    monkeypatch.setitem(sys.modules, "rt_test_globals", test_module)
    evidence = Evidence()
    evidence.project = tmp_path.resolve()
    scan_modules(evidence, full=True)
    assert any(item.startswith("rt_candidate_globals.WQ") and "values on a grid" in item for item in evidence.items)
    assert not any(item.startswith("rt_test_globals") for item in evidence.items)


def test_one_signed_tables_among_the_projects_globals_are_no_evidence(tmp_path, monkeypatch) -> None:
    """A coordinate table or an image (k/255) kept by the project's own module is on a grid too, and no weight:
    away from a module's parameters a grid counts only where it takes both signs. An int8 weight does."""
    import numpy as np

    q, scale = int8_weights()
    module = types.ModuleType("rt_candidate_tables")
    module.__file__ = str(tmp_path / "candidate" / "tables.py")
    module.COORDS = np.mgrid[0:64, 0:64][1].astype(np.float32)
    module.IMAGE = (np.random.default_rng(0).integers(0, 256, (64, 192)) / 255).astype(np.float32)
    module.PIXELS = [torch.from_numpy(module.IMAGE)]
    module.WQ = (q.float() * scale).numpy()
    monkeypatch.setitem(sys.modules, "rt_candidate_tables", module)
    evidence = Evidence()
    evidence.project = tmp_path.resolve()
    scan_modules(evidence, full=True)
    found = [item for item in evidence.items if item.startswith("rt_candidate_tables")]
    assert len(found) == 1 and found[0].startswith("rt_candidate_tables.WQ"), found


def test_floats_rounded_to_signed_integer_levels_are_evidence() -> None:
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(256, 256, generator=gen) / 16
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    evidence = Evidence()
    with make_observer(evidence):
        torch.round(w / scale) * scale  # int8 levels in float, on every call
        torch.round(torch.tanh(torch.randn(64, 256, generator=gen)) * 16) / 16  # activations on a 1/16 grid
    evidence.settle()
    assert len([e for e in evidence.items if e.startswith("round to signed integer levels")]) == 2, evidence.items


def test_an_image_rounded_before_its_uint8_cast_is_no_evidence() -> None:
    image = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    evidence = Evidence()
    with make_observer(evidence):
        (image * 255).round().to(torch.uint8)
        torch.round(torch.randn(8, 8))  # too small to be weights
    evidence.settle()
    assert evidence.items == []
