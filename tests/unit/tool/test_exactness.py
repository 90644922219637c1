"""The exactness gate: the comparison on given answers, and the whole gate against the simulated engine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_stub import ROOT, SIM, fake_release, free_port

from sgdeploy import exactness, gate, records, serving

selfcheck = exactness.selfcheck

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


# --- the self-check: the candidate's tokens against the target's own prefill ----------------------------------------

def prefill_answer(ids: list[int], top: dict[int, list[tuple[float, int]]], own: dict[int, float] | None = None,
                   cached: int = 0) -> dict:
    """An SGLang 0.5.23 answer to the prefill of ``ids`` (logprob_start_len 0, top_logprobs_num 2): position
    i's top list is ``top[i]`` ([(logprob, id), ...], best first), the token there scored ``own[i]`` or, when
    it is listed, its listed log-probability; position 0 has none, as SGLang pads it."""
    own = own or {}
    chosen, tops = [[None, ids[0], None]], [None]
    for i in range(1, len(ids)):
        listed = dict((t, lp) for lp, t in top[i])
        chosen.append([own.get(i, listed.get(ids[i], -9.0)), ids[i], None])
        tops.append([[lp, t, f" w{t}"] for lp, t in top[i]])
    return {"meta_info": {"cached_tokens": cached, "input_token_logprobs": chosen, "input_top_logprobs": tops}}


PROMPT_IDS = [101, 102, 103]


def scored(out: list[int], top: dict[int, list[tuple[float, int]]], **kw):
    """The judgement's input for the answer ``out``: positions 1..2 are the prompt's, then the answer's."""
    full = {**{1: [(-0.1, 102), (-3.0, 7)], 2: [(-0.1, 103), (-3.0, 7)]}, **top}
    ids = PROMPT_IDS + out
    return selfcheck.parse_prefill(prefill_answer(ids, full, **kw), ids)


def test_self_check_every_token_the_targets_top1_passes():
    out = [5, 6, 7]
    top = {3 + k: [(-0.2, t), (-2.0, 99)] for k, t in enumerate(out)}
    r = selfcheck.judge("a", 3, out, [None] * 3, scored(out, top), TOL)
    assert r["near_ties"] == [] and r["outside"] == [] and r["first_outside"] is None
    v = selfcheck.verdict([r], TOL, 3)
    assert (v.verdict, v.equal) == ("pass", 1)
    assert v.reason == ("3 of 3 tokens (1 prompts x 3) are the target's top-1 under its own prefill on this server; "
                        "1 of 1 prompts all top-1")


def test_self_check_a_near_tie_passes_and_every_later_token_is_still_judged():
    out = [5, 50, 7, 8]  # token 2 is the runner-up at a 0.02-nat gap; tokens 3 and 4 follow its prefix
    top = {3: [(-0.2, 5), (-2.0, 99)], 4: [(-0.70, 6), (-0.72, 50)], 5: [(-0.2, 7), (-2.0, 99)],
           6: [(-0.2, 8), (-2.0, 99)]}
    r = selfcheck.judge("a", 3, out, [None] * 4, scored(out, top), TOL)
    assert [(t["step"], t["token"], t["target_token"], t["gap"]) for t in r["near_ties"]] == [(2, 50, 6, 0.02)]
    v = selfcheck.verdict([r], TOL, 4)
    assert v.verdict == "pass" and v.equal == 0
    assert "or within 0.1 nats of it (1 near-ties, gaps up to 0.02 nats)" in v.reason
    # A wrong token after the near-tie is caught: the comparison with a reference stops at the first difference.
    top[6] = [(-0.2, 9), (-2.5, 99)]
    r = selfcheck.judge("a", 3, out, [None, None, None, " eight"], scored(out, top), TOL)
    v = selfcheck.verdict([r], TOL, 4)
    assert v.verdict == "fail"
    assert v.reason.startswith("prompt a token 4 of 4: candidate 8 (' eight'), but the target's top-1 after the "
                               "same prefix is 9 (' w9'), 8.8 nats above it, not within the near-tie tolerance 0.1 "
                               "(1 of 1 prompts, 1 of 4 tokens outside the rule")


def test_self_check_the_gap_is_the_candidates_own_logprob_below_the_top1_even_when_it_is_not_listed():
    out = [5, 6]
    top = {3: [(-0.2, 5), (-2.0, 99)], 4: [(-1.00, 40), (-1.01, 41)]}  # 6 is not listed: scored -1.05
    r = selfcheck.judge("a", 3, out, [None] * 2, scored(out, top, own={4: -1.05}), TOL)
    assert r["outside"] == [] and r["near_ties"][0]["gap"] == 0.05
    r = selfcheck.judge("a", 3, out, [None] * 2, scored(out, top, own={4: -1.10}), TOL)  # at the tolerance: not below
    assert r["outside"][0]["gap"] == 0.1


