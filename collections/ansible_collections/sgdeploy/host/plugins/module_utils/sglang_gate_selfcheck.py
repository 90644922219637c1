# Copyright: sgdeploy contributors. Apache-2.0
"""The exactness gate without a recorded reference: the candidate against the target's own prefill.

Per prompt of the exactness set, on the candidate server itself:

1. its greedy answer (``MAX_NEW_TOKENS`` tokens, ``ignore_eos``), asking ``return_logprob`` with
   ``logprob_start_len: 0`` so that ``meta_info.input_token_logprobs`` names the prompt's token ids;
2. one prefill of prompt + answer as ``input_ids`` (``max_new_tokens: 1``, ``return_logprob``,
   ``logprob_start_len: 0``, ``top_logprobs_num: 2``): the target's log-probabilities of every input token
   given the tokens before it, and its top 2 there (``input_token_logprobs``, ``input_top_logprobs``,
   SGLang 0.5.23's shape: the first entry has none). A prefill is the target's forward pass alone: no draft,
   no tree, no verify, so a state leak of speculative decoding cannot reach it. ``logprob_start_len: 0``
   also keeps the prefix cache out (SGLang 0.5.23 serves at most ``logprob_start_len`` tokens from it,
   ``Req._compute_max_prefix_len``), so nothing the decode left behind is reused; an answer reporting
   ``cached_tokens`` above 0 is not trusted (inconclusive).

Every answered token must be the target's top-1 at its position, or within ``tolerance`` nats of it (a
near-tie: bf16 numerics of the verify and decode paths may pick either). Every token is judged, past a
first near-tie too (teacher forcing: each under the candidate's own prefix), as ``tests/gpu/e2e``'s
``teacher_forced`` does against the AR server. Verdict pass or fail; inconclusive only when requests
failed or answered something unusable.

Standard library only: shipped with the gate module, imported by the controller (``sgdeploy.exactness``)
and callable from the H200 harness: ``self_check(base_url, prompts, tolerance, concurrency, timeout)``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_bench as bench
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_exactness as exactness
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http

TOP_N = 2
PASS, FAIL, INCONCLUSIVE = exactness.PASS, exactness.FAIL, exactness.INCONCLUSIVE
Verdict = exactness.Verdict
ExactnessError = exactness.ExactnessError


# --- the two requests ---------------------------------------------------------------------------------------

def decode_body(prompt: bench.Prompt, max_new_tokens: int) -> dict:
    """The candidate's greedy answer; the input log-probabilities only to learn the prompt's token ids."""
    return {"text": prompt.text, "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}


def prefill_body(ids: list[int]) -> dict:
    """One prefill of ``ids``: the target's log-probabilities of every token from the first, and its top 2.
    ``logprob_start_len: 0`` makes SGLang compute every position (the prefix cache serves none of it)."""
    return {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": TOP_N,
            "return_text_in_logprobs": True, "sampling_params": {"temperature": 0, "max_new_tokens": 1}}


def _post(base_url: str, body: dict, timeout: float) -> dict:
    try:
        status, raw = sglang_http.request("POST", base_url + "/generate", body, timeout)
    except OSError as err:
        raise ExactnessError(f"/generate failed: {sglang_http.reason(err)}") from None
    if status != 200:
        raise ExactnessError(f"/generate answered HTTP {status}: {raw[:200].decode(errors='replace').strip()}")
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ExactnessError("/generate answered something that is not JSON") from None
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
        raise ExactnessError("/generate answered JSON without meta_info")
    return answer


def _ids(entries: Any, where: str) -> list[int]:
    if not isinstance(entries, list) or not entries:
        raise ExactnessError(f"the answer has no {where} (the release did not return input log-probabilities: "
                             "return_logprob with logprob_start_len 0)")
    out = []
    for e in entries:
        if not (isinstance(e, list | tuple) and len(e) >= 2 and isinstance(e[1], int) and not isinstance(e[1], bool)):
            raise ExactnessError(f"{where} has {e!r}, expected [logprob, token_id, text]")
        out.append(e[1])
    return out


def parse_decode(answer: dict) -> tuple[list[int], list[int], list[str | None]]:
    """(prompt token ids, answer token ids, answer token texts) of the candidate's answer."""
    meta = answer["meta_info"]
    prompt_ids = _ids(meta.get("input_token_logprobs"), "meta_info.input_token_logprobs")
    chosen = meta.get("output_token_logprobs")
    if isinstance(chosen, list) and chosen:
        tokens = _ids(chosen, "meta_info.output_token_logprobs")
        texts = [e[2] if len(e) > 2 else None for e in chosen]
    else:
        output_ids = answer.get("output_ids")
        if not isinstance(output_ids, list) or not all(isinstance(t, int) for t in output_ids):
            raise ExactnessError("the answer has neither meta_info.output_token_logprobs nor output_ids")
        tokens = output_ids
        texts = [None] * len(tokens)
    return prompt_ids, list(tokens), texts


