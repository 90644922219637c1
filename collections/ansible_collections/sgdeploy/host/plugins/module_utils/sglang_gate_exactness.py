# Copyright: sgdeploy contributors. Apache-2.0
"""The exactness gate: a speculative deploy must give the target's own greedy tokens.

A fixed prompt set (``sglang_gate_prompts.EXACTNESS``, 16 prompts) is answered greedily, 64 tokens
each, with the top-2 log-probabilities of every step. The **reference** is what the target alone (an
autoregressive config of the same model) answered; it is stored per model (repository and revision)
on the host, ``<state dir>/references/<model key>.json``. A speculative candidate answers the same
prompts; per prompt, at the first token that differs from the reference, the reference's top-1/top-2
gap must be below ``gates.exactness_tie_tolerance`` (a near-tie, where bf16 numerics of the verify
and decode paths may pick either) and the candidate's token must be the reference's runner-up;
otherwise the verdict is fail, naming the prompt, the step, both tokens and the gap. After the first
difference the two continuations have different prefixes and are not compared further.

Standard library only: shipped to the host with the gate module (sgdeploy.host.sglang_gate) and
imported by the controller's ``sgdeploy exactness`` (one implementation). See docs/gates.md.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_records as records
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_bench as bench
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_prompts, sglang_http

MAX_NEW_TOKENS = 64
TOP_N = 2
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
KIND = "sgdeploy-exactness-reference"
HOW_TO_MAKE = ("deploy an autoregressive config of this model (an `ar` config that passes its gates records "
               "the reference), or run `make reference CONFIG={config} HOST={host}`")


class ExactnessError(ValueError):
    """Bad exactness input (a reference file, an answer): one line naming the thing and the value."""


# --- the model a reference belongs to ------------------------------------------------------------------

def model_identity(deploy: dict) -> dict | None:
    """``{"key", "label"}`` of the target model of a deploy description (``render --json``), or None.

    hf: repository and revision; path: the folder; controller: the folder's name and version."""
    for m in deploy.get("models") or []:
        if not isinstance(m, dict) or m.get("role") != "model":
            continue
        source = m.get("source")
        if source == "hf" and m.get("repo"):
            label = f"{m['repo']}@{m.get('revision') or 'main'}"
        elif source == "controller" and m.get("name"):
            label = f"controller:{m['name']}@{m.get('version')}"
        elif m.get("local_dir"):
            label = f"path:{m['local_dir']}"
        else:
            continue
        key = re.sub(r"[^A-Za-z0-9._@-]+", "--", label).strip("-")
        return {"key": key, "label": label}
    return None


def reference_path(references_dir: str | Path, identity: dict) -> Path:
    return Path(references_dir) / f"{identity['key']}.json"


def load_prompts() -> list[bench.Prompt]:
    return bench.parse_prompts(sglang_gate_prompts.EXACTNESS, "the exactness prompts (sglang_gate_prompts.EXACTNESS)")


# --- asking the service ------------------------------------------------------------------------------------

def _pairs(entries: Any, where: str) -> list[list]:
    """``[[logprob, token_id, text], ...]`` as SGLang returns it → the same, checked."""
    if not isinstance(entries, list):
        raise ExactnessError(f"{where} is {type(entries).__name__}, expected a list of [logprob, token_id, text]")
    out = []
    for e in entries:
        if not (isinstance(e, list | tuple) and len(e) >= 2 and isinstance(e[1], int)
                and (e[0] is None or isinstance(e[0], int | float))):
            raise ExactnessError(f"{where} has {e!r}, expected [logprob, token_id, text]")
        out.append([e[0], e[1], e[2] if len(e) > 2 else None])
    return out


