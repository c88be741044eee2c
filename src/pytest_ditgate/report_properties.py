"""What the plugins pass to each other through test reports: ``user_properties`` names and report
attributes. One small module that the timing, quality and verdict concerns all import (so none of them
imports another to learn a name), torch-free."""

from __future__ import annotations

#: a ``ditbench.pair`` comparison row (bench -> verdict)
COMPARISON_PROPERTY = "ditgate_comparison"
#: the ``GateFailure`` reason code of a failed test
REASON_PROPERTY = "ditgate_reason"
#: evidence about the candidate's experiment class (``quant: ...`` / ``approx: ...``)
CLASS_EVIDENCE_PROPERTY = "ditgate_class_evidence"
#: this process's peak CUDA memory in bytes
PEAK_MEMORY_PROPERTY = "ditgate_peak_memory_bytes"
#: how to rebuild this candidate (``ditgate_lane.record_config``)
CONFIG_PROPERTY = "ditgate_candidate_config"
#: report attribute holding the quality records of a call report (a list of dicts)
QUALITY_ATTRIBUTE = "ditgate_quality"
#: report attribute holding the timing summary rows of a call report
BENCH_ATTRIBUTE = "ditgate_bench"