def parse_prefill(answer: dict, sent: list[int]) -> list[tuple[float | None, list[list]]]:
    """Per position of ``sent``: (the log-probability of the token there, the target's top list there), both
    given the tokens before it; position 0 has (None, []). Raises ExactnessError when the answer is not the
    prefill of ``sent`` (other ids, other length) or was served from the prefix cache."""
    meta = answer["meta_info"]
    cached = meta.get("cached_tokens")
    if isinstance(cached, int) and cached > 0:
        raise ExactnessError(f"the prefill reports cached_tokens {cached}: the prefix cache served part of it, "
                             "so its log-probabilities are not all the target's own (expected 0 with "
                             "logprob_start_len 0)")
    chosen, top = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
    ids = _ids(chosen, "meta_info.input_token_logprobs")
    if ids != sent:
        raise ExactnessError(f"the prefill's meta_info.input_token_logprobs name {len(ids)} tokens that are not "
                             f"the {len(sent)} sent")
    if not isinstance(top, list) or len(top) != len(sent):
        raise ExactnessError(f"the prefill's meta_info.input_top_logprobs has "
                             f"{len(top) if isinstance(top, list) else repr(top)} entries for {len(sent)} tokens "
                             f"(top_logprobs_num {TOP_N})")
    out: list[tuple[float | None, list[list]]] = []
    for i, (c, t) in enumerate(zip(chosen, top, strict=True)):
        rows = [[float(e[0]), e[1], e[2] if len(e) > 2 else None] for e in (t or [])
                if isinstance(e, list | tuple) and len(e) >= 2 and isinstance(e[0], int | float)
                and isinstance(e[1], int)]
        lp = c[0] if isinstance(c[0], int | float) else None
        if i > 0 and (lp is None or not rows):
            raise ExactnessError(f"the prefill's log-probabilities at input position {i} are missing "
                                 f"({c!r}, top {t!r})")
        out.append((None if lp is None else float(lp), sorted(rows, key=lambda e: -e[0])))
    return out


# --- the judgement ------------------------------------------------------------------------------------------

def judge(prompt_id: str, prompt_len: int, tokens: list[int], texts: list[str | None],
          scored: list[tuple[float | None, list[list]]], tolerance: float) -> dict:
    """One prompt: every answered token against the target's top-1 at its position (``scored`` is
    ``parse_prefill`` of prompt + answer). A token is fine when it is the top-1 or its log-probability is less
    than ``tolerance`` below the top-1's (a near-tie)."""
    near: list[dict] = []
    outside: list[dict] = []
    for k, tok in enumerate(tokens):
        lp, top = scored[prompt_len + k]
        best_lp, best_id, best_text = top[0]
        if tok == best_id:
            continue
        gap = max(best_lp - lp, 0.0)
        item = {"step": k + 1, "token": tok, "text": texts[k] if k < len(texts) else None,
                "target_token": best_id, "target_text": best_text, "gap": round(gap, 6)}
        (near if gap < tolerance else outside).append(item)
    return {"prompt": prompt_id, "tokens": len(tokens), "near_ties": near, "outside": outside,
            "first_outside": outside[0] if outside else None}


def _tok(token: int, text: str | None) -> str:
    return f"{token} ({text!r})" if text is not None else str(token)


def _g(x: float) -> str:
    return f"{x:.3g}"


