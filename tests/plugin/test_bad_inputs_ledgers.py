"""Ledgers and record files: appends are newline-safe and atomic under the lock, readers report what they
skip, ``ditgate report`` survives wrong-shape lines and a missing matplotlib, generated folders are ignored
by git. No pytest run is needed for most of these: they exercise the readers and writers directly."""

from __future__ import annotations

import json
import multiprocessing
import sys
import warnings
from pathlib import Path

import pytest

from pytest_ditgate import cli
from pytest_ditgate.bench.ledger import Ledger
from pytest_ditgate.fsutil import (GITIGNORE_TEXT, CorruptFile, LedgerWarning, append_jsonl, atomic_write_text,
                                   ensure_gitignore, read_json_object, read_jsonl_report, remove_stale_temps,
                                   skipped_message)


def test_append_after_a_torn_line_keeps_the_new_record(tmp_path: Path) -> None:
    ledger = tmp_path / "bench.jsonl"
    ledger.write_bytes(b'{"kind": "measurement"}\n{"kind": "compar')  # a writer killed mid-line
    append_jsonl(ledger, {"kind": "comparison", "n": 1})
    content = read_jsonl_report(ledger)
    assert content.records == [{"kind": "measurement"}, {"kind": "comparison", "n": 1}]
    assert content.bad == [2]
    assert content.skipped_message() == (f"{ledger}: skipped 1 unreadable line(s) (2): not a JSON object "
                                         "(a torn write or a hand edit)")


def test_one_message_for_skipped_lines_and_rows(tmp_path: Path) -> None:
    """results.tsv's rows and a JSONL ledger's lines are reported by one formatter (ten numbers shown)."""
    from pytest_ditgate.verdict.ledger import read_results

    tsv = tmp_path / "results.tsv"
    tsv.write_bytes(b"a\tb\n" + b"torn\n" * 12 + b"1\t2\n")
    skipped: list[str] = []
    assert read_results(tmp_path, skipped) == [{"a": "1", "b": "2"}]
    assert skipped == [skipped_message(tsv, list(range(2, 14)), "row", "not UTF-8 or not 2 tab-separated cells")]
    assert skipped[0] == (f"{tsv}: skipped 12 unreadable row(s) (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...): not UTF-8 "
                          "or not 2 tab-separated cells (a torn write or a hand edit)")
    assert skipped_message(tsv, [], "row", "x") is None


def _append_many(path: str, worker: int) -> None:
    for i in range(40):
        append_jsonl(path, {"worker": worker, "i": i, "pad": "x" * 3000})


