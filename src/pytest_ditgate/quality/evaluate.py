"""Judge one case of a candidate against its frozen baseline under a quality contract.

:func:`evaluate_quality` computes the metrics the contract names for the experiment class, checks each
against its limit and returns a :class:`QualityResult`; it raises only for misuse (bad contract, corrupt
baseline, wrong arguments), never for a bad candidate. The baseline is always the original frozen one
(the goldens), never a previous candidate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_ditgate import dtypes
from pytest_ditgate.dtypes import CONTRACT_KEY_OF, CONTRACT_KEYS, dtype_name, torch_name
from pytest_ditgate.errors import DitgateUsageError
from pytest_ditgate.quality import metrics as M
from pytest_ditgate.quality.contract import QualityContract, Rule, load_contract
from pytest_ditgate.quality.perceptual import MissingWeights, PerceptualModels
from pytest_ditgate.quality.specs import ACTIVATION, HIGHER, IMAGE, KINDS, LATENT, METRICS

if TYPE_CHECKING:
    import torch

_defaults: PerceptualModels | None = None
#: relative rounding a score's regression may show beyond its limit and still be within it
ROUNDING = 1e-9


def default_models() -> PerceptualModels:
    """The process-wide model cache used when no session cache is passed (weights from torchvision's cache only)."""
    global _defaults
    if _defaults is None:
        _defaults = PerceptualModels()
    return _defaults


@dataclass(frozen=True)
class Check:
    """One metric of one tensor against one limit."""

    metric: str  # "<tensor>.<metric>"
    value: float
    limit: str  # readable: "min 28 (bf16)"
    passed: bool
    baseline_value: float | None = None  # score metrics only
    inherited: bool = False  # a floor the baseline already missed: reported, does not reject
    source: str = ""

    def describe(self) -> str:
        base = "" if self.baseline_value is None else f" (baseline {_fmt(self.baseline_value)})"
        where = f" [{self.source}]" if self.source else ""
        return f"{self.metric} = {_fmt(self.value)}{base} violates {self.limit}{where}"


@dataclass
class QualityResult:
    """The verdict for one case: ``passed``, readable ``failures``, metric values, skips and image paths."""

    case: str
    experiment_class: str
    dtype: str
    passed: bool = True
    failures: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    baseline_metrics: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # floors the baseline already missed
    checks: list[Check] = field(default_factory=list)
    baseline_status: str = "pass"  # against the contract's absolute floors
    candidate_status: str = "pass"
    tolerance_scale: float = 1.0
    contract: str = ""
    perceptual: list[str] = field(default_factory=list)  # learned metrics that judged this case
    structural: str | None = None  # why no metric judged this case (the contract's [structural] table)

    @property
    def transition(self) -> str:
        return f"{self.baseline_status}->{self.candidate_status}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["transition"] = self.transition
        return data

    def summary(self) -> str:
        """Multi-line text for a failure message: every failure, then images and skips."""
        lines = [f"quality case {self.case!r} ({self.experiment_class}, {self.dtype}, "
                 f"tolerance x{self.tolerance_scale:g}, {self.transition}) against {self.contract}:"]
        lines += [f"  FAIL {text}" for text in self.failures]
        lines += [f"  image: {path}" for path in self.images]
        lines += [f"  note: {text}" for text in self.notes + ([self.structural] if self.structural else [])]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def guess_kind(tensor: "torch.Tensor") -> str:
    """Default kind of a tensor: 4-D with 1 or 3 channels is an image, other 4-D/5-D a latent, else an activation."""
    if tensor.dim() == 4 and tensor.shape[1] in (1, 3):
        return IMAGE
    if tensor.dim() in (4, 5):
        return LATENT
    return ACTIVATION


def dtype_key(dtype: Any) -> str:
    """Contract dtype key (``bf16``...) for a torch dtype or a key string."""
    name = torch_name(dtype)
    if name in CONTRACT_KEYS:
        return name
    if name in CONTRACT_KEY_OF:
        return CONTRACT_KEY_OF[name]
    raise DitgateUsageError(f"unknown compute dtype {dtype!r}: use a torch floating dtype or one of "
                            f"{', '.join(CONTRACT_KEY_OF.values())}")


def least_precise(tensors: Sequence["torch.Tensor"]) -> str:
    """The least precise floating dtype key among ``tensors`` (``fp32`` when none is floating)."""
    name = dtypes.least_precise((dtype_name(t.dtype) for t in tensors), among=CONTRACT_KEY_OF)
    return CONTRACT_KEY_OF[name] if name else "fp32"


def evaluate_quality(candidate: Mapping[str, "torch.Tensor"], baseline: Mapping[str, "torch.Tensor"], *,
                     contract: QualityContract | str | Path, experiment_class: str, case: str,
                     kinds: Mapping[str, str] | None = None, tolerance_scale: float = 1.0,
                     prompts: Sequence[str] | str | None = None, labels: Sequence[int] | None = None,
                     compute_dtype: Any = None, image_range: tuple[float, float] | None = None,
                     models: PerceptualModels | None = None, image_dir: str | Path | None = None) -> QualityResult:
    """Judge ``candidate`` against the frozen ``baseline`` (dicts of named tensors) for one ``case``.

    ``kinds`` maps a key to ``image``/``latent``/``activation`` (default: :func:`guess_kind`).
    ``tolerance_scale`` (>= 1 loosens) widens every limit's distance from the ideal, e.g. when the
    golden came from a fallback device; floors and zero-regression limits stay as they are.
    ``prompts`` (one, or one per image) enable ``clip_score``; ``labels`` (one class id per image) enable
    ``class_accuracy`` (the classifier comes from ``models``); ``compute_dtype`` picks dtype-keyed
    limits (default: the least precise dtype among the candidate's tensors); ``image_range`` overrides
    the contract's; failure PNGs go under ``image_dir/<case>/`` when it is given.
    """
    if isinstance(contract, (str, Path)):
        contract = load_contract(contract)
    rules = contract.rules(experiment_class)  # an unknown class is a usage error before any work
    if not (tolerance_scale > 0 and math.isfinite(tolerance_scale)):
        raise DitgateUsageError(f"tolerance_scale must be a finite number > 0, got {tolerance_scale!r}")
    kinds = dict(kinds or {})
    for key, kind in kinds.items():
        if kind not in KINDS:
            raise DitgateUsageError(f"kinds[{key!r}] = {kind!r}: choose from {', '.join(KINDS)}")
        if key not in baseline:
            raise DitgateUsageError(f"kinds names {key!r}, which is not a baseline tensor ({', '.join(baseline)})")
    if not baseline:
        raise DitgateUsageError(f"case {case!r}: the baseline has no tensors")
    dtype = dtype_key(compute_dtype) if compute_dtype is not None else least_precise(list(candidate.values()))
    result = QualityResult(case=case, experiment_class=experiment_class, dtype=dtype,
                           tolerance_scale=tolerance_scale, contract=contract.path)
    run = _CaseRun(result, contract, tolerance_scale, prompts, image_range or contract.image_range,
                   models or default_models(), labels)
    run.prepare(candidate, baseline, kinds)
    result.structural = contract.structure_only(experiment_class, case)
    if result.structural:  # shapes, finiteness and image range were judged by prepare(); no metric means anything
        return result
    applicable = [rule for rule in rules if rule.applies_to(case)]
    if not applicable:  # judging with no rule would pass anything
        raise DitgateUsageError(f"quality contract {contract.path}: no rule of class {experiment_class!r} judges case "
                                f"{case!r} (every table's cases exclude it)")
    for rule in applicable:
        run.apply(rule)
    result.perceptual = sorted({name.rsplit(".", 1)[1] for name in result.metrics
                                if METRICS[name.rsplit(".", 1)[1]].perceptual})
    if image_dir is not None and run.failed_images:
        from pytest_ditgate.quality.images import write_failure_images

        result.images = write_failure_images(Path(image_dir), case, run.failed_images)
    return result


def judge_recorded(values: Callable[[Rule], tuple[str, float, float | None] | None], *,
                   contract: QualityContract, experiment_class: str, case: str, dtype: str) -> QualityResult:
    """The contract's checks (limits, floors, regressions, transitions) on metric values measured earlier,
    as :func:`evaluate_quality` applies them to tensors: for a calibration replaying its records.

    ``values(rule)`` gives ``(tensor key, candidate value, baseline value or None)`` for a rule, or None
    when nothing was recorded for it (that rule is then not judged)."""
    result = QualityResult(case=case, experiment_class=experiment_class, dtype=dtype, contract=contract.path)
    run = _CaseRun(result, contract, 1.0, None, contract.image_range, None)
    for rule in contract.rules(experiment_class):
        recorded = values(rule) if rule.applies_to(case) else None
        if recorded is None:
            continue
        key, value, base = recorded
        for check in run._checks(rule, f"{key}.{rule.metric}", value, base):
            run._record(check, None)
    return result


@dataclass
class _Tensor:
    key: str
    kind: str
    candidate: Any
    baseline: Any
    unit_c: Any = None  # [0, 1] images
    unit_b: Any = None


class _CaseRun:
    """State of one evaluation: prepared tensors, computed values, checks."""

    def __init__(self, result: QualityResult, contract: QualityContract, scale: float, prompts: Any,
                 image_range: tuple[float, float], models: PerceptualModels, labels: Any = None) -> None:
        self.result = result
        self.labels = None if labels is None else [int(label) for label in labels]
        self.contract = contract
        self.scale = scale
        self.prompts = [prompts] if isinstance(prompts, str) else (list(prompts) if prompts is not None else None)
        self.image_range = image_range
        self.models = models
        self.tensors: list[_Tensor] = []
        self.per_image: dict[tuple[str, str], Any] = {}  # (key, metric) -> per-image values
        self.failed_images: dict[str, dict[str, Any]] = {}

    # -- inputs ---------------------------------------------------------------------------------------
    def prepare(self, candidate: Mapping[str, Any], baseline: Mapping[str, Any], kinds: dict[str, str]) -> None:
        for key, base in baseline.items():
            try:
                M.check_finite(base, f"baseline:{key}")
            except M.NonFiniteError as exc:
                raise DitgateUsageError(f"case {self.result.case!r}: {exc} (a corrupt golden?)") from None
            kind = kinds.get(key) or guess_kind(base)
            if key not in candidate:
                self._fail(f"{key}: the candidate has no tensor {key!r} (the baseline has it, "
                           f"{tuple(base.shape)} {base.dtype}); its metrics cannot be computed")
                continue
            cand = candidate[key]
            if tuple(cand.shape) != tuple(base.shape):
                self._fail(f"{key}: candidate shape {tuple(cand.shape)} != baseline shape {tuple(base.shape)}")
                continue
            try:
                M.check_finite(cand, f"candidate:{key}")
            except M.NonFiniteError as exc:
                self._fail(f"{key}: {exc}")
                continue
            if cand.device != base.device:
                cand = cand.to(base.device)
            item = _Tensor(key, kind, cand.detach(), base.detach())
            if kind == IMAGE:
                item.unit_b = M.as_unit_images(base, f"baseline:{key}", self.image_range)  # a bad golden: misuse
                try:  # images the candidate made outside the declared range are the candidate's failure
                    item.unit_c = M.as_unit_images(cand, f"candidate:{key}", self.image_range)
                except DitgateUsageError as exc:
                    self._fail(f"{key}: {exc}")
                    continue
            self.tensors.append(item)
        good = {t.key for t in self.tensors}
        self.broken_kinds = {kinds.get(k) or guess_kind(b) for k, b in baseline.items() if k not in good}

    # -- metrics --------------------------------------------------------------------------------------
    def _pair_value(self, item: _Tensor, metric: str) -> float:
        c, b = item.candidate, item.baseline
        if item.kind == IMAGE and metric in ("psnr", "ssim", "worst_tile_mae", "lpips"):
            per = self._per_image(item, metric)
            return float(per.min() if METRICS[metric].direction == HIGHER else per.max())
        if metric == "max_ulp":
            return M.max_ulp(c, b)
        if item.kind == IMAGE:  # value-space metrics of images work in [0, 1]
            c, b = item.unit_c, item.unit_b
        return {"rel_l2": M.rel_l2, "max_abs_error": M.max_abs_error, "max_rel_error": M.max_rel_error,
                "cosine": M.cosine_similarity}[metric](c, b)

    def _per_image(self, item: _Tensor, metric: str) -> Any:
        key = (item.key, metric)
        if key not in self.per_image:
            c, b = item.unit_c, item.unit_b
            if metric == "psnr":
                value = M.psnr_per_image(c, b)
            elif metric == "ssim":
                value = M.ssim_per_image(c, b)
            elif metric == "worst_tile_mae":
                value = M.worst_tile_mae_per_image(c, b, self.contract.tile)
            else:
                value = self.models.lpips_per_image(c, b)
            self.per_image[key] = value.detach().double().cpu()
        return self.per_image[key]

    def _clip_scores(self, item: _Tensor) -> tuple[float, float]:
        if self.prompts is None:
            raise MissingWeights("clip_score needs the prompts the images were made from: pass prompts=[...] "
                                 "(one, or one per image)")
        n = item.unit_c.shape[0]
        prompts = self.prompts * n if len(self.prompts) == 1 else self.prompts
        if len(prompts) != n:
            raise DitgateUsageError(f"{item.key}: {len(self.prompts)} prompts for {n} images")
        scorer = self.models.clip(item.unit_c.device)
        return float(scorer.score(item.unit_c, prompts).mean()), float(scorer.score(item.unit_b, prompts).mean())

    def _score_values(self, item: _Tensor, metric: str) -> tuple[float, float]:
        """A score metric measured on the candidate's and on the baseline's images."""
        from pytest_ditgate.quality import learned

        if metric == "clip_score":
            return self._clip_scores(item)
        if metric == "class_accuracy" and self.labels is None:  # said before a classifier is looked for
            raise MissingWeights("class_accuracy needs the class label of every image: pass labels=[...]")
        classifier = self.models.classifier(item.unit_c.device)
        if metric == "class_accuracy":
            return (learned.class_accuracy(classifier, item.unit_c, self.labels),
                    learned.class_accuracy(classifier, item.unit_b, self.labels))
        return learned.frechet_distance(classifier, item.unit_c), learned.frechet_distance(classifier, item.unit_b)

    # -- checks ---------------------------------------------------------------------------------------
    def apply(self, rule: Rule) -> None:
        spec = rule.spec
        targets = [t for t in self.tensors if t.kind in rule.kinds]
        if not targets:
            if self.broken_kinds & set(rule.kinds):  # already failed: that tensor is missing or unusable
                return
            # not applicable: the baseline has no tensor of this kind (a candidate cannot drop one unseen:
            # a baseline tensor missing from the candidate fails in prepare())
            self.result.skipped[rule.metric] = (f"not applicable: no {' or '.join(rule.kinds)} tensor in this case "
                                                f"({', '.join(f'{t.key}:{t.kind}' for t in self.tensors)})")
            return
        for item in targets:
            name = f"{item.key}.{rule.metric}"
            try:
                if spec.pair:
                    value, base_value = self._pair_value(item, rule.metric), None
                else:
                    value, base_value = self._score_values(item, rule.metric)
            except MissingWeights as exc:
                self._missing(rule, name, str(exc))
                continue
            self.result.metrics[name] = value
            if base_value is not None:
                self.result.baseline_metrics[name] = base_value
            for check in self._checks(rule, name, value, base_value):
                self._record(check, item)

    def _checks(self, rule: Rule, name: str, value: float, base: float | None) -> list[Check]:
        spec, dtype, out = rule.spec, self.result.dtype, []
        tag = f"({rule.experiment_class}, {dtype})"
        for key in ("min", "max"):
            bound = rule.limit(key, dtype)
            if bound is None:
                continue
            if spec.pair:
                bound = self._loosen(spec.ideal, bound)
            ok = value >= bound if key == "min" else value <= bound
            inherited = False
            if base is not None:  # a floor on a score: the baseline is judged by it too
                base_ok = base >= bound if key == "min" else base <= bound
                if not base_ok:
                    self.result.baseline_status = "fail"
                inherited = not ok and not base_ok
            scaled = "" if not spec.pair or self.scale == 1.0 else f", x{self.scale:g} tolerance"
            out.append(Check(name, value, f"{key} {_fmt(bound)} {tag}{scaled}", ok, base, inherited, rule.source))
        if base is not None:
            regression = base - value if spec.direction == HIGHER else value - base
            # a regression equal to its limit is within it, whatever the last bit of its subtraction says (an
            # accuracy over ten images moves in steps of 0.1: 0.8 - 0.7 reads 0.10000000000000009)
            slack = ROUNDING * max(1.0, abs(base))
            if rule.experiment_class == "quantization":  # zero regression, within the measured seed noise
                allowed = rule.noise or 0.0
                label = ("no regression (quantization: candidate must match or beat the baseline)" if not allowed
                         else f"no regression beyond seed noise {_fmt(allowed)} (quantization)")
                out.append(Check(name, value, f"{label} {tag}", regression <= allowed + slack, base, False,
                                 rule.source))
                return out
            abs_lim, rel_lim = rule.limit("abs", dtype), rule.limit("rel", dtype)
            if abs_lim is not None or rel_lim is not None:
                allowed = ((abs_lim or 0.0) + (rel_lim or 0.0) * abs(base)) * self.scale
                label = f"regression <= {_fmt(allowed)} (abs {abs_lim}, rel {rel_lim})"
                out.append(Check(name, value, f"{label} {tag}", regression <= allowed + slack, base, False,
                                 rule.source))
        return out

    def _loosen(self, ideal: float | None, bound: float) -> float:
        """Widen a pair-metric bound's distance from the ideal by the tolerance scale."""
        if self.scale == 1.0 or ideal is None:
            return bound
        if math.isinf(ideal):  # PSNR: error amplitude x scale costs 20*log10(scale) dB
            return bound - 20.0 * math.log10(self.scale)
        return ideal + (bound - ideal) * self.scale

    def _record(self, check: Check, item: _Tensor | None) -> None:
        self.result.checks.append(check)
        if check.passed:
            return
        self.result.candidate_status = "fail"
        if check.inherited:
            self.result.notes.append(f"{check.describe()}; the baseline misses it too (fail->fail: does not reject)")
            return
        self._fail(check.describe())
        if item is not None and item.kind == IMAGE:
            self.failed_images.setdefault(item.key, {"candidate": item.unit_c, "baseline": item.unit_b,
                                                     "tile": self.contract.tile, "per_image": {}})
            metric = check.metric.rsplit(".", 1)[1]
            if (item.key, metric) in self.per_image:
                self.failed_images[item.key]["per_image"][metric] = self.per_image[(item.key, metric)]

    def _missing(self, rule: Rule, name: str, why: str) -> None:
        if rule.required:
            self._fail(f"{name}: required by {rule.source} but not computed: {why}")
        else:
            self.result.skipped[name] = why

    def _fail(self, text: str) -> None:
        self.result.passed = False
        self.result.candidate_status = "fail"
        self.result.failures.append(text)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        return str(value)
    return f"{value:.6g}"
