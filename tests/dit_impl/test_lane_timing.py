"""The DiT lane's timing module (tests/gates/dit/lane_timing.py): what the judge times, and the audit bound each
class gets. The sampling regions time the candidate's own sampler against the baseline's loop: at its default
the candidate's sampling is the baseline's to float32's last bits (audited at 1e-3); a fifth of the steps lands
rel-L2 0.93 away, as far as noise, so an approximate sampling is audited against a fresh process of its own tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pytest_ditgate.timed_region import TimedRegion

ROOT = Path(__file__).resolve().parents[2]


def regions() -> dict[str, TimedRegion]:
    spec = importlib.util.spec_from_file_location("lane_timing_under_test", ROOT / "tests/gates/dit/lane_timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {region.name: region for region in module.REGIONS}


def test_every_region_has_a_bound_per_class() -> None:
    found = regions()
    assert set(found) == {"tiny", "xl", "tiny-sampling", "xl-sampling"}
    for name in ("tiny", "xl"):  # a forward is the forward whatever the sampler: only quantization loosens it
        assert found[name].audit_bound("approximate") == found[name].audit_rel_l2
        assert found[name].audit_rel_l2 < found[name].audit_bound("quantization") < 1
    for name in ("tiny-sampling", "xl-sampling"):
        assert found[name].audit_bound("numerical") == found[name].audit_rel_l2
        assert found[name].audit_bound("approximate") is None and found[name].audit_bound("quantization") is None


def test_the_cpu_regions_run_only_where_the_xl_regions_cannot(monkeypatch) -> None:
    """On a GPU that runs the XL regions, the tiny CPU regions are skipped (they would dilute the objective's
    geometric mean and lengthen every judged run); on a CPU, or a GPU too small for XL, they are what is timed."""
    import torch

    found = regions()
    assert found["tiny"].skip is found["tiny-sampling"].skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert found["tiny"].skip() is None and found["xl"].skip() == "needs a CUDA GPU"

    class Props:
        name, total_memory = "a big GPU", 80 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert found["xl"].skip() is None and "XL regions" in found["tiny"].skip()
    Props.total_memory = 8 * 2**30  # too small for XL: the tiny regions are timed instead
    assert found["xl"].skip().startswith("needs 20 GB") and found["tiny"].skip() is None


def test_a_region_refuses_a_bound_outside_a_fraction() -> None:
    def build(impl):
        return lambda x: x

    with pytest.raises(ValueError, match="audit_by_class"):
        TimedRegion("r", build, lambda g: (0,), audit_by_class={"approximate": 2.0})
    with pytest.raises(ValueError, match="self_audit_rel_l2"):
        TimedRegion("r", build, lambda g: (0,), self_audit_rel_l2=0.0)


def _rel_l2(a, b) -> float:
    return float((a - b).double().norm() / b.double().norm())


def test_the_candidates_sampling_at_its_default_is_the_baselines_and_a_fifth_of_the_steps_is_not(monkeypatch) -> None:
    import torch

    from dit_impl.fast import candidate
    from dit_impl.fast.sampler import SamplerOptions

    region = regions()["tiny-sampling"]
    args = region.make_inputs(torch.Generator("cpu").manual_seed(7))
    labels, seed = args
    assert labels.shape == (4,) and isinstance(seed, int)
    baseline = region.build("baseline")(*args)
    honest = region.build("candidate")(*args)
    assert _rel_l2(honest, baseline) <= region.audit_rel_l2
    monkeypatch.setattr(candidate, "SAMPLER", SamplerOptions(step_fraction=0.2), raising=False)
    fewer = region.build("candidate")(*args)
    assert _rel_l2(fewer, baseline) > 0.5  # no baseline bound can tell this from noise: the class audits itself
    assert torch.equal(region.build("candidate")(*args), fewer)  # a fresh build reproduces it bitwise