def test_concurrent_appends_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "bench.jsonl")
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    workers = [context.Process(target=_append_many, args=(path, w)) for w in range(4)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(30)
    content = read_jsonl_report(path)
    assert content.bad == [] and len(content.records) == 160
    assert {(r["worker"], r["i"]) for r in content.records} == {(w, i) for w in range(4) for i in range(40)}


@pytest.mark.parametrize(("raw", "bad"), [
    (b'{"a": 1}\n\xff\xfe\n{"b": 2}\n', [2]),          # not UTF-8
    (b'{"a": 1}\n[1, 2]\n"text"\n{"b": 2}\n', [2, 3]),  # JSON, but not objects
    (b'{"a": 1}\r\n{"b": 2}\r\n', []),                  # CRLF line ends are fine
    (b'{"a": 1}\n{"b": NaN}\n{"c": \n', [3]),            # NaN is valid for Python's json; a cut line is not
])
def test_readers_count_every_skipped_line(tmp_path: Path, raw: bytes, bad: list[int]) -> None:
    (tmp_path / "x.jsonl").write_bytes(raw)
    assert read_jsonl_report(tmp_path / "x.jsonl").bad == bad


def test_best_lookup_warns_about_what_it_skips(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "bench.jsonl")
    common = {"kind": "comparison", "test": "t", "arch": "sm_86", "lane": "l", "driver": None, "torch": None}
    ledger.append({**common, "ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6, "passed": True})
    ledger.append({**common, "ratio": "fast", "ci_low": 0.1, "ci_high": 0.2})  # wrong shape
    ledger.append({**common, "ratio": float("nan"), "ci_low": 0.1, "ci_high": 0.2})
    with ledger.path.open("a") as handle:
        handle.write("garbage\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best = ledger.best(test="t", arch="sm_86", lane="l", driver=None, torch=None)
    assert best is not None and best["ratio"] == 0.5
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, LedgerWarning))
    assert messages == [f"{ledger.path}: skipped 1 unreadable line(s) (4): not a JSON object (a torn write or a hand edit)",
                        f"{ledger.path}: skipped 2 comparison record(s) without a finite ratio, ci_low and ci_high (lines 2, 3)"]


@pytest.mark.parametrize(("raw", "message"), [
    (b"\xff", "best record {path}: not UTF-8 text*"),
    (b"{", "best record {path}: not valid JSON*"),
    (b"[]", "best record {path}: must hold a JSON object, found list"),
])
def test_record_files_that_cannot_be_read_name_the_file(tmp_path: Path, raw: bytes, message: str) -> None:
    import fnmatch

    path = tmp_path / "best.json"
    path.write_bytes(raw)
    with pytest.raises(CorruptFile) as info:
        read_json_object(path, what="best record")
    assert fnmatch.fnmatch(str(info.value), message.format(path=path).replace("[", "[[]"))
    assert read_json_object(tmp_path / "absent.json") is None


def _report(root: Path, capsys) -> tuple[int, str, str]:
    code = cli.main(["report", "--dir", str(root)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_report_survives_wrong_shape_lines_and_says_what_it_left_out(tmp_path: Path, capsys,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    (tmp_path / "experiments.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"verdict": "keep"}, {"verdict": {"objective": {"ratio": "x"}, "reasons": "no list"}, "quality": [1, {"metrics": 3}]},
        {"verdict": {"lane": "fwd", "label": "keep", "objective": {"ratio": 0.5, "ci_low": 0.4, "ci_high": 0.6}}},
    ]) + "\n{torn")
    (tmp_path / "bench.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "measurement", "measurement": "not an object"},
        {"kind": "measurement", "measurement": {"median_ms": "slow", "cv": None, "label": "<b>x</b>"}},
        {"kind": "comparison", "ratio": None},
        {"kind": "comparison", "test": "t::pair", "ratio": 0.8, "ci_low": 0.7, "ci_high": 0.9, "passed": True,
         "comparison": {"a": {"label": "cand"}, "b": {"label": "ref"}}},
    ]) + "\n")
    code, out, err = _report(tmp_path, capsys)
    assert code == 0 and "wrote" in out and "Traceback" not in err
    assert "ditgate report: note: matplotlib is not installed: the history plots are left out" in err
    assert f"{tmp_path / 'experiments.jsonl'}: skipped 1 unreadable line(s) (4)" in err
    assert "left out 1 measurement record(s) without a 'measurement' object" in err
    assert "left out 1 comparison record(s) without a finite ratio" in err
    page = (tmp_path / "report.html").read_text()
    assert "<td>pair</td><td>cand / ref</td>" in page and "0.8000" in page and "PASS" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_report_of_a_missing_folder_is_a_usage_error(tmp_path: Path, capsys) -> None:
    code, _, err = _report(tmp_path / "nowhere", capsys)
    assert code == 4 and f"ditgate report: error: --dir {tmp_path / 'nowhere'}: no such ledger folder" in err


def test_generated_folders_get_a_gitignore_and_stale_temps_go(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / ".ditgate" / "bench.jsonl")
    ledger.append({"kind": "measurement"})
    assert (tmp_path / ".ditgate" / ".gitignore").read_text() == GITIGNORE_TEXT
    own = tmp_path / "mine"
    own.mkdir()
    (own / ".gitignore").write_text("keep\n")
    ensure_gitignore(own)
    assert (own / ".gitignore").read_text() == "keep\n"  # never replaces the user's
    stale = tmp_path / "g" / "cpu" / ".a.safetensors.x1y2.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    atomic_write_text(tmp_path / "g" / "cpu" / "b.txt", "whole")
    assert remove_stale_temps(tmp_path / "g") == [stale] and not stale.exists()
    assert sorted(p.name for p in (tmp_path / "g" / "cpu").iterdir()) == ["b.txt"]


def test_an_append_line_may_not_smuggle_a_newline(tmp_path: Path) -> None:
    from pytest_ditgate.fsutil import append_line

    for text in ("a\nb", "a\rb"):
        with pytest.raises(ValueError, match="must not contain a newline"):
            append_line(tmp_path / "x.jsonl", text)
    assert not (tmp_path / "x.jsonl").exists()


LANE_TEST = """
def test_ok():
    pass
"""


def test_a_lane_best_of_the_wrong_shape_is_a_reported_integrity_problem(pytester: pytest.Pytester) -> None:
    """A best file holding ``{}`` used to crash the session end, with no verdict written."""
    pytester.makepyfile(test_lane=LANE_TEST)
    pytester.makepyprojecttoml('[tool.ditgate.lanes.l]\ntests = ["test_lane.py"]\n')
    from pytest_ditgate.device import real_device

    best = pytester.path / ".ditgate" / "best" / f"l__{real_device().arch}.json"
    best.parent.mkdir(parents=True)
    best.write_text("{}")
    result = pytester.runpytest("--ditgate", "--ditgate-lane=l", "--ditgate-verdict-json=verdict.json",
                                "-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    verdict = json.loads((pytester.path / "verdict.json").read_text())["verdict"]
    assert result.ret == verdict["exit_code"] != 0
    assert any(f"best record {best} is corrupt (no 'objective' object)" in r for r in verdict["reasons"]), verdict
    assert best.read_text() == "{}"  # reported, never overwritten by the plugin


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: root.joinpath("out").mkdir(), "--ditgate-verdict-json=out: is a folder; give the path of a JSON file to write"),
    (lambda root: root.joinpath("plain").write_text("x"), "--ditgate-verdict-json=plain/v.json: plain is not a folder"),
])
def test_a_verdict_json_path_that_cannot_be_written_is_a_usage_error(pytester: pytest.Pytester, make, message) -> None:
    pytester.makepyfile(test_lane=LANE_TEST)
    make(pytester.path)
    flag = message.split(":")[0]
    result = pytester.runpytest("--ditgate", flag, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "Traceback" not in result.stderr.str()


def test_summary_names_the_rows_it_skips(tmp_path: Path, capsys) -> None:
    from pytest_ditgate.verdict.ledger import append_experiment

    append_experiment(tmp_path, {"status": "keep", "commit": "aaa", "description": "first"},
                      {"verdict": {"lane": "fwd"}, "commit": "aaa"})
    with (tmp_path / "results.tsv").open("ab") as handle:
        handle.write(b"torn\trow\n\xff\xfe\n")
    with (tmp_path / "experiments.jsonl").open("a") as handle:
        handle.write('{"verdict": "not an object", "commit": "bbb"}\n{torn\n')
    assert cli.main(["summary", "--dir", str(tmp_path), "--lane", "fwd"]) == 0
    captured = capsys.readouterr()
    assert "first" in captured.out
    assert (f"warning: {tmp_path / 'results.tsv'}: skipped 2 unreadable row(s) (3, 4): not UTF-8 or not 12 "
            "tab-separated cells") in captured.err
    assert f"warning: {tmp_path / 'experiments.jsonl'}: skipped 1 unreadable line(s) (3)" in captured.err
