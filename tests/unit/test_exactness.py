"""The exactness gate: the comparison on given answers, and the whole gate against the simulated engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_stub import ROOT, SIM, fake_release, free_port

from sgdeploy import exactness, gate, records, serving

PROMPTS = exactness.load_prompts()
TOL = 0.1


def answer(pid: str, tokens: list[int], gaps: dict[int, float] | None = None, runner_up: dict[int, int] | None = None):
    """An answer in the comparison's shape; step i's top-1 is tokens[i], its runner-up 900 + i (or given)."""
    gaps, runner_up = gaps or {}, runner_up or {}
    top = [[[-0.1, t, f" w{t}"], [-0.1 - gaps.get(i, 1.5), runner_up.get(i, 900 + i), f" r{i}"]]
           for i, t in enumerate(tokens)]
    return {"prompt_id": pid, "tokens": tokens, "texts": [f" w{t}" for t in tokens], "top": top}


def reference(*answers) -> dict:
    return exactness.build_reference(list(answers), PROMPTS[:len(answers)], {"key": "m@r", "label": "m@r"},
                                     config="ar", host="lab1", release="stock.0", concurrency=4)


# --- the comparison --------------------------------------------------------------------------------------------

def test_equal_answers_pass():
    ref = reference(answer("a", [1, 2, 3]), answer("b", [4, 5, 6]))
    v = exactness.compare(ref, [answer("a", [1, 2, 3]), answer("b", [4, 5, 6])], TOL)
    assert (v.verdict, v.equal) == ("pass", 2)
    assert v.reason.startswith("2 of 2 prompts equal the reference")


def test_a_difference_at_a_wide_gap_fails_naming_prompt_step_tokens_and_gap():
    ref = reference(answer("a", [1, 2, 3]), answer("b", [4, 5, 6], gaps={1: 0.84}, runner_up={1: 77}))
    v = exactness.compare(ref, [answer("a", [1, 2, 3]), answer("b", [4, 77, 9])], TOL)
    assert v.verdict == "fail" and v.equal == 1
    assert v.reason.startswith("prompt b first differs at token 2 of 3: reference 5 (' w5'), candidate 77 (' w77'); "
                               "the reference's top-1/top-2 gap there is 0.84 nats, not below the near-tie "
                               "tolerance 0.1 (1 of 2 prompts differ beyond a near-tie; 1 of 2 prompts equal")
    (f,) = v.details["failures"]
    assert (f["prompt"], f["step"], f["reference_token"], f["candidate_token"], f["gap"]) == ("b", 2, 5, 77, 0.84)


def test_a_near_tie_flip_to_the_runner_up_passes_and_is_listed():
    ref = reference(answer("a", [1, 2, 3, 4], gaps={2: 0.02}, runner_up={2: 50}))
    v = exactness.compare(ref, [answer("a", [1, 2, 50, 8])], TOL)  # after the flip the prefixes differ
    assert v.verdict == "pass" and v.equal == 0
    assert v.reason == "0 of 1 prompts equal the reference, 1 first differ at a near-tie (gaps 0.02 nats, below 0.1)"
    assert v.details["near_tie_flips"][0]["step"] == 3


def test_an_exact_tie_listed_with_the_references_own_token_second_passes():
    """The AR server on the H200 (2026-12-01, tests/gpu/e2e 'graphs'): at an exact tie it chose token 0 and
    listed it second ([[-1.709, 2], [-1.709, 0]]); the DDTree server chose 2. That is a near-tie flip (gap 0),
    not a failure ("not the runner-up 0")."""
    ref = reference(answer("a", [1, 0, 3]))
    ref["outputs"][0]["top"][1] = [[-1.709, 2, " w2"], [-1.709, 0, " w0"]]
    v = exactness.compare(ref, [answer("a", [1, 2, 7])], TOL)
    assert v.verdict == "pass", v.reason
    assert v.details["near_tie_flips"][0]["gap"] == 0.0 and v.details["near_tie_flips"][0]["runner_up"] == 2


def test_a_near_tie_is_no_excuse_for_a_token_that_is_not_the_runner_up():
    ref = reference(answer("a", [1, 2, 3], gaps={1: 0.01}, runner_up={1: 50}))
    v = exactness.compare(ref, [answer("a", [1, 33, 3])], TOL)
    assert v.verdict == "fail"
    assert "a near-tie (0.01 nats), but the candidate's token is not the reference's runner-up 50 (' r1')" in v.reason


def test_the_tolerance_is_the_boundary():
    ref = reference(answer("a", [1, 2], gaps={1: 0.1}, runner_up={1: 9}))
    assert exactness.compare(ref, [answer("a", [1, 9])], 0.1).verdict == "fail"  # not below
    assert exactness.compare(ref, [answer("a", [1, 9])], 0.11).verdict == "pass"


def test_a_short_answer_fails():
    ref = reference(answer("a", [1, 2, 3]))
    v = exactness.compare(ref, [answer("a", [1, 2])], TOL)
    assert v.verdict == "fail" and "prompt a: answered 2 tokens, the reference 3" in v.reason


# --- SGLang's response shape ---------------------------------------------------------------------------------------

def test_parse_answer_reads_sglang_0_5_23_meta_info():
    meta = {"output_token_logprobs": [[-0.5, 11, " a"], [-0.1, 12, None]],
            "output_top_logprobs": [[[-0.5, 11, " a"], [-1.2, 40, " b"]], [[-0.1, 12, None], [-3.0, 7, None]]]}
    out = exactness.parse_answer({"text": " a", "meta_info": meta}, top_needed=True)
    assert out["tokens"] == [11, 12] and out["top"][0] == [[-0.5, 11, " a"], [-1.2, 40, " b"]]


@pytest.mark.parametrize("meta, words", [
    ({}, "no meta_info.output_token_logprobs"),
    ({"output_token_logprobs": [[-0.5, 11, None]]}, "no meta_info.output_top_logprobs"),
    ({"output_token_logprobs": [[-0.5, "x", None]], "output_top_logprobs": [None]}, "expected [logprob, token_id"),
    ({"output_token_logprobs": [[-0.5, 11, None]], "output_top_logprobs": [[[-0.5, 11, None]]]}, "has 1 entries"),
])
def test_parse_answer_names_what_is_missing(meta, words):
    with pytest.raises(exactness.ExactnessError) as err:
        exactness.parse_answer({"meta_info": meta}, top_needed=True)
    assert words in str(err.value)


def test_a_candidate_without_logprobs_is_read_from_output_ids():
    out = exactness.parse_answer({"text": " a b", "output_ids": [11, 12], "meta_info": {}}, top_needed=False)
    assert out == {"tokens": [11, 12], "texts": [None, None]}
    with pytest.raises(exactness.ExactnessError, match="no meta_info.output_token_logprobs"):
        exactness.parse_answer({"output_ids": [11, 12], "meta_info": {}}, top_needed=True)  # a reference needs them


def test_model_identity_is_repository_and_revision():
    ident = exactness.model_identity({"models": [{"role": "drafter", "source": "hf", "repo": "d/x"},
                                                 {"role": "model", "source": "hf", "repo": "Qwen/Qwen3.6-27B",
                                                  "revision": "abc123"}]})
    assert ident == {"key": "Qwen--Qwen3.6-27B@abc123", "label": "Qwen/Qwen3.6-27B@abc123"}
    assert exactness.model_identity({"models": []}) is None


# --- the gate against the simulated engine -------------------------------------------------------------------------

HYBRID = "Qwen/Qwen3.6-27B"  # decided hybrid from the name
FAST = {"bench_requests": 4, "bench_concurrency": 4, "bench_max_tokens": 32, "smoke_max_tokens": 8}


@contextmanager
def sim_engine(tmp: Path, release: str, args: list[str], env: dict | None = None):
    port = free_port()
    e = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
    version = f"0.5.23+{release}" if release else "0.5.23"
    e.update({"PYTHONPATH": str(fake_release(tmp / (release or "stock"), version)), "SGLANG_SIM_STARTUP_S": "0.2",
              "SGLANG_SIM_SLOWDOWN": "0.1", **(env or {})})
    log = tmp / f"sim-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(SIM), "--model-path", HYBRID, "--host", "127.0.0.1", "--port",
                                 str(port), "--attention-backend", "triton", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=e)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while not serving.is_healthy(url, timeout=1):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


FORK_FLAG = "--speculative-ddtree-state-forking"


def ddtree(budget: int, forking: bool) -> list[str]:
    # Forking is said twice, the same way: by the release label (FORK, NOFORK) and, where the simulator has
    # it, by the server's flag; so this test holds whichever of the two the simulator decides by.
    args = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "z-lab/Qwen3.6-27B-DFlash",
            "--speculative-dflash-block-size", "16", "--speculative-ddtree-budget", str(budget)]
    if FORK_FLAG in SIM.read_text():
        args += [FORK_FLAG, "on" if forking else "off"]
    return args


FORK, NOFORK = "ddtree.fork.topk.abcdef12", "ddtree.topk.abcdef12"


def test_the_target_records_a_reference_a_forking_ddtree_passes_a_leaky_one_fails(tmp_path):
    refs = tmp_path / "references"
    target = gate.ExactnessTarget(str(refs), {"key": "Qwen--Qwen3.6-27B@main", "label": "Qwen/Qwen3.6-27B@main"},
                                  "ddtree-b64-nofork", "lab1", "ddtree.topk.1")
    t = gate.GateThresholds.from_mapping(FAST)

    # No reference yet: inconclusive, saying how to make one; it does not block by default.
    with sim_engine(tmp_path, FORK, ddtree(15, True)) as url:
        first = gate.run_all(url, t, True, exactness_target=target)
    e = first.exactness
    assert e.verdict == "inconclusive" and "no reference outputs for Qwen/Qwen3.6-27B@main on this host yet" in e.reason
    assert "make reference CONFIG=ddtree-b64-nofork HOST=lab1" in e.reason
    assert first.passed and first.failed_gates == []
    strict = gate.GateReport(url, True, gate.GateThresholds.from_mapping({"exactness_require_reference": True}),
                             first.results, exactness=e)
    assert not strict.passed and strict.failed_gates == ["exactness"]

    with sim_engine(tmp_path, None, []) as url:
        ar = gate.run_all(url, t, False, exactness_target=target)
    assert ar.passed and ar.exactness.verdict == "pass" and "recorded the reference" in ar.exactness.reason
    ref = json.loads((refs / "Qwen--Qwen3.6-27B@main.json").read_text())
    assert len(ref["outputs"]) == 16 and all(len(o["tokens"]) == 64 and len(o["top"][0]) == 2 for o in ref["outputs"])

    with sim_engine(tmp_path, FORK, ddtree(64, True)) as url:
        good = gate.run_all(url, t, True, exactness_target=target)
    assert good.exactness.verdict == "pass", good.exactness.reason
    assert good.passed and "prompts equal the reference" in good.exactness.reason

    with sim_engine(tmp_path, NOFORK, ddtree(64, False), {"SGLANG_SIM_ACCEPT_OVERRIDE": "14"}) as url:
        bad = gate.run_all(url, t, True, exactness_target=target)
    assert bad.results[2].verdict == "pass" and bad.results[2].value > 10  # acceptance looks fine...
    assert bad.exactness.verdict == "fail", bad.exactness.reason  # ...the tokens are not the target's
    assert bad.exactness.reason.startswith("prompt x01-capital first differs at token ")
    assert "not below the near-tie tolerance 0.1" in bad.exactness.reason
    assert not bad.passed and bad.failed_gates == ["exactness"]
    assert bad.summary().splitlines()[1].startswith("exactness  FAIL")

    # The verdict is in the deploy record and in the status table.
    rec = records.build_record(config="ddtree-b64-nofork", host="lab1", release="ddtree.topk.1", outcome="rolled_back",
                               started="2026-01-01T00:00:00Z", report=bad)
    assert rec["exactness"]["verdict"] == "fail" and rec["exactness"]["gate"] == "exactness"
    assert records.status_rows([rec])[0]["exactness"] == "fail"
    assert " fail " in records.status_table([rec]).splitlines()[1]


def test_the_gate_command_line_takes_the_references_folder(tmp_path):
    deploy = {"config": "ddtree-b15", "speculative": True, "gates": FAST, "release": "r",
              "models": [{"role": "model", "source": "hf", "repo": "Qwen/Qwen3.6-27B", "revision": "main"}]}
    (tmp_path / "deploy.json").write_text(json.dumps(deploy))
    with sim_engine(tmp_path, FORK, ddtree(15, True)) as url:
        proc = subprocess.run([sys.executable, "-m", "sgdeploy.gate", "--url", url, "--config-json",
                               str(tmp_path / "deploy.json"), "--references", str(tmp_path / "refs"), "--host", "lab1",
                               "--only", "smoke", "--only", "exactness", "--out", str(tmp_path / "g.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("exactness  INCONCLUSIVE") and lines[1].endswith("(recorded, does not block)")
    assert json.loads((tmp_path / "g.json").read_text())["exactness"]["verdict"] == "inconclusive"


def test_reference_config_runs_the_target_alone(tmp_path):
    from sgdeploy import spec

    out = tmp_path / "reference-ddtree-b15.yml"
    proc = subprocess.run([sys.executable, "-m", "sgdeploy.exactness", "reference-config", "ddtree-b15", "--out",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    config = spec.load(out)
    target = spec.load("ddtree-b15")
    assert config.speculative.algorithm == "NONE" and config.drafter is None
    assert (config.model, config.serving.gpus) == (target.model, target.serving.gpus)
    assert config.gates.min_tokens_per_s is None


def test_the_sweep_shows_each_variants_verdict_from_its_deploy_record(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sgdeploy import sweep

    monkeypatch.setattr(sweep, "REPO_ROOT", tmp_path)
    folder = tmp_path / "reports" / "deploys" / "lab1"
    result = {"gate": "exactness", "verdict": "fail", "reason": "prompt x01-capital first differs at token 4"}
    for config, finished in (("v-b64-k8", "2026-01-01T00:05:00Z"), ("other", "2026-01-01T00:06:00Z")):
        rec = records.build_record(config=config, host="lab1", release="r", outcome="deployed", finished=finished,
                                   started="2026-01-01T00:00:00Z", report={"gates": [], "exactness": result})
        records.write_record(folder, rec)
    host = SimpleNamespace(host="lab1")
    assert sweep.Sweep.exactness_of(host, SimpleNamespace(name="v-b64-k8")) == {
        "verdict": "fail", "reason": "prompt x01-capital first differs at token 4"}
    assert sweep.Sweep.exactness_of(host, SimpleNamespace(name="v-b15-k8")) is None
    row = {"status": "ok", "accept_length_mean": 14.0, "accept_length_sd": 0.1, "tokens_per_s": 200.0,
           "step_time_ms": 70.0, "requests": 4, "failures": 0, "exactness": {"verdict": "fail"}}
    assert sweep.progress(row).endswith("4/4 requests, exactness fail")
