"""Exceptions shared by every gate. Torch-free."""

from __future__ import annotations


class GateFailure(AssertionError):
    """A gate rejected the candidate. ``reason`` is one stable code (``mismatch``, ``nonfinite``...).

    It is an ``AssertionError`` so that pytest reports it as a test failure, not an error.
    """

    def __init__(self, reason: str, message: str, *, report: object | None = None) -> None:
        super().__init__(f"[{reason}] {message}")
        self.reason = reason
        self.message = message
        self.report = report


class DitgateUsageError(ValueError):
    """Bad input from the user of the API (bad requirement spec, unknown profile, ...)."""


class ProfileError(DitgateUsageError):
    """A device profile could not be found or is malformed."""


class DitgateResourceError(DitgateUsageError):
    """A check cannot run within this machine's memory: the message names the sizes and what to change."""


class DitgateWarning(UserWarning):
    """Something a check measured that its result depends on (e.g. a reference computing in float32 during
    its float64 run)."""
