"""The end-to-end harness runs the project's exactness gate (sgdeploy.exactness) against the real server: a
reference from the gate-ar server's answers, every ``exactness`` gate server compared with it
(tests/gpu/e2e/runner.py, ``exactness_verdicts``). Synthetic answers here; the real ones on the H200."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

import runner  # noqa: E402

from sgdeploy import exactness  # noqa: E402


class _Srv:
    def __init__(self, tags, config="ar"):
        self.entry = {"tags": tags, "config": config, "gates": {"exactness_tie_tolerance": 0.1}}


def _answers(gap: float, flip_prompt: int | None = None, flip_to: int = 3) -> dict:
    outs = []
    for i, p in enumerate(exactness.load_prompts()):
        tokens = [5] * exactness.MAX_NEW_TOKENS
        top = [[[-0.1, 5, "w5"], [-0.1 - gap, 3, "w3"]] for _ in tokens]
        if i == flip_prompt:
            tokens = tokens[:2] + [flip_to] * (len(tokens) - 2)
        outs.append({"prompt_id": p.id, "tokens": tokens, "texts": [f"w{t}" for t in tokens], "top": top})
    return {"outputs": outs, "errors": []}


def _run(reference: dict, candidates: dict) -> dict:
    servers = {"gate-ar": _Srv(["exactness_reference"])}
    results = {"gate-ar": {"gates": {"exactness_answers": reference}}}
    for name, ans in candidates.items():
        servers[name] = _Srv(["exactness"], "ddtree-b15")
        results[name] = {"gates": {"exactness_answers": ans}}
    runner.exactness_verdicts(servers, results)
    return results["exactness"]["verdicts"]


def test_equal_answers_pass_and_a_wide_gap_flip_fails_naming_the_step():
    ref = _answers(gap=2.0)
    v = _run(ref, {"same": _answers(gap=2.0), "leak": _answers(gap=2.0, flip_prompt=4)})
    assert v["same"]["verdict"] == "pass" and v["same"]["equal"] == 16
    assert v["leak"]["verdict"] == "fail" and v["leak"]["failures"] == 1
    assert v["leak"]["first_failures"][0]["step"] == 3
    assert "not below the near-tie tolerance" in v["leak"]["reason"]


def test_a_near_tie_flip_to_the_runner_up_passes():
    v = _run(_answers(gap=0.05), {"tie": _answers(gap=0.05, flip_prompt=0, flip_to=3)})
    assert v["tie"]["verdict"] == "pass" and v["tie"]["near_tie_flips"] == 1


def test_no_reference_answers_is_reported_not_judged():
    servers = {"gate-ar": _Srv(["exactness_reference"]), "c": _Srv(["exactness"])}
    results = {"gate-ar": {"gates": {"exactness_answers": {"outputs": [None], "errors": ["x: refused"]}}}, "c": {}}
    runner.exactness_verdicts(servers, results)
    assert results["exactness"]["error"] == "no complete reference answers"