def test_self_check_is_aligned_on_the_position_of_each_token_not_one_off():
    """input_top_logprobs[i] scores the token at input position i (SGLang pads position 0 with None): an
    answer that is the target's sequence shifted by one position fails, the target's own passes."""
    target = [5, 6, 7, 8]
    top = {3 + k: [(-0.2, t), (-3.0, 99)] for k, t in enumerate(target)}
    good = selfcheck.judge("a", 3, target, [None] * 4, scored(target, top), TOL)
    assert good["outside"] == [] and good["near_ties"] == []
    shifted = target[1:] + [9]
    off = selfcheck.judge("a", 3, shifted, [None] * 4, scored(shifted, top), TOL)
    assert [t["step"] for t in off["outside"]] == [1, 2, 3, 4]
    assert off["first_outside"]["target_token"] == 5 and off["first_outside"]["token"] == 6


def test_self_check_a_short_answer_fails():
    out = [5, 6]
    top = {3: [(-0.2, 5), (-2.0, 99)], 4: [(-0.2, 6), (-2.0, 99)]}
    v = selfcheck.verdict([selfcheck.judge("a", 3, out, [None] * 2, scored(out, top), TOL)], TOL, 64)
    assert v.verdict == "fail"
    assert v.reason == "prompt a: answered 2 tokens, asked for 64 with ignore_eos (1 of 1 prompts short)"


@pytest.mark.parametrize("change, words", [
    ({"cached": 4}, "the prefill reports cached_tokens 4: the prefix cache served part of it"),
    ({"ids": [101, 102, 999, 5]}, "name 4 tokens that are not the 4 sent"),
    ({"drop_top": True}, "meta_info.input_top_logprobs has None entries for 4 tokens"),
    ({"no_inputs": True}, "the answer has no meta_info.input_token_logprobs"),
])
def test_self_check_an_unusable_prefill_is_named(change, words):
    ids = [101, 102, 103, 5]
    top = {1: [(-0.1, 102), (-3.0, 7)], 2: [(-0.1, 103), (-3.0, 7)], 3: [(-0.2, 5), (-2.0, 99)]}
    answer = prefill_answer(change.get("ids", ids), top, cached=change.get("cached", 0))
    if change.get("drop_top"):
        answer["meta_info"]["input_top_logprobs"] = None
    if change.get("no_inputs"):
        del answer["meta_info"]["input_token_logprobs"]
    with pytest.raises(exactness.ExactnessError, match=re.escape(words)):
        selfcheck.parse_prefill(answer, ids)


def test_self_check_failed_requests_are_inconclusive_naming_the_prompt():
    v = exactness.self_check(f"http://127.0.0.1:{free_port()}", PROMPTS[:3], TOL, 2, 5)
    assert v.verdict == "inconclusive" and v.equal is None
    assert v.reason.startswith("3 of 3 prompts could not be checked against the target's own prefill: x0")
    assert "/generate failed: Connection refused" in v.reason and len(v.details["errors"]) == 3


def test_self_check_asks_for_a_prefill_the_prefix_cache_cannot_serve():
    """SGLang 0.5.23 serves at most logprob_start_len tokens of a return_logprob request from the prefix cache
    (Req._compute_max_prefix_len): 0 here, so nothing the decode left behind is reused."""
    body = selfcheck.prefill_body([1, 2, 3])
    assert body["return_logprob"] is True and body["logprob_start_len"] == 0 and body["top_logprobs_num"] >= 2
    assert body["input_ids"] == [1, 2, 3] and body["sampling_params"]["max_new_tokens"] in (0, 1)
    decode = selfcheck.decode_body(PROMPTS[0], 64)
    assert decode["logprob_start_len"] == 0 and decode["sampling_params"]["temperature"] == 0


def test_self_check_prefills_on_the_simulator_are_not_served_from_its_cache(tmp_path):
    with sim_engine(tmp_path, FORK, ddtree(15, True)) as url:
        prompt_ids, out, _ = selfcheck.parse_decode(selfcheck._post(url, selfcheck.decode_body(PROMPTS[0], 64), 30))
        ids = prompt_ids + out
        plain = selfcheck._post(url, {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}, 30)
        assert plain["meta_info"]["cached_tokens"] == len(ids) - 1  # the decode's prompt and answer are cached...
        answer = selfcheck._post(url, selfcheck.prefill_body(ids), 30)
        assert answer["meta_info"]["cached_tokens"] == 0  # ...and the self-check's prefill uses none of it
        assert len(selfcheck.parse_prefill(answer, ids)) == len(ids)


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

    # No reference yet: the self-check against the target's own prefill decides.
    with sim_engine(tmp_path, FORK, ddtree(15, True)) as url:
        first = gate.run_all(url, t, True, exactness_target=target)
    e = first.exactness
    assert e.verdict == "pass", e.reason
    assert "(16 prompts x 64) are the target's top-1 under its own prefill on this server" in e.reason
    assert e.reason.endswith("(self-check: no reference outputs for Qwen/Qwen3.6-27B@main on this host yet "
                             f"({refs / 'Qwen--Qwen3.6-27B@main.json'}))")
    assert e.details["method"] == "self-check" and len(e.details["per_prompt"]) == 16
    assert {p["prefill_cached_tokens"] for p in e.details["per_prompt"]} == {0}
    assert first.passed and first.all_passed and first.lines()[-1] == "gates passed"

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


