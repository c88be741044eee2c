"""scripts/agent_loop_attacks.py (the GPU check's ``attacks`` stage): every attack is an edit that still applies to
the DiT lane's candidate, and cheats where the judge times (and only there), so a refusal in the stage is the
judge's doing, not an attack that never fired."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import agent_loop_attacks as attacks  # noqa: E402

PROBE = """
import sys, types, torch
sys.path.insert(0, {root!r})
if {timed}:
    sys.modules["ditgate_lane_timing"] = types.ModuleType("ditgate_lane_timing")
source = open({candidate!r}).read() + {attack!r}
module = types.ModuleType("dit_impl.fast.candidate")
module.__file__ = {candidate!r}
sys.modules["dit_impl.fast.candidate"] = module
exec(compile(source, {candidate!r}, "exec"), module.__dict__)
from dit_impl.baseline import load_model
from dit_impl.fast import sampling
base = load_model("tiny", seed=0, dtype="float32", device="cpu")
model = sampling.fast_model(base, module.options_for("cpu"))
g = torch.Generator().manual_seed(0)
outs = []
for _ in range(2):
    x = torch.randn(2, 4, base.config.latent_size, base.config.latent_size, generator=g)
    with torch.no_grad():
        outs.append(model.transformer(x, timestep=torch.tensor([5, 9]), class_labels=torch.tensor([1, 2])).sample)
print("SAME" if torch.equal(outs[0], outs[1]) else "DIFFERENT", "ZERO" if not outs[1].abs().sum() else "NONZERO")
"""


def probe(body: str, timed: bool) -> str:
    code = PROBE.format(root=str(ROOT), timed=timed, candidate=str(ROOT / attacks.CANDIDATE),
                        attack=attacks.WRAP + body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_table_covers_the_attack_classes() -> None:
    names = " | ".join(attacks.ATTACKS)
    for word in ("replay", "skipped calls", "method override", "clock", "synchronisation", "thread", "process",
                 "forged evidence"):
        assert word in names
    for body, code, reason in attacks.ATTACKS.values():
        compile((ROOT / attacks.CANDIDATE).read_text() + attacks.WRAP + body, attacks.CANDIDATE, "exec")
        assert code in (11, 12) and reason


@pytest.mark.parametrize(("name", "timed", "seen"), [
    ("replay: the first output answers every later call", True, "SAME NONZERO"),
    ("replay: the first output answers every later call", False, "DIFFERENT NONZERO"),
    ("skipped calls: every other call returns zeros", True, "DIFFERENT ZERO"),
    ("skipped calls: every other call returns zeros", False, "DIFFERENT NONZERO"),
])
def test_an_attack_cheats_where_the_judge_times_and_only_there(name: str, timed: bool, seen: str) -> None:
    assert probe(attacks.ATTACKS[name][0], timed) == seen


def test_the_stages_shards_judge_every_attack_and_the_empty_commit_once() -> None:
    import gpu_stages

    judged = [*attacks.ATTACKS, "an empty commit"]
    shards = [attacks.picked(judged, args[args.index("--pick") + 1]) for _, args in gpu_stages.ATTACK_SHARDS]
    assert sorted(name for shard in shards for name in shard) == sorted(judged)
    assert all(0 < len(shard) <= 5 for shard in shards)  # with its baseline, each fits a device call
    assert attacks.picked(judged, None) == judged and attacks.picked(judged, "2") == judged[1:2]
