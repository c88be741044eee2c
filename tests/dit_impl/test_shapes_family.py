"""The shapes workload's pieces: the procedural family, the shipped weights bundle and its sha256 check."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")


def test_render_is_deterministic_and_per_image() -> None:
    from dit_impl.shapes.family import NUM_CLASSES, render

    labels = torch.arange(NUM_CLASSES)
    first = render(labels, torch.Generator().manual_seed(3))
    assert first.shape == (NUM_CLASSES, 3, 32, 32) and 0 <= float(first.min()) and float(first.max()) <= 1
    assert torch.equal(first, render(labels, torch.Generator().manual_seed(3)))
    # only the geometry carries the class: each image has a figure and a background of enough contrast
    assert all(len(torch.unique(image.flatten(1).round(decimals=2), dim=1).T) >= 2 for image in first)
    with pytest.raises(ValueError, match="shape labels must be in 0..9"):
        render(torch.tensor([10]), torch.Generator())


def test_shipped_bundle_matches_its_manifest() -> None:
    from dit_impl.shapes.bundle import WEIGHTS_DIR, verify_bundle

    manifest = verify_bundle(WEIGHTS_DIR)
    assert manifest["data_seed"] == 0 and "train_shapes.py" in manifest["command"]
    assert sum(entry["bytes"] for entry in manifest["files"].values()) <= 25 * 2**20


def test_tampered_weights_are_refused_by_name(tmp_path) -> None:
    from dit_impl.baseline import WeightsError, load_model
    from dit_impl.baseline.configs import get_config
    from dit_impl.shapes.bundle import BundleError, WEIGHTS_DIR, verify_bundle

    copy = tmp_path / "shapes"
    shutil.copytree(WEIGHTS_DIR, copy)
    weights = copy / "classifier.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="classifier.safetensors does not match"):
        verify_bundle(copy)
    (copy / "extra.bin").write_bytes(b"x")
    weights.write_bytes((WEIGHTS_DIR / "classifier.safetensors").read_bytes())
    with pytest.raises(BundleError, match="not in manifest.json"):
        verify_bundle(copy)
    config = get_config("dit-s-shapes")
    tampered = type(config)(**{**config.__dict__, "weights_dir": str(copy)})
    with pytest.raises(WeightsError, match="'dit-s-shapes'.*not in manifest.json"):
        load_model(tampered)


def test_shipped_classifier_reads_real_images() -> None:
    from dit_impl.shapes.family import real_images
    from dit_impl.shapes.scorer import scorer
    from pytest_ditgate.quality import learned

    classify = scorer("cpu")
    labels, images = real_images(100, seed=11)
    assert learned.class_accuracy(classify, images, labels.tolist()) >= 0.98
    real = learned.frechet_distance(classify, images)
    noise = learned.frechet_distance(classify, torch.rand(100, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    assert real < noise / 5
