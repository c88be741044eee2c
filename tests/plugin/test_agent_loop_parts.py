"""scripts/agent_loop_check.py in three parts (the GPU check's ``loop`` stage as three shards): the parts without
the honest candidate never reach ``kernels/``, so a kernel's change leaves them fresh, and the judge-cost rule over
the parts' runs is the whole loop's rule."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import agent_loop_check as check  # noqa: E402
import gpu_inputs as inputs  # noqa: E402
import gpu_stages as stages  # noqa: E402


def _part(name: str, judged: list[float], plain: list[float], exits: tuple[int, ...] = (0,)) -> dict:
    cost = {"name": "judge cost", "cost": True, "pass": True, "plain_exits": list(exits),
            "configurations": [{"name": name, "judged_s": judged, "plain_s": plain}]}
    return {"targets": [{"name": "baseline", "value": 0, "limit": 0, "pass": True}, cost], "passed": True}


def test_the_loop_stage_is_a_shard_per_part() -> None:
    loop = stages.BY_NAME["loop"]
    assert loop.units(ROOT) == ["loop[empty]", "loop[verdicts]", "loop[kernels]"]
    assert loop.shard_args("loop[kernels]") == ("--part", "kernels")
    assert loop.across_shards is check.cost_across


def test_every_agent_loop_shard_fits_a_device_call_by_its_h100_estimate() -> None:
    """Each shard of the loop, attacks, empty and classes stages, with its baseline, fits what one device call
    holds for stages (a shard outlasting a call is stopped every time and never recorded), and the planner uses
    those estimates for shards it has never timed."""
    import gpu_check

    capacity = gpu_check.stage_capacity(gpu_check.CALL_LIMIT_S)
    units = [u for name in ("loop", "attacks", "empty", "classes") for u in stages.BY_NAME[name].units(ROOT)]
    assert sorted(units) == sorted(stages.SHARD_ESTIMATE_S)
    assert all(seconds <= capacity - 30 for seconds in stages.SHARD_ESTIMATE_S.values()), capacity
    import gpu_record

    state = next(s for s in gpu_record.states({}, stages.STAGES, ROOT) if s.unit == "classes[dit-6]")
    assert gpu_check.unit_seconds(state) == stages.SHARD_ESTIMATE_S["classes[dit-6]"]


def test_the_classes_shards_cover_every_candidate_once() -> None:
    import agent_loop_classes as classes

    found = classes.candidates(0.2, 2)
    for lane in ("dit", "kernels"):
        everyone = classes.select(found, True, None, lane)
        shards = [classes.select(found, True, None, lane, args[args.index("--pick") + 1] if "--pick" in args else None)
                  for _, args in stages.CLASSES_SHARDS if args[1] == lane]
        assert [c.name for shard in shards for c in shard] == [c.name for c in everyone]


def test_the_cost_rule_judges_both_parts_as_the_whole_loop_does() -> None:
    empties = _part("empty commits", [31.0, 32.0], [28.0, 29.0])
    honest = _part("honest candidate", [32.3], [24.9, 27.8])
    assert check.cost_across({"loop[empty]": empties, "loop[kernels]": honest}) == []
    whole = check.cost_ratio([([31.0, 32.0], [28.0, 29.0]), ([32.3], [24.9, 27.8])])
    assert whole == pytest.approx(((31.5 / 28.5) * (32.3 / 26.35)) ** 0.5)
    # a slow judge on the honest candidate's part fails the stage although each part passed alone
    slow = _part("honest candidate", [45.0], [24.9, 27.8])
    problems = check.cost_across({"loop[empty]": empties, "loop[kernels]": slow})
    assert len(problems) == 1 and "judge cost across the loop's parts" in problems[0] and "<= 1.25" in problems[0]
    # a part that timed the wrong configuration, or plain runs that crashed, fail it too
    twice = check.cost_across({"loop[empty]": empties, "loop[kernels]": _part("empty commits", [31.0], [29.0])})
    assert any("not both configurations" in p for p in twice)
    crashed = _part("honest candidate", [32.3], [24.9, 27.8], exits=(0, 4))
    assert any("exited [0, 4]" in p for p in check.cost_across({"a": empties, "b": crashed}))


def test_the_whole_loop_judges_its_cost_and_a_part_defers_it() -> None:
    costs = check.Cost()
    costs.configuration("honest candidate")
    costs.runs[-1].update(judged=[40.0], plain=[25.0, 26.0])
    assert not costs.target(on_gpu=True)["pass"]  # 1.57: the whole loop fails it here
    deferred = costs.target(on_gpu=True, judged_here=False)
    assert deferred["pass"] and deferred["cost"] and deferred["configurations"][0]["judged_s"] == [40.0]


def _function_lines(path: Path, *names: str) -> set[int]:
    """The first lines of ``names``' code objects in ``path`` (what a traced run records for a function that ran)."""
    tree = ast.parse(path.read_text())
    found = {node.name: min([node.lineno, *(d.lineno for d in node.decorator_list)])
             for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    return {found[name] for name in names}


def test_a_run_that_keeps_the_torch_adaln_never_reaches_the_kernels() -> None:
    """The fast DiT with ``adaln="torch"`` (the verdicts part's candidate) reads its options, which name the mode
    "kernels" as a word, and resolves its ops without the package: no file of ``kernels/`` is among its inputs.
    Once the package's ops are asked for, the kernels are."""
    graph = inputs.ImportGraph(ROOT)
    adaln = ROOT / "dit_impl" / "fast" / "adaln.py"
    seeds = {"dit_impl/fast/adaln.py", "dit_impl/fast/options.py"}
    torch_only = graph.inputs(seeds, ran={"dit_impl/fast/adaln.py": _function_lines(adaln, "resolve_ops", "torch_ops")})
    assert not [f for f in torch_only if f.startswith("kernels/")]
    with_kernels = graph.inputs(seeds, ran={"dit_impl/fast/adaln.py": _function_lines(adaln, "resolve_ops", "package_ops")})
    assert "kernels/__init__.py" in with_kernels  # the rest as its ops run (a traced run records their code)
