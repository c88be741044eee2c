"""FastOptions: parsing, labels and validation (pure Python)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dit_impl.fast.options import FastOptions


def test_parse_and_label_round_trip() -> None:
    options = FastOptions.parse("fused_qkv=0, sdpa=cudnn,cuda_graphs=true")
    assert (options.fused_qkv, options.sdpa, options.cuda_graphs) == (False, "cudnn", True)
    assert options.label() == "fused_qkv=0,sdpa=cudnn,cuda_graphs=1"
    assert FastOptions.parse(options.label()) == options
    assert FastOptions.parse("default").label() == "default"


@pytest.mark.parametrize("text, match", [
    ("sdpa=fa9", "FastOptions.sdpa='fa9'"),
    ("compile=whole", "FastOptions.compile"),
    ("fused_qkv=maybe", "not a boolean"),
    ("fast=1", "bad option 'fast=1'"),
    ("dtype=int8", "FastOptions.dtype"),
])
def test_bad_options_name_the_field(text, match) -> None:
    with pytest.raises(ValueError, match=match):
        FastOptions.parse(text)


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        FastOptions().sdpa = "math"  # type: ignore[misc]


def test_importing_the_package_imports_no_torch() -> None:
    code = "import sys, dit_impl.fast, dit_impl.fast.options; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