def parse_answer(answer: dict, top_needed: bool) -> dict:
    """Tokens and top-2 log-probabilities of one ``/generate`` answer with ``return_logprob``.

    SGLang 0.5.23 puts them in ``meta_info``: ``output_token_logprobs`` ``[[logprob, token_id,
    text|null], ...]`` (one per generated token) and ``output_top_logprobs`` (per token, a list of
    ``top_logprobs_num`` such triples, or null). A candidate (``top_needed`` false) whose release returns
    no log-probabilities is read from the answer's top-level ``output_ids`` instead."""
    meta = answer.get("meta_info") or {}
    ids = answer.get("output_ids")
    if "output_token_logprobs" not in meta and not top_needed and isinstance(ids, list) \
            and all(isinstance(t, int) for t in ids):
        return {"tokens": ids, "texts": [None] * len(ids)}  # the answer's own token ids (no log-probabilities)
    if "output_token_logprobs" not in meta:
        raise ExactnessError("the answer has no meta_info.output_token_logprobs: the release did not return "
                             "log-probabilities (return_logprob)")
    chosen = _pairs(meta["output_token_logprobs"], "meta_info.output_token_logprobs")
    out: dict[str, Any] = {"tokens": [c[1] for c in chosen], "texts": [c[2] for c in chosen]}
    top = meta.get("output_top_logprobs")
    if top is None and top_needed:
        raise ExactnessError("the answer has no meta_info.output_top_logprobs: the release did not return "
                             f"the top-{TOP_N} log-probabilities (top_logprobs_num)")
    if top is not None:
        if not isinstance(top, list) or len(top) != len(chosen):
            raise ExactnessError(f"meta_info.output_top_logprobs has {len(top) if isinstance(top, list) else top!r} "
                                 f"entries for {len(chosen)} tokens")
        rows = []
        for i, step in enumerate(top):
            pairs = _pairs(step or [], f"meta_info.output_top_logprobs[{i}]")
            if top_needed and (len(pairs) < TOP_N or any(p[0] is None for p in pairs[:TOP_N])):
                raise ExactnessError(f"meta_info.output_top_logprobs[{i}] has {len(pairs)} entries, "
                                     f"expected {TOP_N} with log-probabilities")
            rows.append([p[:3] for p in pairs[:TOP_N]])
        out["top"] = rows
    return out


def ask(base_url: str, prompt: bench.Prompt, timeout: float, top_needed: bool) -> dict:
    """One greedy request for ``MAX_NEW_TOKENS`` tokens with top-2 log-probabilities."""
    body = {"text": prompt.text, "return_logprob": True, "top_logprobs_num": TOP_N,
            "return_text_in_logprobs": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}}
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
    if not isinstance(answer, dict):
        raise ExactnessError("/generate answered JSON that is not an object")
    out = parse_answer(answer, top_needed)
    out["prompt_id"] = prompt.id
    return out


def collect(base_url: str, prompts: list[bench.Prompt], concurrency: int, timeout: float = 600.0,
            top_needed: bool = True) -> tuple[list[dict | None], list[str]]:
    """Every prompt's answer (None where it failed) and the errors, at most ``concurrency`` at a time,
    all within ``timeout`` seconds."""
    base_url = sglang_http.check_url(base_url)
    deadline = time.monotonic() + timeout

    def one(prompt: bench.Prompt) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ExactnessError(f"not sent when the time limit ({timeout:g} s) ran out")
        return ask(base_url, prompt, left, top_needed)

    return for_each_prompt(prompts, concurrency, deadline, one)


def for_each_prompt(prompts: list[bench.Prompt], concurrency: int, deadline: float,
                    work: Callable[[bench.Prompt], dict]) -> tuple[list[dict | None], list[str]]:
    """``work(prompt)`` for every prompt, at most ``concurrency`` at a time, waiting until ``deadline``
    (``time.monotonic()``) and 5 s more: the results in the prompts' order (None where it failed or had not
    finished) and the errors as ``<prompt id>: <error>``. ``work`` raises ExactnessError or ServingError for a
    prompt that failed; the others go on."""
    results: list[dict | None] = [None] * len(prompts)
    errors: list[str] = []
    lock = threading.Lock()
    todo = list(range(len(prompts)))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            try:
                result = work(prompts[i])
            except (ExactnessError, sglang_http.ServingError) as err:
                with lock:
                    errors.append(f"{prompts[i].id}: {err}")
                continue
            with lock:
                results[i] = result

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, len(prompts))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0) + 5)
    return results, errors


# --- reference files ------------------------------------------------------------------------------------------

def build_reference(outputs: list[dict], prompts: list[bench.Prompt], identity: dict, *, config: str, host: str,
                    release: str | None, concurrency: int) -> dict:
    return {"schema": 1, "kind": KIND, "model": identity, "config": config, "host": host, "release": release,
            "created": records.utc_now(), "prompts_digest": bench.prompts_digest(prompts),
            "max_new_tokens": MAX_NEW_TOKENS, "top_logprobs_num": TOP_N, "concurrency": concurrency,
            "outputs": [{"prompt_id": o["prompt_id"], "tokens": o["tokens"], "texts": o["texts"], "top": o["top"]}
                        for o in outputs]}


