"""Comparison helper of the fast-DiT tests."""

from __future__ import annotations


def rel_l2(candidate, reference) -> float:
    """||candidate - reference|| / ||reference|| in float64 (zeros or noise cannot pass)."""
    c, r = candidate.double(), reference.double()
    return float((c - r).norm() / r.norm())
