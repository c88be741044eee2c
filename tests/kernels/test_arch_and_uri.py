"""Target-arch parsing and filtering, gencode flags, module URIs and cache-identity determinism."""

from __future__ import annotations

import pytest

from kernels.jit import arch
from kernels.jit.errors import UnsupportedArchError
from tests.kernels.conftest import needs_nvcc, tiny_spec


@pytest.mark.parametrize("text", ["8.6 9.0", "sm_86,sm_90", "86;90", " 9.0  8.6 8.6 ", "compute_86 sm_90"])
def test_parse_archs_accepts_the_usual_spellings(text) -> None:
    assert arch.parse_archs(text) == [(8, 6), (9, 0)]


@pytest.mark.parametrize("text", ["", "ampere", "sm_", "8", "9.x"])
def test_parse_archs_rejects_garbage(text) -> None:
    with pytest.raises(ValueError):
        arch.parse_archs(text)


def test_gencode_emits_sass_per_arch_and_ptx_for_the_newest() -> None:
    assert arch.gencode_flags([(9, 0), (8, 6)]) == [
        "-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90"]


def test_select_filters_at_major_minor_precision(monkeypatch) -> None:
    monkeypatch.delenv("DITGATE_KERNELS_ARCHS", raising=False)
    assert arch.select_archs("m", [(8, 6), (9, 0)], "8.0 8.6 9.0") == [(8, 6), (9, 0)]
    with pytest.raises(UnsupportedArchError) as info:
        arch.select_archs("m", [(8, 6)], "8.9")  # same major, other minor: no silent substitution
    assert "'m'" in str(info.value) and "8.9" in str(info.value) and "8.6" in str(info.value)


def test_request_order_argument_then_env_then_gpu(monkeypatch) -> None:
    monkeypatch.setenv("DITGATE_KERNELS_ARCHS", "9.0")
    monkeypatch.setattr(arch, "visible_gpu_archs", lambda: [(8, 6)])
    assert arch.requested_archs("8.0") == ([(8, 0)], "argument")
    assert arch.requested_archs() == ([(9, 0)], "DITGATE_KERNELS_ARCHS")
    monkeypatch.delenv("DITGATE_KERNELS_ARCHS")
    assert arch.requested_archs() == ([(8, 6)], "visible GPU")


def test_no_gpu_and_no_request_says_how_to_name_targets(monkeypatch) -> None:
    monkeypatch.delenv("DITGATE_KERNELS_ARCHS", raising=False)
    monkeypatch.setattr(arch, "visible_gpu_archs", lambda: [])
    with pytest.raises(UnsupportedArchError, match="DITGATE_KERNELS_ARCHS"):
        arch.select_archs("m", [(9, 0)])


def test_bad_env_archs_name_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("DITGATE_KERNELS_ARCHS", "hopper")
    with pytest.raises(ValueError, match="DITGATE_KERNELS_ARCHS"):
        arch.requested_archs()


def test_module_uri_is_deterministic_and_order_independent() -> None:
    from kernels.jit import module_uri

    assert module_uri("adaln", dtype="bf16", hidden=1152) == module_uri("adaln", hidden=1152, dtype="bf16")
    assert module_uri("adaln", dtype="bf16", hidden=1152) == "adaln__dtype_bf16__hidden_1152"
    assert module_uri("adaln", dtype="bf16") != module_uri("adaln", dtype="fp16")
    for bad in ({"dtype": "bf 16"}, {"Dtype": "bf16"}, {"dtype": "../x"}):
        with pytest.raises(ValueError):
            module_uri("adaln", **bad)


def test_every_library_module_has_its_own_uri() -> None:
    from kernels import modules

    names = [spec.name for spec in modules.all_specs()]
    assert len(names) == len(set(names)) == len(modules.OPS) * len(modules.DTYPES)
    assert "adaln__dtype_bf16" in names
    with pytest.raises(ValueError, match="unsupported dtype"):
        modules.gen_spec("adaln", "fp8")


@needs_nvcc
def test_identity_hashes_content_flags_and_archs_not_paths(tiny_source, jit_env, tmp_path) -> None:
    import os

    a = tiny_spec(tiny_source).plan("9.0")
    assert tiny_spec(tiny_source).plan("9.0").digest == a.digest
    os.utime(tiny_source, (1, 1))  # file times are not part of the identity
    assert tiny_spec(tiny_source).plan("9.0").digest == a.digest
    assert tiny_spec(tiny_source, cflags=("-DX=1",)).plan("9.0").digest != a.digest
    assert tiny_spec(tiny_source).plan("8.6 9.0").digest != a.digest
    for key in ("nvcc_version", "toolkit_root", "torch_version", "library_version", "sources", "archs"):
        assert a.identity[key]
    assert jit_env in a.module_dir.parents  # workspaces come from the env vars, never the package


@needs_nvcc
def test_library_specs_hash_their_generated_config_and_headers(jit_env) -> None:
    from kernels import modules

    plans = {dtype: modules.gen_spec("adaln", dtype).plan("9.0") for dtype in modules.DTYPES}
    assert len({p.digest for p in plans.values()}) == 3
    assert set(plans["bf16"].identity["headers"]) == {"common.cuh"}
    assert "ditgate_config.h" in plans["bf16"].identity["generated"]
