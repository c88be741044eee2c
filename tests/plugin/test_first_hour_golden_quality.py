"""A new user's first hour with ``golden`` and ``quality_gate`` (issue 37): arguments of the wrong kind are
usage errors naming the argument before anything is read, queued or written (never an AttributeError from
the serializer or comparator, never ``unhashable type: 'dict'``), and a failure opens with a short line for
the fixture, not its repr."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

BAD_GOLDEN = """
import numpy as np
import torch

def test_list(golden):
    golden.check("g", [torch.zeros(3)])

def test_numpy_values(golden):
    golden.check("g", {"x": np.zeros(3)})

def test_numpy_array(golden):
    golden.check("g", np.zeros(3))

def test_bare_tensor(golden):
    golden.check("g", torch.zeros(3))

def test_frozen_with_a_string(golden):
    golden.check("g", {"x": torch.zeros(3)}, metadata={"seed": 1}, frozen_with="seed")

def test_compare_not_callable(golden):
    golden.check("g", {"x": torch.zeros(3)}, compare="strict")

def test_bad_device(golden):
    golden.check("g", {"x": torch.zeros(3)}, device="gpu")
"""

MESSAGES = [
    "E   *golden.check('g', tensors): tensors must be a mapping of names to torch tensors, like {'out': "
    "tensor}; got list of 1 x torch.Tensor float32[[]3[]] on cpu",
    "E   *golden.check('g', tensors): tensors[[]'x'[]] is numpy.ndarray float64[[]3[]], not a torch "
    "tensor (convert it with torch.from_numpy)*",
    "E   *golden.check('g', tensors): tensors must be a mapping*got one numpy.ndarray float64[[]3[]]",
    "E   *golden.check('g', tensors): tensors must be a mapping*got one torch.Tensor float32[[]3[]] on cpu",
    "E   *golden.check('g', tensors): frozen_with must be a list of strings (like "
    "[[]'seed'[]]), got str 'seed'",
    "E   *golden.check('g', tensors): compare must be a callable*got str 'strict'",
    "E   *golden: device=str 'gpu': give a golden key ('cpu', 'sm_90'), a torch.device or a device "
    "string like 'cuda:0'",
]


@pytest.mark.parametrize("mode", [[], ["--ditgate-freeze"]], ids=["check", "freeze"])
def test_golden_check_refuses_what_is_not_named_tensors_and_writes_nothing(pytester: pytest.Pytester, mode) -> None:
    pytester.makepyfile(test_bad_golden=BAD_GOLDEN)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider", *mode)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=7)
    result.stdout.fnmatch_lines(MESSAGES, consecutive=False)
    out = result.stdout.str()
    assert "AttributeError" not in out and "serializer.py" not in out and "comparator.py" not in out
    assert not (pytester.path / "golden").exists()  # nothing frozen, nothing queued


def test_a_comparator_returning_a_bool_is_a_usage_error_and_its_exception_is_its_own(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_g="""
        import torch
        def test_freeze(golden):
            golden.check("g", {"x": torch.ones(3)})
    """)
    pytester.runpytest("--ditgate", "--ditgate-freeze", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    manifest = (pytester.path / "golden" / "manifest.json").read_bytes()
    pytester.makepyfile(test_g="""
        import torch
        def close(candidate, hit):
            return True

        def broken(candidate, hit):
            return candidate["y"]

        def test_bool(golden):
            golden.check("g", {"x": torch.ones(3)}, compare=close)

        def test_raises(golden):
            golden.check("g", {"x": torch.ones(3)}, compare=broken)

        def test_mismatch(golden):
            golden.check("g", {"x": torch.zeros(3)})
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines([
        "*golden 'g': compare must return a result with a boolean passed (and optionally lines()), got bool True",
        "*return candidate[[]\"y\"[]]", "E       KeyError: 'y'", "E       ditgate: raised by the comparator `broken` of golden 'g'",
        "golden = <golden fixture: check mode, store *golden>",
        "*[[]golden_mismatch[]] golden 'g' for cpu does not match:*"])
    out = result.stdout.str()
    assert "Golden(session=" not in out and "GoldenSession(" not in out  # the fixture is one short line
    assert "golden/session.py" not in out
    assert (pytester.path / "golden" / "manifest.json").read_bytes() == manifest  # nothing written or lost


BAD_QUALITY = """
import torch
img = torch.rand(1, 3, 8, 8)

def test_dict_as_case(quality_gate):
    quality_gate.check({"img": img}, img, img)

def test_scale_as_text(quality_gate):
    quality_gate.check("c", img, img, tolerance_scale="2")

def test_numpy(quality_gate):
    quality_gate.check("c", {"img": img.numpy()}, {"img": img})

def test_labels(quality_gate):
    quality_gate.check("c", img, img, labels="3")

def test_class(quality_gate):
    quality_gate.check("c", img, img, experiment_class="fast")
"""


def test_quality_gate_check_names_the_bad_argument(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_q=BAD_QUALITY)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=5)
    result.stdout.fnmatch_lines([
        "E   *quality_gate.check(case, candidate, baseline): case must be the case's name (a non-empty "
        "string) and comes first; got dict {'img': torch.Tensor float32[[]1, 3, 8, 8[]] on cpu}",
        "E   **tolerance_scale must be > 0 (a finite number), got str '2'",
        "E   *quality_gate.check('c', candidate, baseline): candidate[[]'img'[]] must be a torch tensor named "
        "by a string, got numpy.ndarray float32[[]1, 3, 8, 8[]] (convert it with torch.from_numpy)",
        "E   **labels must be a list of class ids (ints), one per image, got str '3'",
        "E   **experiment_class='fast': choose from exact, numerical, approximate, quantization*",
    ], consecutive=False)
    out = result.stdout.str()
    assert "unhashable" not in out and "quality_plugin.py" not in out
    assert "quality_gate = <quality_gate fixture: class numerical, contract " in out
    assert not (pytester.path / ".ditgate" / "quality").exists()  # nothing judged, no images written


def test_declaring_a_candidate_checks_what_it_is_given(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_c="""
        def test_not_a_module(ditgate_candidate):
            ditgate_candidate.declare("model.safetensors")

        def test_one_state_dict(ditgate_candidate):
            import torch
            ditgate_candidate.declare(torch.nn.Linear(2, 2), state_dicts={"w": torch.zeros(1)})
    """)
    result = pytester.runpytest("--ditgate", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["E   *: module 0 must be a torch.nn.Module, got str 'model.safetensors'",
                                 "E   *: state_dicts must be a list of state dicts, got dict {'w': torch.Tensor*"],
                                consecutive=False)
    assert "ditgate_candidate = <ditgate_candidate fixture: class numerical>" in result.stdout.str()
