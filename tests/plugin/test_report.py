"""`ditgate report`: one self-contained HTML page with history plots per lane and arch, quality, heat maps."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest

from pytest_ditgate import cli
from pytest_ditgate.bench import Measurement, compare
from pytest_ditgate.bench.ledger import LEDGER_FILE, Ledger
from pytest_ditgate.verdict.ledger import append_experiment

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, bytes]] = []
        self.headings: list[str] = []
        self.rows = 0
        self._in_heading = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "img":
            src = values.get("src") or ""
            assert src.startswith("data:image/png;base64,")
            self.images.append((values.get("alt") or "", base64.b64decode(src.split(",", 1)[1])))
        self._in_heading = tag in ("h2", "h3")
        if tag == "tr":
            self.rows += 1

    def handle_data(self, data: str) -> None:
        if self._in_heading and data.strip():
            self.headings.append(data.strip())

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "h3"):
            self._in_heading = False


def _experiment(lane: str, arch: str, label: str, ratio: float) -> dict:
    objective = {"metric": "time ratio", "ratio": ratio, "ci_low": ratio * 0.97, "ci_high": ratio * 1.03}
    return {"time_utc": "2026-11-30T00:00:00+00:00", "commit": f"c{ratio}", "arch": arch,
            "verdict": {"label": label, "lane": lane, "objective": objective, "experiment_class": "exact",
                        "reasons": [] if label == "keep" else ["t::x: [too_slow] slower"]},
            "quality": [{"case": "case0", "passed": label != "discard-quality", "metrics": {"psnr": 41.2}}]}


def test_report_renders_history_plots_quality_and_heat_maps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    for lane, arch, label, ratio in [("fwd", "sm_90", "keep", 0.5), ("fwd", "sm_90", "keep", 0.3),
                                     ("fwd", "sm_90", "discard-performance", 0.4), ("kern", "sm_86", "keep", 0.9)]:
        append_experiment(tmp_path, {"status": label}, _experiment(lane, arch, label, ratio))
    heat = tmp_path / "quality" / "case0" / "images_img0.png"
    heat.parent.mkdir(parents=True)
    Image.new("RGB", (24, 8), (255, 0, 0)).save(heat)
    ledger = Ledger(tmp_path / LEDGER_FILE)
    fwd = Measurement.from_samples([8.0, 8.1, 8.2], warmup=3, mechanism="graph", regime="sustained",
                                   l2_mode="warm", arch="sm_90", label="fwd")
    ledger.record_measurement(fwd, test="t::fwd", lane="fwd")
    ledger.record_comparison(compare(fwd, fwd), test="t::pair", lane="fwd")  # not a measurement row
    assert cli.main(["report", "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "report.html").read_text()
    assert "4 experiments, 1 measurements." in text
    assert "<td>fwd</td><td></td><td>8.10000</td><td>1.235%</td><td>3</td><td>graph</td><td>sm_90</td>" in text
    page = Page()
    page.feed(text)
    assert {"fwd / sm_90", "kern / sm_86"} <= set(page.headings)
    history = [data for alt, data in page.images if alt.startswith("history")]
    assert len(history) == 2 and all(data.startswith(PNG_MAGIC) and len(data) > 2000 for data in history)
    heatmaps = [data for alt, data in page.images if alt.endswith("images_img0.png")]
    assert heatmaps == [heat.read_bytes()]
    assert page.rows >= 1 + 4 + 1 + 4 + 1 + 1  # experiments, quality and measurement tables with headers
    assert "wrote" in capsys.readouterr().out


def test_report_of_an_empty_ledger_says_so(tmp_path: Path) -> None:
    assert cli.main(["report", "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "report.html").read_text()
    assert "No experiment with a side-by-side speed objective yet" in text