def test_without_a_reference_a_leak_with_forced_acceptance_fails_on_the_targets_own_prefill(tmp_path):
    """Issue 33: with no recorded reference the leaky build used to be inconclusive ("does not block") and
    deployed; the self-check sees its tokens are not the target's."""
    target = gate.ExactnessTarget(str(tmp_path / "none"), {"key": "Qwen--Qwen3.6-27B@main",
                                                          "label": "Qwen/Qwen3.6-27B@main"}, "lab-leak", "lab1")
    t = gate.GateThresholds.from_mapping(FAST)
    with sim_engine(tmp_path, NOFORK, ddtree(64, False), {"SGLANG_SIM_ACCEPT_OVERRIDE": "14"}) as url:
        bad = gate.run_all(url, t, True, exactness_target=target)
    assert bad.results[2].gate == "acceptance" and bad.results[2].verdict == "pass"  # acceptance looks fine...
    e = bad.exactness
    assert e.verdict == "fail", e.reason  # ...the tokens are not the target's
    assert e.reason.startswith("prompt x01-capital token ")
    assert "but the target's top-1 after the same prefix is" in e.reason
    assert "not within the near-tie tolerance 0.1" in e.reason and "(self-check: no reference outputs" in e.reason
    assert not bad.passed and bad.failed_gates == ["exactness"] and bad.lines()[-1] == "gates failed: exactness"
    assert bad.summary().splitlines()[1].startswith("exactness  FAIL")
    assert e.details["failures"][0]["prompt"] == "x01-capital" and e.details["outside"] > 100


def test_gates_exactness_require_reference_refuses_the_self_check(tmp_path):
    target = gate.ExactnessTarget(str(tmp_path), {"key": "m", "label": "m@main"}, "ddtree-b15", "lab1")
    t = gate.GateThresholds.from_mapping({"exactness_require_reference": True})
    e = gate.exactness_gate("http://127.0.0.1:9", t, target, timeout=5)  # nothing is asked
    assert e.verdict == "fail"
    assert e.reason.startswith(f"no reference outputs for m@main on this host yet ({tmp_path / 'm.json'}); "
                               "gates.exactness_require_reference is true")
    assert "make reference CONFIG=ddtree-b15 HOST=lab1" in e.reason


def test_failed_requests_are_inconclusive_and_block_unless_the_config_says_warn(tmp_path):
    target = gate.ExactnessTarget(str(tmp_path), {"key": "m", "label": "m@main"}, "ddtree-b15", "lab1")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    e = gate.exactness_gate(url, gate.GateThresholds(), target, timeout=5)
    assert e.verdict == "inconclusive"
    assert e.reason.startswith("16 of 16 prompts could not be checked against the target's own prefill: ")
    assert "/generate failed: Connection refused" in e.reason
    smoke = gate.GateResult("smoke", "deterministic_answer", 8.0, None, None, "pass", "answered")
    blocking = gate.GateReport(url, True, gate.GateThresholds(), [smoke], exactness=e)
    assert not blocking.passed and blocking.failed_gates == ["exactness"]
    assert blocking.lines()[-1] == "gates failed: exactness"
    warn = gate.GateReport(url, True, gate.GateThresholds(exactness_inconclusive="warn"), [smoke], exactness=e)
    assert warn.passed and not warn.all_passed and warn.failed_gates == []
    lines = warn.lines()
    assert lines[1].startswith("exactness  INCONCLUSIVE ")
    assert lines[1].endswith("(recorded, does not block: gates.exactness_inconclusive is warn)")
    assert lines[-1] == ("gates not all passed, none blocks: exactness INCONCLUSIVE (recorded, does not block: "
                         "gates.exactness_inconclusive is warn)")
    assert not any(line.startswith("gates passed") for line in lines)
    assert warn.to_dict()["all_passed"] is False and warn.to_dict()["verdict_line"] == lines[-1]
    with pytest.raises(gate.GateError, match="gates.exactness_inconclusive: 'maybe' is not allowed; give fail or warn"):
        gate.GateThresholds.from_mapping({"exactness_inconclusive": "maybe"})


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
    assert lines[1].startswith("exactness  PASS ") and "(self-check: no reference outputs for" in lines[1]
    assert lines[-1] == "gates passed"
    assert json.loads((tmp_path / "g.json").read_text())["exactness"]["verdict"] == "pass"


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
