"""Version specs of requires_gpu, as pure functions."""

from __future__ import annotations

import pytest

from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.requirements import parse_version, parse_version_spec


@pytest.mark.parametrize("spec, version, expected", [
    (">=8.0", (8, 6), True), (">=8.9", (8, 6), False), ("==8.6", (8, 6), True), ("8.6", (8, 6), True),
    ("8.0-8.9", (9, 0), False), ("8.0-8.9", (8, 9), True), (">=8.0,<9.0", (9, 0), False),
    (["8.6", "9.0"], (9, 0), True), (["8.6", "9.0"], (8, 9), False), ("sm_90", (9, 0), True), ("!=9.0", (9, 0), False),
])
def test_cc_specs(spec, version, expected) -> None:
    assert parse_version_spec(spec, what="cc", arch=True).matches(version) is expected


def test_tool_versions_are_not_arch_digits() -> None:
    assert parse_version("12") == (12,)
    assert parse_version("86", arch=True) == (8, 6)
    assert parse_version_spec("==12", what="nvcc").matches((12, 4))
    assert not parse_version_spec(">=13", what="nvcc").matches((12, 4))


@pytest.mark.parametrize("bad", ["", "abc", ">>8", [], [None]])
def test_bad_specs(bad) -> None:
    with pytest.raises(DitgateUsageError):
        parse_version_spec(bad, what="cc", arch=True)


@pytest.mark.parametrize("version, release", [
    ("2.11.0+cu130", (2, 11, 0)), ("1.0rc1", (1, 0)), ("0.6.5", (0, 6, 5)), ("2026.1.post3", (2026, 1)), ("dev", (0,)),
])
def test_package_release_numbers(version, release) -> None:
    from pytest_ditgate.requirements import _release

    assert _release(version) == release


def test_package_specs_parse_names_and_versions() -> None:
    from pytest_ditgate.requirements import parse_requirements

    req = parse_requirements((), {"packages": ["quack-kernels>=0.6.5", "nvidia-cutlass-dsl", "triton>=3.0,<4"]})
    names = [name for name, _ in req.packages]
    assert names == ["quack-kernels", "nvidia-cutlass-dsl", "triton"]
    assert req.packages[1][1] is None
    assert req.packages[0][1].matches((0, 6, 5)) and not req.packages[0][1].matches((0, 6, 4))
    assert req.packages[2][1].matches((3, 6)) and not req.packages[2][1].matches((4, 0))
