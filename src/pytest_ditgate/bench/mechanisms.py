"""The timing mechanisms, one record each: what it counts, its regime, whether it needs a device, its sampler.

What decides a speed verdict is what the caller waits for: a call's **latency**, host gaps, synchronisations and
launch gaps included. ``auto`` takes the first latency mechanism that works (``latency`` on a GPU; ``wall`` on
the host, and for a call that does no device work on a GPU host). The **busy** mechanisms count the device's
busy time only (``cupti``: kernel time; ``graph``: the calls replayed in a CUDA graph, where no host gap can
exist): explicit choices, labelled so wherever they appear. A new mechanism is a record here and its sampler
in its own module.

Light: option parsing imports this module; samplers are imported when a measurement runs.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

#: what a mechanism counts
LATENCY = "latency"
BUSY = "busy"


@dataclass(frozen=True)
class Mechanism:
    """One way of timing a call. ``sampler`` is ``module:function``, called as
    ``function(calls, order, *, flush, regime, estimates)`` and returning one list of milliseconds per call
    (with optional ``calls_per_sample`` and ``extras`` attributes)."""

    name: str
    counts: str
    regime: str
    device: bool
    description: str
    sampler: str

    def load(self) -> Callable[..., Any]:
        module, _, function = self.sampler.partition(":")
        return getattr(importlib.import_module(module), function)

    @property
    def label(self) -> str:
        """How a time of this mechanism is labelled: ``latency`` or ``busy (kernel time only)``."""
        return LATENCY if self.counts == LATENCY else "busy (kernel time only)"


RECORDS = (
    Mechanism("latency", LATENCY, "sustained", True,
              "calls issued back to back in batches, CUDA events around each batch, divided by the calls in it "
              "(as many back-to-back calls with one synchronisation, and triton's do_bench, measure): what a "
              "caller waits for per call, host work, synchronisations and launch gaps included",
              "pytest_ditgate.bench.timers:time_latency"),
    Mechanism("events", LATENCY, "spaced", True,
              "CUDA events on the current stream around each call, the device synchronised after it: the latency "
              "of an isolated call, its launch included (kernels of a few microseconds read several times slower "
              "than back to back)",
              "pytest_ditgate.bench.timers:time_events"),
    Mechanism("wall", LATENCY, "spaced", False,
              "host clock around each call with a device synchronisation: includes launch and sync latency (the "
              "only mechanism without a GPU)",
              "pytest_ditgate.bench.timers:time_wall"),
    Mechanism("cupti", BUSY, "spaced", True,
              "kernel activity from the CUDA profiler: the time the device was busy with each call (union of its "
              "kernel, memcpy and memset intervals), no host gap, no launch overhead: kernel time only",
              "pytest_ditgate.bench.timers:time_cupti"),
    Mechanism("graph", BUSY, "sustained", True,
              "calls captured in one CUDA graph, each replay queued behind an untimed lead replay (the device "
              "never waits for the host), timed with CUDA events and divided by the count: back-to-back kernels, "
              "no launch overhead, no host work (a call that synchronises cannot be captured)",
              "pytest_ditgate.bench.graphs:time_graph_mechanism"),
)
BY_NAME = {m.name: m for m in RECORDS}
#: every mechanism's name (option choices)
MECHANISMS = tuple(m.name for m in RECORDS)
#: what ``auto`` tries, in order: the latency mechanisms (what a caller waits for)
AUTO_ORDER = tuple(m.name for m in RECORDS if m.counts == LATENCY)
#: the mechanisms that time on a device
DEVICE_TIMERS = tuple(m.name for m in RECORDS if m.device)


def counts(name: str | None) -> str | None:
    """``latency`` or ``busy`` for a mechanism name (None for an unknown one)."""
    found = BY_NAME.get(str(name))
    return found.counts if found else None
