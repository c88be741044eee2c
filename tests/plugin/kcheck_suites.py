"""Run a suite of ``kernel_check`` tests through pytester and assert its verdicts: the helper of the
``test_kcheck_*`` files (each planted kernel's failure reason, and how many honest ones pass)."""

from __future__ import annotations

import pytest

RUN = ("--ditgate", "-p", "no:cacheprovider", "-p", "no:randomly")


def run_suite(pytester: pytest.Pytester, source: str, *, passed: int, failed: dict[str, str]) -> str:
    """Run ``source`` as one test file; ``failed`` maps each kernel that must fail to its reason (a kernel may
    fail several tests). Returns the run's output."""
    import torch

    pytester.makepyfile(test_suite=source)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared 2-core machine torch's spinning thread pools slow small ops 10-60x
    try:
        result = pytester.runpytest(*RUN)
    finally:
        torch.set_num_threads(threads)
    out = result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == passed and outcomes.get("failed", 0) >= len(failed), (outcomes, out[-6000:])
    for kernel, reason in failed.items():
        assert f"[{reason}] kernel_check '{kernel}' failed" in out, (kernel, reason, out[-6000:])
    return out
