"""``FastOptions.tf32``: TF32 for the forward's float32 matmuls and convolutions, switched on around each forward
only and the previous settings restored after it (also when the forward raises)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dit_impl.baseline import load_model  # noqa: E402
from dit_impl.fast import FastOptions, fast_model  # noqa: E402

FLAGS = (torch.backends.cuda.matmul, torch.backends.cudnn)


def flags() -> tuple[bool, bool]:
    return tuple(bool(f.allow_tf32) for f in FLAGS)


@pytest.fixture
def restore_flags():
    saved = flags()
    yield
    for flag, value in zip(FLAGS, saved):
        flag.allow_tf32 = value


@pytest.mark.parametrize("enabled", [True, False])
def test_tf32_is_on_inside_the_forward_only(restore_flags, enabled) -> None:
    model = fast_model(load_model("tiny", seed=2), FastOptions(dtype="float32", sdpa="math", tf32=enabled)).transformer
    for flag in FLAGS:
        flag.allow_tf32 = False
    seen = []
    handle = model.transformer_blocks[0].register_forward_pre_hook(lambda *_: seen.append(flags()))
    with torch.inference_mode():
        model(torch.randn(2, 4, 8, 8), timestep=torch.tensor([5, 5]), class_labels=torch.tensor([1, 2]))
    handle.remove()
    assert seen == [(enabled, enabled)] and flags() == (False, False)
    assert model.report()["tf32"] is enabled


def test_tf32_settings_come_back_when_the_forward_raises(restore_flags) -> None:
    model = fast_model(load_model("tiny", seed=2), FastOptions(dtype="float32", sdpa="math", tf32=True)).transformer
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True

    def fail(*_):
        raise RuntimeError("inside the forward")

    handle = model.transformer_blocks[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="inside the forward"), torch.inference_mode():
        model(torch.randn(2, 4, 8, 8), timestep=torch.tensor([5, 5]), class_labels=torch.tensor([1, 2]))
    handle.remove()
    assert flags() == (False, True)
