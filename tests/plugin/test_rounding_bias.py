"""``rounding_bias``: a 16-bit output whose deviations from the correctly rounded reference all go one way (a
truncating cast, round toward -inf, a one-signed approximation) fails, although each element is within an ulp;
round-to-nearest, double rounding, stochastic rounding and a row's normaliser rounded at the inputs' precision
pass."""

from __future__ import annotations

import pytest
import torch

from pytest_ditgate.correctness.compare import spacing
from pytest_ditgate.correctness.rounding import excess_bias, rounding_bias

GELU_KERNELS = '''
import torch
from pytest_ditgate import GateFailure, check_kernel


def make(seed):
    return (torch.randn(256, 1024, generator=torch.Generator().manual_seed(seed)).to(torch.{dtype}),)


def truncate(t):
    """fp32 -> bf16 by dropping the low 16 bits: round toward zero"""
    return (t.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def reference(x):
    return torch.nn.functional.gelu(x)


def nearest(x):
    return torch.nn.functional.gelu(x.float()).to(x.dtype)


def truncating(x):
    return truncate(torch.nn.functional.gelu(x.float()))


def low_by_a_tenth_percent(x):
    return (torch.nn.functional.gelu(x.float()) * (1 - 1e-3)).to(x.dtype)


def stochastic(x):
    y = torch.nn.functional.gelu(x.float())
    noise = torch.randint(0, 1 << 16, y.shape, generator=torch.Generator().manual_seed(7), dtype=torch.int32)
    return ((y.view(torch.int32) + noise) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def test_nearest():
    check_kernel(nearest, reference, make)


def test_stochastic():
    check_kernel(stochastic, reference, make, check_determinism=False)


def test_truncating():
    with pytest.raises(GateFailure) as failed:
        check_kernel(truncating, reference, make)
    assert failed.value.reason == "rounding_bias", str(failed.value)
    print(failed.value)


def test_low_by_a_tenth_percent():
    with pytest.raises(GateFailure) as failed:
        check_kernel(low_by_a_tenth_percent, reference, make)
    assert failed.value.reason == "rounding_bias", str(failed.value)


def test_truncating_accepted_when_asked():
    report = check_kernel(truncating, reference, make, check_rounding=False)
    assert "rounding_bias" not in report.checks


def test_truncating_with_a_declared_compute_dtype():
    check_kernel(truncating, reference, make, compute_dtype="bfloat16", check_precision=False)
'''


def test_a_truncating_bf16_kernel_fails_and_round_to_nearest_passes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gelu=GELU_KERNELS.replace("import pytest\n", "").replace(
        "import torch\n", "import pytest\nimport torch\n", 1).format(dtype="bfloat16"))
    result = pytester.runpytest("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([
        "*rounding_bias: out rounds toward zero (trial 1 of 5, seed 0*",
        "*out (bfloat16): * elements differ from the correctly rounded reference (round to nearest), * (100%) "
        "toward zero; mean error 0.50 ulp toward zero (round to nearest: ?0.00)*",
        "*truncating cast (round toward zero)*check_rounding=False accepts it*"])


def _gelu(seed: int, shape=(256, 1024)) -> torch.Tensor:
    return torch.nn.functional.gelu(torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                                                dtype=torch.float64))


def _toward_minus_inf(exact: torch.Tensor) -> torch.Tensor:
    ulp = spacing(exact.abs(), torch.bfloat16)
    return (torch.floor(exact / ulp) * ulp).bfloat16()


def test_each_direction_is_named_and_its_size_measured() -> None:
    exact = _gelu(0)
    down = rounding_bias(_toward_minus_inf(exact), exact)
    assert down is not None and down.direction == "toward -inf" and down.one_way == down.deviations
    assert down.bias_ulp == pytest.approx(0.5, abs=0.02) and abs(down.nearest_bias_ulp) < 0.01
    up = rounding_bias(-_toward_minus_inf(-exact), exact)
    assert up is not None and up.direction == "toward +inf"
    assert rounding_bias((exact * 1.002).bfloat16(), exact).direction == "away from zero"
    assert rounding_bias(exact.half(), exact) is None  # float16 round-to-nearest
    assert rounding_bias(exact.float(), exact) is None  # a 32-bit output: its error is its computation's
    assert rounding_bias(exact.bfloat16(), exact.bfloat16()) is None  # a reference no wider than the output


def test_honest_roundings_that_deviate_from_round_to_nearest_pass() -> None:
    """Double rounding (the input rounded to bf16 first), stochastic rounding, half-away ties, and values that all
    sit below the midpoints (where round-to-nearest itself errs one way and a stochastic rounding deviates one
    way, with less error)."""
    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = torch.nn.functional.gelu(x)
    assert rounding_bias(torch.nn.functional.gelu(x.bfloat16().double()).bfloat16(), exact) is None

    def stochastic(values: torch.Tensor, seed: int = 3) -> torch.Tensor:
        bits = values.float().view(torch.int32)
        noise = torch.randint(0, 1 << 16, bits.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
        return ((bits + noise) & ~0xFFFF).view(torch.float32).bfloat16()

    assert rounding_bias(stochastic(exact), exact) is None
    skewed = x.bfloat16().double() * (1 + 2 ** -10)  # every value 0.125..0.25 ulp above a bf16 value
    assert rounding_bias(stochastic(skewed), skewed) is None
    assert rounding_bias(skewed.bfloat16(), skewed) is None
    ties = x.bfloat16().double()[:, :1] + x.bfloat16().double()[:, 1:2]
    half_away = ((ties.float().view(torch.int32) + 0x8000) & ~0xFFFF).view(torch.float32).bfloat16()
    assert rounding_bias(half_away, ties) is None


def test_a_row_normaliser_rounded_at_the_inputs_precision_is_the_precisions_direction() -> None:
    """A softmax over one long row whose normaliser is rounded to bf16 shifts the whole row one way: every deviation
    goes the same way, which alone would read as directed rounding, but one factor reproduces the row exactly
    (``shared_rounding``). The reference written for any dtype rounds its normaliser in its own bf16 run too
    (``excess_bias`` of that run), so the kernel passes ``check_kernel``; a truncating cast of a normaliser kept
    in float32 does not."""
    from pytest_ditgate import GateFailure, check_kernel

    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(1, 32768, generator=torch.Generator().manual_seed(seed + 1)).bfloat16(),)

    def reference(x: torch.Tensor) -> torch.Tensor:
        e = x.exp()
        return e / e.sum(-1, keepdim=True)  # in bf16: the sum is rounded to bf16, as the kernel's

    def kernel(x: torch.Tensor) -> torch.Tensor:
        e = x.float().exp()
        return (e / e.sum(-1, keepdim=True).bfloat16().float()).bfloat16()

    x = make(2)[0]  # trial 3's inputs
    exact = reference(x.double())
    alone = rounding_bias(kernel(x), exact)
    assert alone is None  # its deviations all go one way, but one rounded factor reproduces the row
    assert excess_bias(reference(x), exact) >= 0.05  # and what the reference's bf16 run shows
    check_kernel(kernel, reference, make, input_scales=())

    def truncating(x: torch.Tensor) -> torch.Tensor:
        e = x.float().exp()
        return ((e / e.sum(-1, keepdim=True)).view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()

    def reference_in_float32(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x.float() if x.dtype != torch.float64 else x, -1).to(x.dtype)

    with pytest.raises(GateFailure) as failed:
        check_kernel(truncating, reference_in_float32, make, input_scales=())
    assert failed.value.reason == "rounding_bias", str(failed.value)
