"""Loading diffusers weights: saved folders, live models, and clear errors for state dicts that do not fit."""

from __future__ import annotations

import json

import pytest

from pytest_ditgate.quality.metrics import rel_l2

torch = pytest.importorskip("torch")

from dit_impl.fast import FastOptions, FastWeightsError, from_pretrained, load_diffusers_state_dict  # noqa: E402


def _out(model, inputs):
    x, t, y = inputs
    with torch.inference_mode():
        return model(x, timestep=t, class_labels=y).sample


@pytest.fixture(scope="module")
def saved_folder(tmp_path_factory, tiny_reference):
    """A diffusers pipeline-style folder: ``transformer/`` with config.json and safetensors only."""
    root = tmp_path_factory.mktemp("dit_weights")
    tiny_reference.save_pretrained(root / "transformer", safe_serialization=True)
    return root


def test_loads_from_saved_diffusers_folder(saved_folder, tiny_inputs, tiny_expected) -> None:
    for folder in (saved_folder, saved_folder / "transformer"):
        model = from_pretrained(folder, FastOptions(dtype="float32"))
        assert rel_l2(_out(model, tiny_inputs), tiny_expected) < 1e-5


def test_folder_without_safetensors_is_refused(tmp_path, saved_folder) -> None:
    (tmp_path / "config.json").write_text((saved_folder / "transformer" / "config.json").read_text())
    with pytest.raises(FastWeightsError, match="no .safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(FastWeightsError, match="does not exist"):
        from_pretrained(tmp_path / "missing")


def test_missing_key_is_named(tiny_reference) -> None:
    sd = dict(tiny_reference.state_dict())
    del sd["transformer_blocks.1.attn1.to_k.bias"]
    with pytest.raises(FastWeightsError, match=r"transformer_blocks\.1\.attn1\.to_k\.bias"):
        load_diffusers_state_dict(sd, tiny_reference.config)


def test_unexpected_key_is_named(tiny_reference) -> None:
    sd = dict(tiny_reference.state_dict())
    sd["transformer_blocks.0.attn1.norm_q.weight"] = torch.ones(16)
    with pytest.raises(FastWeightsError, match="norm_q"):
        load_diffusers_state_dict(sd, tiny_reference.config)


def test_shape_mismatch_names_the_tensor(tiny_reference) -> None:
    config = dict(tiny_reference.config)
    config["out_channels"] = 4  # the weights have learned-sigma 8-channel outputs
    with pytest.raises(FastWeightsError, match="proj_out_2.weight"):
        load_diffusers_state_dict(tiny_reference.state_dict(), config)


def test_unsupported_config_is_refused(tiny_reference) -> None:
    config = dict(tiny_reference.config, norm_type="ada_norm_single")
    with pytest.raises(ValueError, match="ada_norm_zero"):
        load_diffusers_state_dict(tiny_reference.state_dict(), config)


def test_loader_reads_json_config_written_by_diffusers(saved_folder) -> None:
    config = json.loads((saved_folder / "transformer" / "config.json").read_text())
    model = from_pretrained(saved_folder)
    assert model.shape.num_layers == config["num_layers"] and model.dtype == torch.bfloat16