def write_reference(path: str | Path, reference: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_json(path, reference)  # atomic: temporary file, fsync, rename


def read_reference(path: str | Path) -> dict:
    data = records.read_json(path, f"reference {path}", ExactnessError)
    if not isinstance(data, dict) or data.get("kind") != KIND or not isinstance(data.get("outputs"), list):
        raise ExactnessError(f"reference {path}: not an exactness reference (kind {KIND!r} with outputs)")
    return data


# --- the comparison ----------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    verdict: str  # pass | fail | inconclusive
    reason: str
    equal: int | None = None  # prompts whose tokens equal the reference's
    details: dict[str, Any] = field(default_factory=dict)


def _tok(token: int, text: str | None) -> str:
    return f"{token} ({text!r})" if text is not None else str(token)


def _g(x: float) -> str:
    return f"{x:.3g}"


def _own_and_runner_up(top: list, token: int) -> tuple[float, tuple[float, int, str | None]]:
    """The log-probability of the token the reference chose, and the best other token of its top list.

    At an exact tie the server may list its own token second (seen on the H200: top-2 ``[[-1.709, 2],
    [-1.709, 0]]`` with token 0 chosen), so the runner-up is "the best listed token that is not the
    reference's own", not "the second entry"."""
    own = next((float(e[0]) for e in top if e[1] == token), float(top[0][0]))
    others = [e for e in top if e[1] != token]
    lp2, id2, t2 = max(others, key=lambda e: float(e[0]))
    return own, (float(lp2), id2, t2)


def compare(reference: dict, candidate: list[dict], tolerance: float) -> Verdict:
    """Per prompt, find the first token that differs from the reference and judge it (module docstring)."""
    ref = {o["prompt_id"]: o for o in reference["outputs"]}
    equal, flips, failures = 0, [], []
    for cand in candidate:
        r = ref.get(cand["prompt_id"])
        if r is None:
            return Verdict(INCONCLUSIVE, f"the reference has no output for prompt {cand['prompt_id']}: remake it")
        rt, ct = r["tokens"], cand["tokens"]
        step = next((i for i, (a, b) in enumerate(zip(rt, ct, strict=False)) if a != b), None)
        if step is None:
            if len(ct) < len(rt):
                failures.append({"prompt": cand["prompt_id"], "step": len(ct) + 1, "problem":
                                 f"answered {len(ct)} tokens, the reference {len(rt)}"})
            else:
                equal += 1
            continue
        lp1, (lp2, id2, t2) = _own_and_runner_up(r["top"][step], rt[step])
        gap = max(lp1 - lp2, 0.0)
        item = {"prompt": cand["prompt_id"], "step": step + 1, "reference_token": rt[step],
                "reference_text": r["texts"][step], "candidate_token": ct[step],
                "candidate_text": (cand.get("texts") or [None] * len(ct))[step],
                "gap": round(gap, 6), "runner_up": id2, "runner_up_text": t2}
        if gap < tolerance and ct[step] == id2:
            flips.append(item)
        else:
            item["problem"] = (f"the reference's top-1/top-2 gap there is {_g(gap)} nats, not below the "
                               f"near-tie tolerance {_g(tolerance)}" if gap >= tolerance else
                               f"a near-tie ({_g(gap)} nats), but the candidate's token is not the reference's "
                               f"runner-up {_tok(id2, t2)}")
            failures.append(item)
    n = len(candidate)
    details = {"prompts": n, "equal": equal, "near_tie_flips": flips, "failures": failures,
               "tolerance": tolerance, "max_new_tokens": reference.get("max_new_tokens"),
               "reference": {k: reference.get(k) for k in ("model", "config", "release", "created")}}
    counts = f"{equal} of {n} prompts equal the reference"
    if flips:
        counts += f", {len(flips)} first differ at a near-tie"
    if failures:
        f = failures[0]
        if "reference_token" in f:
            what = (f"prompt {f['prompt']} first differs at token {f['step']} of {len(ref[f['prompt']]['tokens'])}: "
                    f"reference {_tok(f['reference_token'], f['reference_text'])}, candidate "
                    f"{_tok(f['candidate_token'], f['candidate_text'])}; {f['problem']}")
        else:
            what = f"prompt {f['prompt']}: {f['problem']}"
        return Verdict(FAIL, f"{what} ({len(failures)} of {n} prompts differ beyond a near-tie; {counts})",
                       equal, details)
    reason = f"{counts}" + (f" (gaps {', '.join(_g(x['gap']) for x in flips)} nats, below {_g(tolerance)})"
                            if flips else f" ({reference.get('max_new_tokens')} greedy tokens each)")
    return Verdict(PASS, reason, equal, details)


def comparable(reference: dict, prompts: list[bench.Prompt]) -> str | None:
    """Why the reference cannot be compared with answers to ``prompts`` (None when it can)."""
    digest = bench.prompts_digest(prompts)
    if reference.get("prompts_digest") != digest or reference.get("max_new_tokens") != MAX_NEW_TOKENS:
        return (f"the reference was made with another prompt set or length (prompts {reference.get('prompts_digest')}, "
                f"{reference.get('max_new_tokens')} tokens; now {digest}, {MAX_NEW_TOKENS})")
    return None
