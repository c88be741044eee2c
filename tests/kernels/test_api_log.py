"""API logging levels: 0 is the undecorated function; higher levels log before the launch; dumps are bounded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernels.jit import api_log  # noqa: E402


@pytest.fixture
def log_env(tmp_path, monkeypatch):
    for name in (api_log.LEVEL, api_log.DUMP_DIR, api_log.DUMP_MAX_COUNT, api_log.DUMP_MAX_BYTES,
                 api_log.DUMP_INCLUDE, api_log.DUMP_EXCLUDE):
        monkeypatch.delenv(name, raising=False)
    logfile = tmp_path / "api.log"
    monkeypatch.setenv(api_log.DEST, str(logfile))
    api_log.reset_dump_budget()

    def decorate(level: int, fn=None, **env):
        monkeypatch.setenv(api_log.LEVEL, str(level))
        for key, value in env.items():
            monkeypatch.setenv(key, str(value))

        def scale_add(x, gate, eps=1e-6):
            return x * gate + eps

        return api_log.api_log(fn or scale_add)

    decorate.logfile = logfile
    decorate.dumps = tmp_path / "dumps"
    return decorate


def _log(env) -> str:
    return env.logfile.read_text() if env.logfile.exists() else ""


def test_level_zero_returns_the_function_itself(log_env) -> None:
    def kernel(x):
        return x

    assert log_env(0, kernel) is kernel
    assert _log(log_env) == ""


def test_level_one_logs_the_name_only(log_env) -> None:
    fn = log_env(1)
    fn(torch.ones(2), torch.ones(2))
    text = _log(log_env)
    assert "scale_add" in text and "shape" not in text


def test_level_three_logs_inputs_and_outputs(log_env) -> None:
    fn = log_env(3)
    x = torch.ones(2, 3, dtype=torch.bfloat16)[:, :2]
    fn(x, torch.ones(2), eps=0.5)
    text = _log(log_env)
    assert "x=Tensor(shape=(2, 2), dtype=bfloat16, stride=(3, 1), device=cpu)" in text
    assert "eps=0.5" in text and "scale_add ->" in text and "min=" not in text


def test_level_five_adds_statistics_with_nan_and_inf_counts(log_env) -> None:
    fn = log_env(5)
    fn(torch.tensor([1.0, float("nan"), float("inf"), -2.0]), torch.ones(4))
    text = _log(log_env)
    assert "min=-2 max=1" in text and "nan=1 inf=1" in text


def test_inputs_are_logged_and_dumped_before_the_launch(log_env) -> None:
    from safetensors.torch import load_file

    def crashing(x):
        raise RuntimeError("illegal memory access")

    fn = log_env(10, crashing, **{api_log.DUMP_DIR: log_env.dumps})
    with pytest.raises(RuntimeError):
        fn(torch.arange(6.0))
    assert "crashing(" in _log(log_env)
    files = list(log_env.dumps.glob("*_crashing_inputs.safetensors"))
    assert len(files) == 1
    torch.testing.assert_close(load_file(str(files[0]))["x"], torch.arange(6.0))


def test_dumps_respect_the_count_limit(log_env) -> None:
    fn = log_env(10, **{api_log.DUMP_DIR: log_env.dumps, api_log.DUMP_MAX_COUNT: 3})
    for _ in range(5):
        fn(torch.ones(4), torch.ones(4))
    assert len(list(log_env.dumps.glob("*.safetensors"))) == 3
    assert "dump skipped (budget" in _log(log_env)


def test_dumps_respect_the_size_limit(log_env) -> None:
    fn = log_env(10, **{api_log.DUMP_DIR: log_env.dumps, api_log.DUMP_MAX_BYTES: 100})
    fn(torch.ones(4), torch.ones(4))  # 32 bytes of inputs, 16 of outputs
    fn(torch.ones(64), torch.ones(64))  # 512 bytes: over the budget
    sizes = sum(p.stat().st_size for p in log_env.dumps.glob("*.safetensors"))
    assert len(list(log_env.dumps.glob("*.safetensors"))) == 2 and sizes < 2000


def test_dump_filters_include_and_exclude_by_function_name(log_env) -> None:
    def layernorm_modulate(x):
        return x

    def gated_residual(x):
        return x

    env = {api_log.DUMP_DIR: log_env.dumps, api_log.DUMP_INCLUDE: "layernorm*,gated*",
           api_log.DUMP_EXCLUDE: "gated_*"}
    for fn in (log_env(10, layernorm_modulate, **env), log_env(10, gated_residual, **env)):
        fn(torch.ones(2))
    names = sorted(p.name.split("_", 2)[2] for p in log_env.dumps.glob("*.safetensors"))
    assert names == ["layernorm_modulate_inputs.safetensors", "layernorm_modulate_outputs.safetensors"]


def test_public_kernels_are_undecorated_at_level_zero(monkeypatch) -> None:
    import importlib

    monkeypatch.delenv(api_log.LEVEL, raising=False)
    import kernels.residual as residual

    residual = importlib.reload(residual)
    assert not hasattr(residual.gated_residual, "api_log_level")
    monkeypatch.setenv(api_log.LEVEL, "3")
    residual = importlib.reload(residual)
    assert residual.gated_residual.api_log_level == 3
    monkeypatch.delenv(api_log.LEVEL)
    importlib.reload(residual)