def verdict(per_prompt: list[dict], tolerance: float, max_new_tokens: int) -> Verdict:
    """Pass when no prompt has a token outside the rule; fail naming the first such token otherwise.
    A prompt answered with fewer tokens than asked (``ignore_eos``) fails too."""
    n = len(per_prompt)
    short = [p for p in per_prompt if p["tokens"] < max_new_tokens]
    bad = [p for p in per_prompt if p["outside"]]
    equal = sum(1 for p in per_prompt if not p["outside"] and not p["near_ties"] and p["tokens"] >= max_new_tokens)
    ties = [t for p in per_prompt for t in p["near_ties"]]
    tokens = sum(p["tokens"] for p in per_prompt)
    details = {"method": "self-check", "prompts": n, "equal": equal, "tolerance": tolerance,
               "max_new_tokens": max_new_tokens, "tokens": tokens,
               "near_ties": sum(len(p["near_ties"]) for p in per_prompt),
               "outside": sum(len(p["outside"]) for p in per_prompt),
               "failures": [{"prompt": p["prompt"], **p["first_outside"]} for p in bad],
               "per_prompt": per_prompt}
    if bad:
        p = bad[0]
        f = p["first_outside"]
        return Verdict(FAIL, f"prompt {p['prompt']} token {f['step']} of {p['tokens']}: candidate "
                       f"{_tok(f['token'], f['text'])}, but the target's top-1 after the same prefix is "
                       f"{_tok(f['target_token'], f['target_text'])}, {_g(f['gap'])} nats above it, not within "
                       f"the near-tie tolerance {_g(tolerance)} ({len(bad)} of {n} prompts, "
                       f"{details['outside']} of {tokens} tokens outside the rule; checked against the target's "
                       "own prefill on this server)", equal, details)
    if short:
        p = short[0]
        return Verdict(FAIL, f"prompt {p['prompt']}: answered {p['tokens']} tokens, asked for {max_new_tokens} "
                       f"with ignore_eos ({len(short)} of {n} prompts short)", equal, details)
    reason = (f"{tokens} of {tokens} tokens ({n} prompts x {max_new_tokens}) are the target's top-1 under its own "
              "prefill on this server")
    if ties:
        reason += (f" or within {_g(tolerance)} nats of it ({len(ties)} near-ties, gaps up to "
                   f"{_g(max(t['gap'] for t in ties))} nats)")
    return Verdict(PASS, reason + f"; {equal} of {n} prompts all top-1", equal, details)


# --- the whole check ----------------------------------------------------------------------------------------

def check_prompt(base_url: str, prompt: bench.Prompt, tolerance: float, max_new_tokens: int,
                 deadline: float) -> dict:
    """The two requests for one prompt, judged (``judge``); raises ExactnessError or ServingError."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise ExactnessError("not sent: the time limit ran out")
    prompt_ids, tokens, texts = parse_decode(_post(base_url, decode_body(prompt, max_new_tokens), left))
    left = deadline - time.monotonic()
    if left <= 0:
        raise ExactnessError("the prefill was not sent: the time limit ran out")
    sent = prompt_ids + tokens
    answer = _post(base_url, prefill_body(sent), left)
    scored = parse_prefill(answer, sent)
    result = judge(prompt.id, len(prompt_ids), tokens, texts, scored, tolerance)
    result["prefill_cached_tokens"] = answer["meta_info"].get("cached_tokens")  # 0, or parse_prefill refused it
    return result


def self_check(base_url: str, prompts: list[bench.Prompt] | None = None, tolerance: float = 0.1,
               concurrency: int = 4, timeout: float = 600.0,
               max_new_tokens: int = exactness.MAX_NEW_TOKENS) -> Verdict:
    """The candidate at ``base_url`` against the target's own prefill on the same server (module docstring).
    ``prompts`` default to the exactness set; at most ``concurrency`` prompts at a time, all within ``timeout``
    seconds. ``details["per_prompt"]`` has every prompt's near-ties and tokens outside the rule."""
    base_url = sglang_http.check_url(base_url)
    prompts = exactness.load_prompts() if prompts is None else prompts
    deadline = time.monotonic() + timeout
    results, errors = exactness.for_each_prompt(
        prompts, concurrency, deadline, lambda p: check_prompt(base_url, p, tolerance, max_new_tokens, deadline))
    missing = [p.id for p, r in zip(prompts, results, strict=True) if r is None]
    if errors or missing:
        first = errors[0] if errors else f"{missing[0]}: no answer within {timeout:g} s"
        return Verdict(INCONCLUSIVE, f"{len(missing)} of {len(prompts)} prompts could not be checked against the "
                       f"target's own prefill: {first}", None,
                       {"method": "self-check", "prompts": len(prompts), "errors": errors[:5]})
    return verdict([r for r in results if r is not None], tolerance, max_new_tokens)
