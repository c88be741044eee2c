"""The benchmark corpus loader: the shipped corpus is valid and every bad field is named."""

from __future__ import annotations

import pytest

from dit_impl.corpus import CorpusError, load_corpus, select

GOOD = """
version = 1
[defaults]
scheduler = "ddim"
guidance_scale = 4.0
[[case]]
name = "a"
config = "tiny"
class_labels = [1, 2]
seed = 0
steps = 4
resolution = 16
"""


def test_shipped_corpus_is_valid() -> None:
    cases = load_corpus()
    assert len({c.name for c in cases}) == len(cases)
    assert select(cases, config="tiny", tag="cpu") and select(cases, config="dit-xl-2-256")
    assert select(cases, config="dit-s-shapes", tag="cpu") and select(cases, config="dit-s-shapes", tag="gpu")


def test_repeat_cycles_the_labels(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD.replace("steps = 4", "steps = 4\nrepeat = 3"))
    (case,) = load_corpus(path)
    assert case.labels == [1, 2, 1, 2, 1, 2] and case.sample_kwargs()["class_labels"] == case.labels


def test_defaults_apply(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    (case,) = load_corpus(path)
    assert (case.scheduler, case.guidance_scale, case.class_labels, case.record_steps) == ("ddim", 4.0, (1, 2), ())


@pytest.mark.parametrize("edit, message", [
    (("seed = 0", "seed = -1"), "case 'a': field 'seed' must be an int >= 0, got -1"),
    (("seed = 0", 'seed = "0"'), "field 'seed' must be an int >= 0"),
    (("seed = 0\n", ""), "case 'a': missing field(s) 'seed'"),
    (("class_labels = [1, 2]", "class_labels = [1, 1000]"), "field 'class_labels' must be a non-empty list of ints in 0..999"),
    (("resolution = 16", "resolution = 32"), "field 'resolution' must be 16 (the resolution of config 'tiny')"),
    (('config = "tiny"', 'config = "huge"'), "field 'config' must be one of dit-s-shapes, dit-xl-2-256, tiny"),
    (("steps = 4", "steps = 4\nrecord_steps = [4]"), "field 'record_steps' must be a list of step indices in -4..3"),
    (("steps = 4", "steps = 4\nsedd = 3"), "unknown field(s) 'sedd'"),
    (('scheduler = "ddim"', 'scheduler = "pndm"'), "field 'scheduler' must be one of ddim, dpm-multistep, euler"),
    (("version = 1", "version = 2"), "field 'version' must be 1"),
    (("steps = 4", "steps = 4\nrepeat = 0"), "field 'repeat' must be an int >= 1, got 0"),
    (('config = "tiny"\nclass_labels = [1, 2]\nseed = 0\nsteps = 4\nresolution = 16',
      'config = "dit-s-shapes"\nclass_labels = [3, 10]\nseed = 0\nsteps = 4\nresolution = 32'),
     "field 'class_labels' must be a non-empty list of ints in 0..9 (the classes of 'dit-s-shapes')"),
])
def test_bad_fields_are_named_with_the_file(tmp_path, edit, message) -> None:
    path = tmp_path / "corpus.toml"
    path.write_text(GOOD.replace(*edit, 1))
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_duplicate_names_and_missing_file(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD + GOOD.split("[[case]]")[1].join(["[[case]]", ""]))
    with pytest.raises(CorpusError, match="field 'name' is used twice"):
        load_corpus(path)
    with pytest.raises(CorpusError, match="corpus file not found"):
        load_corpus(tmp_path / "none.toml")
    path.write_text("version = [")
    with pytest.raises(CorpusError, match="cannot parse TOML"):
        load_corpus(path)
