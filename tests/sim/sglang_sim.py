#!/usr/bin/env python3
"""SGLang SIMULATOR: test equipment for the lab, never deployed to real hosts.

Started by the rendered systemd unit in place of ``python -m sglang.launch_server`` with the same flags:

    <release>/venv/bin/python /opt/sglang-sim/sglang_sim.py --model-path ... --port ...

It speaks the subset of SGLang's HTTP API that the project uses and produces acceptance lengths and
throughput from a model of speculative decoding (see README.md next to this file). It learns which patch
features its release carries (ddtree, fork, topk) from the installed ``sglang`` distribution's version,
never from a flag. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import importlib.metadata
import json
import math
import os
import queue
import random
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling sim_nodes, also when loaded by path
import sim_nodes  # noqa: E402  (test equipment: one engine over several hosts)

PROG = "sglang_sim"
BASE_VERSION = "0.5.23"
KNOWN_FEATURES = ("ddtree", "fork", "topk")
DEFAULT_CONTEXT_LEN = 32768

# ---------------------------------------------------------------------------------------------------------
# Acceptance and step-time model (documented with its field anchors in README.md)
# ---------------------------------------------------------------------------------------------------------

AR_STEP_MS = 37.0  # autoregressive decode step: 173.4 tok/s was 6.5x autoregressive -> ~26.7 tok/s
SPEC_BASE_MS = 48.1  # fixed part of a speculative step: target verify pass + drafter forward
NODE_MS = 0.02  # per verified tree node (tree attention over the extra positions)
ACCEPT_MS = 1.16  # per accepted token (drafter conditions on the accepted tokens' hidden states, commit)
TOPK_DEPTH_MS = 1.4  # one full lm_head pass (248k x 5120 bf16 at 1.8 TB/s); unfused: one per tree depth
BATCH_FACTOR = 0.03  # step time grows 3% per extra running request
PREFILL_BASE_MS = 12.0
PREFILL_TOKEN_MS = 0.05

DFLASH_TOKEN_P = 0.86  # DFlash chain: probability that a drafted position is accepted given its parent was
TREE_TAU = 4.8  # DDTree: budget scale over which the tree closes the gap to the block-size ceiling
TREE_HEADROOM = 0.1  # the ceiling of the mean accept length is block_size - headroom
TOPK_BASE = 0.6  # top-k cap factor g(K) = 1 - TOPK_BASE**K  (K=1 is a chain: about DFlash)
DEFAULT_TOPK_CAP = 8
COLLAPSE_FLOOR = 0.18  # without forking on a recurrent model, the share of the gain that survives...
COLLAPSE_POWER = 1.6  # ...plus a part decaying as ((block_size - 1) / budget) ** power
NOISE_REL = 0.12  # per-step noise: sd = NOISE_REL * mean, bounded by half the distance to 1 and the cap


@dataclass(frozen=True)
class SpecConfig:
    algorithm: str = "NONE"  # NONE, DFLASH, DDTREE
    block_size: int = 16
    budget: int = 15
    topk_cap: int = DEFAULT_TOPK_CAP
    hybrid: bool = False  # target has recurrent (GDN/Mamba) layers
    fork: bool = False  # release has tree-aware state forking
    fused_topk: bool = False  # release has the fused per-depth top-k

    @property
    def cap(self) -> int:
        """Most tokens one step can yield."""
        if self.algorithm == "NONE":
            return 1
        if self.algorithm == "DFLASH":
            return self.block_size
        return min(self.block_size, self.budget + 1)

    @property
    def nodes(self) -> int:
        """Positions the target verifies per request per step."""
        if self.algorithm == "NONE":
            return 1
        if self.algorithm == "DFLASH":
            return self.block_size
        return self.budget + 1

    @property
    def collapses(self) -> bool:
        return (self.algorithm == "DDTREE" and self.hybrid and not self.fork
                and self.budget > self.block_size - 1)


def ddtree_switches(args: argparse.Namespace, features: set[str]) -> tuple[bool, bool]:
    """(state forking on, fused top-k on): the release must carry the feature and the server flag
    (`--speculative-ddtree-state-forking`, `--speculative-ddtree-topk`, on/fused by default as in
    the patched SGLang) must not switch it off."""
    fork = "fork" in features and (getattr(args, "speculative_ddtree_state_forking", None) or "on") == "on"
    fused = "topk" in features and (getattr(args, "speculative_ddtree_topk", None) or "fused") == "fused"
    return fork, fused


def mean_accept(cfg: SpecConfig) -> float:
    """Mean accepted tokens per verify step (bonus token included)."""
    if cfg.algorithm == "NONE":
        return 1.0
    if cfg.algorithm == "DFLASH":
        p = DFLASH_TOKEN_P
        return (1.0 - p ** cfg.block_size) / (1.0 - p)
    gain = (cfg.block_size - TREE_HEADROOM - 1.0) * (1.0 - TOPK_BASE ** cfg.topk_cap)
    clean = 1.0 + gain * (1.0 - math.exp(-cfg.budget / TREE_TAU))
    if cfg.collapses:
        decay = ((cfg.block_size - 1) / cfg.budget) ** COLLAPSE_POWER
        share = COLLAPSE_FLOOR + (1.0 - COLLAPSE_FLOOR) * decay
        clean = 1.0 + (clean - 1.0) * share
    return min(clean, float(cfg.cap))


def step_ms(cfg: SpecConfig, accepted: float, batch: int = 1) -> float:
    """Model time of one decode step for a batch of `batch` requests accepting `accepted` tokens each."""
    if cfg.algorithm == "NONE":
        ms = AR_STEP_MS
    else:
        ms = SPEC_BASE_MS + NODE_MS * cfg.nodes + ACCEPT_MS * accepted
        if cfg.algorithm == "DDTREE" and not cfg.fused_topk:
            ms += TOPK_DEPTH_MS * (cfg.block_size - 1)
        else:
            ms += TOPK_DEPTH_MS
    return ms * (1.0 + BATCH_FACTOR * (max(1, batch) - 1))


def expected_tokens_per_s(cfg: SpecConfig) -> float:
    acc = mean_accept(cfg)
    return acc * 1000.0 / step_ms(cfg, acc)


def draw_accept(rng: random.Random, mean: float, cap: int) -> int:
    """One step's accepted tokens: mean plus small bounded noise, stochastically rounded (mean-preserving)."""
    if cap <= 1:
        return 1
    sd = min(NOISE_REL * mean, 0.5 * (mean - 1.0), 0.5 * (cap - mean))
    x = rng.gauss(mean, sd) if sd > 0 else mean
    x = min(float(cap), max(1.0, x))
    k = int(x)
    if rng.random() < x - k:
        k += 1
    return max(1, min(cap, k))


# ---------------------------------------------------------------------------------------------------------
# Logging, release and model introspection
# ---------------------------------------------------------------------------------------------------------

_log_lock = threading.Lock()


def log(msg: str) -> None:
    line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n"
    with _log_lock:
        sys.stderr.write(line)
        sys.stderr.flush()


def release_features() -> tuple[str | None, set[str]]:
    """The installed sglang version and the patch features its local label names."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        log("WARNING: no sglang distribution installed in this environment; simulating a stock release")
        return None, set()
    local = version.split("+", 1)[1] if "+" in version else "stock"
    if re.fullmatch(r"[0-9a-fx][0-9a-f]{11}", local):  # the series hash: one build carries every feature
        return version, set(KNOWN_FEATURES)
    segments = [s for s in local.split(".") if s]
    features = {s for s in segments if s in KNOWN_FEATURES}
    unknown = [s for s in segments if s not in KNOWN_FEATURES and s != "stock"
               and not re.fullmatch(r"[0-9a-f]{8}", s)]
    if unknown:
        log(f"WARNING: release label {local!r} has unknown segments {unknown}; ignoring them")
    return version, features


HYBRID_MODEL_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_6", "qwen3_6_moe",
                      "mamba", "mamba2", "jamba", "nemotron_h", "falcon_h1", "bamba", "zamba2"}
HYBRID_KEY_MARKERS = ("linear_attn", "linear_attention", "linear_conv", "linear_num_", "linear_key_",
                      "linear_value_", "mamba", "ssm_")
HYBRID_NAME_RE = re.compile(r"qwen3[._-]?(5|6)\b|qwen3[._-]?(5|6)[._-]|qwen3[._-]?next", re.IGNORECASE)


class StartupError(Exception):
    """A failure during start-up: logged as one line, exit 1."""


def _config_is_hybrid(cfg: object) -> bool:
    if isinstance(cfg, dict):
        model_type = str(cfg.get("model_type", "")).lower()
        if model_type in HYBRID_MODEL_TYPES:
            return True
        for key, value in cfg.items():
            k = str(key).lower()
            if any(m in k for m in HYBRID_KEY_MARKERS):
                return True
            if k in ("layer_types", "layers_block_type", "hybrid_override_pattern"):
                text = json.dumps(value).lower()
                if "linear" in text or "mamba" in text:
                    return True
            if isinstance(value, dict) and _config_is_hybrid(value):
                return True
    return False


def model_is_hybrid(model_path: str) -> tuple[bool, str]:
    """Whether the target has recurrent layers, and how that was decided."""
    path = Path(model_path)
    config = path / "config.json"
    if path.is_dir() and config.is_file():
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StartupError(f"cannot read model config {config}: {exc}") from None
        return _config_is_hybrid(cfg), str(config)
    if path.is_dir():
        raise StartupError(f"model path {model_path} is a folder without config.json")
    return bool(HYBRID_NAME_RE.search(model_path)), "model name"


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, argparse-like, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(has_ddtree: bool) -> Parser:
    p = Parser(prog=PROG, allow_abbrev=False,
               description="SGLang simulator (test equipment); takes sglang.launch_server's flags")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-dflash-block-size", type=int, default=None)
    if has_ddtree:
        p.add_argument("--speculative-ddtree-budget", type=int, default=None)
        p.add_argument("--speculative-ddtree-topk-cap", type=int, default=None)
        p.add_argument("--speculative-ddtree-state-forking", choices=("on", "off"), default=None)
        p.add_argument("--speculative-ddtree-topk", choices=("fused", "torch"), default=None)
        p.add_argument("--speculative-ddtree-budget-schedule", default=None)  # "1:64,4:32,8:15" (issue 38)
    p.add_argument("--attention-backend")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--log-level", default="info")
    # SGLang's --api-key: every route but /health* and /metrics asks "Authorization: Bearer <key>"; never logged.
    p.add_argument("--api-key", default=None)
    # One engine over several hosts (tests/sim/sim_nodes.py): rank 0 serves HTTP once every rank joined.
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None)
    return p


def _check_range(parser: Parser, flag: str, value, lo, hi) -> None:
    if value is not None and not (lo <= value <= hi):
        parser.error(f"argument {flag}: invalid value {value}: must be between {lo} and {hi}")


def budget_schedule(parser: Parser, args: argparse.Namespace) -> tuple[tuple[int, int], ...] | None:
    """--speculative-ddtree-budget-schedule "1:64,4:32,8:15" as the patched server takes it (issue 38):
    min_batch:budget entries, min_batch ascending from 1, and --speculative-ddtree-budget their largest."""
    text = args.speculative_ddtree_budget_schedule
    if text is None:
        return None
    flag = "--speculative-ddtree-budget-schedule"
    entries = []
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+):(\d+)\s*", item)
        if not m:
            parser.error(f"argument {flag}: invalid value {text!r}: entry {item!r} is not min_batch:budget")
        entries.append((int(m.group(1)), int(m.group(2))))
    if entries[0][0] != 1 or any(b[0] <= a[0] for a, b in zip(entries, entries[1:], strict=False)):
        parser.error(f"argument {flag}: invalid value {text!r}: min_batch must start at 1 and increase")
    if max(b for _, b in entries) != args.speculative_ddtree_budget:
        parser.error(f"argument {flag}: invalid value {text!r}: --speculative-ddtree-budget "
                     f"({args.speculative_ddtree_budget}) must equal the largest scheduled budget")
    return tuple(entries)


def parse_args(argv: list[str], version: str | None, features: set[str]) -> argparse.Namespace:
    has_ddtree = "ddtree" in features
    parser = build_parser(has_ddtree)
    args, unknown = parser.parse_known_args(argv)
    release = f"sglang {version}" if version else "sglang (not installed, treated as stock)"
    ddtree_flags = [u.split("=", 1)[0] for u in unknown if u.startswith("--speculative-ddtree")]
    if ddtree_flags:
        parser.error(f"unrecognized arguments: {' '.join(ddtree_flags)} "
                     f"({release} is built without the ddtree patch)")
    if unknown:
        log(f"WARNING: ignoring unknown arguments (not simulated): {' '.join(unknown)}")
    allowed = ["NONE", "DFLASH"] + (["DDTREE"] if has_ddtree else [])
    algo = (args.speculative_algorithm or "NONE").upper()
    if algo not in allowed:
        extra = "" if algo != "DDTREE" else f"; {release} is built without the ddtree patch"
        parser.error(f"argument --speculative-algorithm: invalid choice: {args.speculative_algorithm!r} "
                     f"(choose from {', '.join(allowed)}{extra})")
    args.speculative_algorithm = algo
    _check_range(parser, "--port", args.port, 1, 65535)
    sim_nodes.check_args(args, parser.error)
    _check_range(parser, "--tp-size", args.tp_size, 1, 64)
    _check_range(parser, "--speculative-dflash-block-size", args.speculative_dflash_block_size, 2, 64)
    _check_range(parser, "--context-length", args.context_length, 16, 10_000_000)
    if args.mem_fraction_static is not None and not (0.0 < args.mem_fraction_static <= 1.0):
        parser.error(f"argument --mem-fraction-static: invalid value {args.mem_fraction_static}: "
                     "must be in (0, 1]")
    if not has_ddtree:
        args.speculative_ddtree_budget = None
        args.speculative_ddtree_topk_cap = None
        args.speculative_ddtree_state_forking = None
        args.speculative_ddtree_topk = None
        args.speculative_ddtree_budget_schedule = None
    _check_range(parser, "--speculative-ddtree-budget", args.speculative_ddtree_budget, 1, 4096)
    _check_range(parser, "--speculative-ddtree-topk-cap", args.speculative_ddtree_topk_cap, 1, 256)
    if algo != "NONE" and not args.speculative_draft_model_path:
        parser.error(f"argument --speculative-draft-model-path: required with --speculative-algorithm {algo}")
    if algo != "NONE" and args.speculative_dflash_block_size is None:
        args.speculative_dflash_block_size = 16
    if algo == "DDTREE":
        if args.speculative_ddtree_budget is None:
            args.speculative_ddtree_budget = 15
        if args.speculative_ddtree_topk_cap is None:
            args.speculative_ddtree_topk_cap = DEFAULT_TOPK_CAP
        args.speculative_ddtree_budget_schedule = budget_schedule(parser, args)
    if not args.served_model_name:
        args.served_model_name = args.model_path
    return args


# ---------------------------------------------------------------------------------------------------------
# Simulated engine: one step loop shared by all running requests
# ---------------------------------------------------------------------------------------------------------

WORDS = ("the", "model", "drafts", "a", "tree", "of", "tokens", "and", "verifies", "it", "in", "one",
         "pass", "state", "block", "budget", "accepts", "path", "server", "decode", "step", "batch",
         "cache", "layer", "attention", "recurrent", "fork", "kernel", "graph", "warm", "gate", "release",
         "speculative", "draft", "target", "sequence", "length", "node", "depth", "sibling", "parent",
         "child", "commit", "window", "conv", "head", "vocab", "rank", "fused", "shard", "host", "unit",
         "deploy", "rollback", "record", "sweep", "measure", "throughput", "latency", "signal", "drain",
         "port", "health", "ready")


WORD_IDS = {w: i for i, w in enumerate(WORDS)}
PIECE_IDS = 100_000  # a prompt piece that is not one of WORDS gets len(WORDS) + (a hash of it) % PIECE_IDS
VOCAB_SIZE = len(WORDS) + PIECE_IDS
_pieces: dict[int, str] = {}  # token id -> text, for the prompt pieces seen (text in input log-probabilities)
_pieces_lock = threading.Lock()


def tokenize(text: str) -> list[int]:
    """The simulated tokenizer: words and punctuation marks; one of WORDS is its index, any other piece a
    hashed id above them. So the text of generated tokens tokenizes back to the same ids, and an empty
    prompt is one token (the empty piece)."""
    pieces = re.findall(r"\w+|[^\w\s]", text) or [""]
    ids = []
    for piece in pieces:
        tid = WORD_IDS.get(piece)
        if tid is None:
            h = hashlib.sha256(b"piece" + piece.encode("utf-8")).digest()
            tid = len(WORDS) + int.from_bytes(h[:4], "little") % PIECE_IDS
            with _pieces_lock:
                if len(_pieces) < 1_000_000:
                    _pieces[tid] = piece
        ids.append(tid)
    return ids


def token_text(tid: int) -> str | None:
    """What a token id reads as (with its leading space, as the WORDS in answers), None if never seen."""
    if 0 <= tid < len(WORDS):
        return " " + WORDS[tid]
    with _pieces_lock:
        piece = _pieces.get(tid)
    return None if piece is None else " " + piece


def prompt_tokens(text: str) -> int:
    return len(tokenize(text))


# ---------------------------------------------------------------------------------------------------------
# The target's greedy tokens and log-probabilities (what the exactness gate compares; README.md)
# ---------------------------------------------------------------------------------------------------------

NEAR_TIE_RATE = 0.03  # share of the target's steps whose top-1/top-2 gap is a near-tie...
NEAR_TIE_GAP = 0.03  # ...below this many nats (the H200's measured bf16 verify/decode flips: gaps <= 0.031)
WIDE_GAP = (0.3, 3.0)  # any other step's gap lies in this range (nats)
REST_MASS = 0.2  # probability of the tokens other than the top two (shapes the log-probabilities only)
FLIP_SHARE = 0.4  # a speculative engine takes the runner-up at this share of the near-tie steps (numerics)
LEAK_RATE = 0.5  # no forking, hybrid, budget > block - 1: per-step divergence LEAK_RATE * (1 - ((B-1)/b)^1.6)


@dataclass(frozen=True)
class TargetStep:
    """The simulated target at one position: its top two tokens (ids into WORDS) and their log-probs."""

    top1: int
    lp1: float
    top2: int
    lp2: float
    other: int  # a third token (what a state leak may pick)
    u_flip: float  # uniform draws fixed by the position: near-tie flip and leak decisions
    u_leak: float

    @property
    def gap(self) -> float:
        return self.lp1 - self.lp2


def _u32(h: bytes, i: int) -> int:
    return int.from_bytes(h[4 * i:4 * i + 4], "little")


def target_step(state: bytes) -> TargetStep:
    h = hashlib.sha256(b"target" + state).digest()
    v = len(WORDS)
    top1 = _u32(h, 0) % v
    top2 = (top1 + 1 + _u32(h, 1) % (v - 1)) % v
    other = next(t for t in ((top1 + 1 + _u32(h, 2) % (v - 1) + k) % v for k in range(3)) if t not in (top1, top2))
    u = _u32(h, 3) / 2**32
    near = _u32(h, 4) / 2**32 < NEAR_TIE_RATE
    gap = u * NEAR_TIE_GAP if near else WIDE_GAP[0] + u * (WIDE_GAP[1] - WIDE_GAP[0])
    p1 = (1.0 - REST_MASS) / (1.0 + math.exp(-gap))
    return TargetStep(top1, math.log(p1), top2, math.log(p1) - gap, other, _u32(h, 5) / 2**32, _u32(h, 6) / 2**32)


def leak_rate(cfg: SpecConfig) -> float:
    """Per-step share of steps at which a state leak makes the engine's token differ from the target's."""
    if not cfg.collapses:  # forking on, a pure-attention target, or a budget within the block
        return 0.0
    return LEAK_RATE * (1.0 - ((cfg.block_size - 1) / cfg.budget) ** COLLAPSE_POWER)


ROOT_STATE = hashlib.sha256(b"sglang-sim target").digest()


def next_state(state: bytes, token: int) -> bytes:
    return hashlib.sha256(state + token.to_bytes(4, "little")).digest()


def state_after(ids: list[int]) -> bytes:
    """The target's state after the tokens ``ids``: the target is a deterministic function of the token ids
    so far, the same for a prompt given as text or as ids, and for tokens prefilled or decoded."""
    state = ROOT_STATE
    for t in ids:
        state = next_state(state, t)
    return state


def token_logprob(st: TargetStep, token: int) -> float:
    return st.lp1 if token == st.top1 else st.lp2 if token == st.top2 else math.log(REST_MASS / (len(WORDS) - 2))


def input_logprobs(ids: list[int], start: int) -> list[tuple[int, float | None, TargetStep | None]]:
    """The target's prefill of ``ids``: for every position from ``start``, (token id, its log-prob given the
    tokens before it, the target's step there), as SGLang 0.5.23 returns input log-probabilities: the first
    returned position has none (``[None] + ...``, whatever ``start`` is)."""
    out = []
    state = ROOT_STATE
    for j, t in enumerate(ids):
        if j >= start:
            if j == start:
                out.append((t, None, None))
            else:
                st = target_step(state)
                out.append((t, token_logprob(st, t), st))
        state = next_state(state, t)
    return out


def decode(prompt: str | list[int], n: int, cfg: SpecConfig | None = None,
           rng: random.Random | None = None) -> list[tuple[int, float, TargetStep]]:
    """``n`` tokens for ``prompt`` (text, or token ids): (token id, its log-prob, the target's step) each.
    The target's state is a hash of the token ids so far (``state_after``), so a different token changes
    every later step; a prefill of prompt + answer (``input_logprobs``) sees the same steps.

    Greedy (``rng`` None): the autoregressive engine takes top-1 always; a speculative engine takes the
    runner-up at a fixed share of the near-tie steps (deterministic per prompt), and, with a state leak
    (``leak_rate``), the runner-up or a third token at that rate; both only after the first token, which
    comes from the prefill. Sampled: a random token (from ``rng``)."""
    state = state_after(tokenize(prompt) if isinstance(prompt, str) else list(prompt))
    speculative = cfg is not None and cfg.algorithm != "NONE"
    leak = leak_rate(cfg) if cfg is not None else 0.0
    out = []
    for i in range(n):
        st = target_step(state)
        if rng is not None:
            token = rng.randrange(len(WORDS))
        else:
            token = st.top1
            if i == 0:  # the first token comes from the target's prefill, not from a verify step
                pass
            elif speculative and st.gap < NEAR_TIE_GAP and st.u_flip < FLIP_SHARE:
                token = st.top2
            if i > 0 and st.u_leak < leak:
                token = st.top2 if st.u_flip < 0.5 else st.other
        out.append((token, token_logprob(st, token), st))
        state = next_state(state, token)
    return out


def greedy_words(prompt: str, n: int, cfg: SpecConfig | None = None) -> list[str]:
    return [WORDS[t] for t, _lp, _st in decode(prompt, n, cfg)]


class Request:
    def __init__(self, prompt: str | list[int], max_new: int, greedy: bool, seed: int, sample_rng: random.Random,
                 stream: bool, cfg: SpecConfig | None = None, logprob_start_len: int | None = None):
        """``prompt``: text, or token ids (SGLang's ``input_ids``). ``logprob_start_len``: None without
        ``return_logprob``, else the request's value (-1: the output only), which bounds the prefix the
        cache may serve as in SGLang 0.5.23 (``Req._compute_max_prefix_len``)."""
        self.prompt_ids = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self.prompt = prompt if isinstance(prompt, str) else "ids:" + ",".join(map(str, self.prompt_ids))
        self.prompt_tokens = len(self.prompt_ids)
        self.logprob_start_len = logprob_start_len
        self.cached_tokens = 0
        self.max_new = max_new
        self.id = uuid.uuid4().hex
        if greedy:
            self.rng = random.Random(f"{seed}:{max_new}:{self.prompt}")
            self.steps = decode(self.prompt_ids, max_new, cfg)
        else:
            self.rng = random.Random(sample_rng.random())
            self.steps = decode(self.prompt_ids, max_new, cfg, random.Random(self.rng.random()))
        self.words = [WORDS[t] for t, _lp, _st in self.steps]
        self.generated = 0
        self.verify_ct = 0
        self.prefilled = False
        self.start = time.monotonic()
        self.end: float | None = None
        self.first_token: float | None = None  # when the first output token was produced (TTFT)
        self.last_token: float | None = None  # when the latest output tokens were produced (inter-token latency)
        self.stream = stream
        self.health = False  # /health_generate's probe: SGLang counts it like any request; kept for the log
        self.done = threading.Event()
        self.updates: queue.Queue | None = queue.Queue() if stream else None

    @property
    def remaining(self) -> int:
        return self.max_new - self.generated

    @property
    def max_prefix(self) -> int:
        """Most prompt tokens the prefix cache may serve: all but the last, and with return_logprob none
        from logprob_start_len on (their log-probabilities must be computed)."""
        n = self.prompt_tokens - 1
        if self.logprob_start_len is not None and self.logprob_start_len >= 0:
            n = min(n, self.logprob_start_len)
        return max(n, 0)

    def output_ids(self) -> list[int]:
        return [t for t, _lp, _st in self.steps[:self.generated]]

    def text(self, upto: int | None = None) -> str:
        n = self.generated if upto is None else upto
        return "".join(" " + w for w in self.words[:n])

    def advance(self, k: int, verify: bool) -> None:
        now = time.monotonic()
        if self.generated == 0 and k > 0:
            self.first_token = now
        self.last_token = now
        self.generated += k
        if verify:
            self.verify_ct += 1
        if self.updates is not None:
            self.updates.put(self.generated)

    def finish(self) -> None:
        self.end = time.monotonic()
        self.done.set()
        if self.updates is not None:
            self.updates.put(None)


class Histogram:
    """A Prometheus histogram with SGLang 0.5.23's buckets (``observability/metrics_collector.py``)."""

    def __init__(self, buckets: list[float]):
        self.bounds = list(buckets)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.sum += value * n
        self.count += n
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += n
                break

    def lines(self, name: str, labels: str) -> list[str]:
        out, cum = [], 0
        for bound, c in zip(self.bounds, self.counts, strict=True):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{float(bound)}"}} {float(cum)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_sum{{{labels}}} {float(self.sum)}")
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        return out


# SGLang 0.5.23's default buckets (TokenizerMetricsCollector)
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]


class FinishedStats:
    """What SGLang's tokenizer-side collector counts when a request finishes or aborts, split by
    ``is_streaming`` where 0.5.23 splits it."""

    def __init__(self) -> None:
        self.requests = {"true": 0, "false": 0}
        self.prompt_tokens = {"true": 0, "false": 0}
        self.generation_tokens = {"true": 0, "false": 0}
        self.spec_verify_calls = 0
        self.aborted = 0
        self.ttft = {"true": Histogram(TTFT_BUCKETS), "false": Histogram(TTFT_BUCKETS)}
        self.e2e = {"true": Histogram(E2E_BUCKETS), "false": Histogram(E2E_BUCKETS)}
        self.itl = Histogram(ITL_BUCKETS)

    def finished(self, r: Request) -> None:
        key = "true" if r.stream else "false"
        self.requests[key] += 1
        self.prompt_tokens[key] += r.prompt_tokens
        self.generation_tokens[key] += r.generated
        self.spec_verify_calls += r.verify_ct
        if r.first_token is not None:
            self.ttft[key].observe(r.first_token - r.start)
        self.e2e[key].observe((r.end or time.monotonic()) - r.start)


class PrefixCache:
    """The radix cache's view that a client sees (``meta_info.cached_tokens``): a trie of the token ids of
    prompts (after their prefill) and of finished requests (prompt and answer). Cleared when it holds
    ``limit`` tokens (eviction, simplified)."""

    def __init__(self, limit: int = 2_000_000):
        self.root: dict = {}
        self.size = 0
        self.limit = limit

    def match(self, ids: list[int], most: int) -> int:
        node, n = self.root, 0
        for t in ids[:most]:
            node = node.get(t)
            if node is None:
                break
            n += 1
        return n

    def insert(self, ids: list[int]) -> None:
        if self.size + len(ids) > self.limit:
            self.root, self.size = {}, 0
        node = self.root
        for t in ids:
            child = node.get(t)
            if child is None:
                child = node[t] = {}
                self.size += 1
            node = child


class Engine:
    LOG_INTERVAL = 40  # decode steps between "Decode batch" lines, as SGLang's decode_log_interval

    def __init__(self, cfg: SpecConfig, accept_mean: float, slowdown: float, seed: int,
                 schedule: tuple[tuple[int, int], ...] | None = None):
        self.cfg = cfg
        self.schedule = schedule  # ((min_batch, budget), ...): the budget per running batch size (issue 38)
        self.step_budget = cfg.budget
        self.accept_mean = accept_mean
        self.slowdown = slowdown
        self.seed = seed
        self.sample_rng = random.Random(seed)
        self.cv = threading.Condition()
        self.reqs: list[Request] = []
        self.cache = PrefixCache()
        # statistics
        self.cum_accept = 0
        self.cum_verify = 0
        self.stats = FinishedStats()
        self.gen_throughput = 0.0
        self.spec_accept_length = 0.0
        self._win_tokens = 0
        self._win_accept = 0
        self._win_verify = 0
        self._win_steps = 0
        self._win_start = time.monotonic()
        threading.Thread(target=self._loop, name="scheduler", daemon=True).start()

    def new_request(self, prompt: str | list[int], max_new: int, greedy: bool, stream: bool,
                    logprob_start_len: int | None = None) -> Request:
        with self.cv:
            return Request(prompt, max_new, greedy, self.seed, self.sample_rng, stream, self.cfg,
                           logprob_start_len)

    def submit(self, req: Request) -> None:
        with self.cv:
            req.cached_tokens = self.cache.match(req.prompt_ids, req.max_prefix)
            if req.max_new <= 0:
                req.prefilled = True
                self.cache.insert(req.prompt_ids)
                req.finish()
                self.stats.finished(req)
                return
            self.reqs.append(req)
            self.cv.notify_all()

    @property
    def running(self) -> int:
        with self.cv:
            return len(self.reqs)

    def _sleep(self, ms: float) -> None:
        time.sleep(ms * self.slowdown / 1000.0)

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.reqs:
                    self.cv.wait()
                batch = list(self.reqs)
                if self._win_steps == 0 and self._win_tokens == 0:  # interval starts with work, not idle
                    self._win_start = time.monotonic()
            new = [r for r in batch if not r.prefilled]
            if new:  # prefill batch: yields each new request's first token
                self._sleep(PREFILL_BASE_MS + PREFILL_TOKEN_MS * sum(r.prompt_tokens for r in new))
                with self.cv:
                    for r in new:
                        r.prefilled = True
                        self.cache.insert(r.prompt_ids)
                        r.advance(1, verify=False)
                        self._win_tokens += 1
                    self._retire(new)
                continue
            cfg, mean = self.step_config(len(batch))
            draws = [draw_accept(r.rng, mean, cfg.cap) for r in batch]
            self._sleep(step_ms(cfg, sum(draws) / len(draws), len(batch)))
            with self.cv:
                for r, k in zip(batch, draws, strict=True):
                    k = min(k, r.remaining)
                    spec = self.cfg.algorithm != "NONE"
                    before = r.last_token
                    r.advance(k, verify=spec)
                    if before is not None and k > 0 and r.last_token is not None:
                        self.stats.itl.observe((r.last_token - before) / k, k)
                    self._win_tokens += k
                    if spec:
                        self.cum_accept += k
                        self.cum_verify += 1
                        self._win_accept += k
                        self._win_verify += 1
                self._win_steps += 1
                self._retire(batch)
                if self._win_steps >= self.LOG_INTERVAL or not self.reqs:
                    self._close_window(len(batch))

    def step_config(self, running: int) -> tuple[SpecConfig, float]:
        """The step's config and mean accept length: with a budget schedule, the budget of the last entry with
        min_batch <= running, its acceptance the model's at that budget (scaled as an override or collapse
        scales the configured budget's)."""
        if self.schedule is None:
            return self.cfg, self.accept_mean
        budget = next(b for m, b in reversed(self.schedule) if m <= running)
        self.step_budget = budget
        cfg = replace(self.cfg, budget=budget)
        mean = self.accept_mean * mean_accept(cfg) / mean_accept(self.cfg)
        return cfg, max(1.0, min(mean, float(cfg.cap)))

    def _retire(self, batch: list[Request]) -> None:
        for r in batch:
            if r.remaining <= 0:
                self.reqs.remove(r)
                self.cache.insert(r.prompt_ids + r.output_ids()[:-1])  # the last token has no KV yet
                r.finish()
                self.stats.finished(r)

    def _close_window(self, running: int) -> None:
        now = time.monotonic()
        elapsed = max(now - self._win_start, 1e-6)
        self.gen_throughput = self._win_tokens / elapsed
        if self._win_verify:
            self.spec_accept_length = self._win_accept / self._win_verify
        msg = (f"Decode batch. #running-req: {running}, #token: {self._win_tokens}, "
               f"gen throughput (token/s): {self.gen_throughput:.2f}, #queue-req: 0")
        if self.cfg.algorithm != "NONE":
            msg += f", accept len: {self.spec_accept_length:.2f}"
        if self.schedule is not None:
            msg += f", ddtree budget: {self.step_budget}"
        log(msg)
        self._win_tokens = self._win_accept = self._win_verify = self._win_steps = 0
        self._win_start = now

    def avg_spec_accept_length(self) -> float | None:
        with self.cv:
            if self.cfg.algorithm == "NONE" or self.cum_verify == 0:
                return None
            return self.cum_accept / self.cum_verify


# ---------------------------------------------------------------------------------------------------------
# HTTP server
# ---------------------------------------------------------------------------------------------------------


class BadRequest(Exception):
    pass


def env_float(name: str, default: float, lo: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"{name}={raw!r} is not a number (allowed: a number >= {lo})") from None
    if not math.isfinite(value) or value < lo:
        raise StartupError(f"{name}={raw!r} is out of range (allowed: a number >= {lo})")
    return value


def env_int(name: str, default: int | None, lo: int = 0) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"\d+", raw.strip()) or int(raw) < lo:
        raise StartupError(f"{name}={raw!r} is not allowed (allowed: an integer >= {lo})")
    return int(raw)


def env_flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise StartupError(f"{name}={raw!r} is not allowed (allowed: 1/0, true/false, yes/no, on/off)")


class Sim:
    """Server state shared by the handlers and the main thread."""

    def __init__(self, args: argparse.Namespace, version: str | None, features: set[str], hybrid: bool,
                 hybrid_source: str, crash_after: int | None, accept_override: float | None,
                 engine: Engine, collapse: tuple[int, float] | None = None):
        self.args = args
        self.collapse = collapse  # (after N completed requests, the mean accept length from then on)
        self.http_responses: dict[tuple[str, str, str], int] = {}  # (endpoint, status_code, method) -> count
        self.version = version
        self.features = features
        self.hybrid = hybrid
        self.hybrid_source = hybrid_source
        self.crash_after = crash_after
        self.accept_override = accept_override
        self.engine = engine
        self.state = "loading"  # loading, ready, draining
        self.lock = threading.Lock()
        self.inflight = 0
        self.completed = 0
        self.created = int(time.time())

    def admit(self) -> str | None:
        with self.lock:
            if self.state != "ready":
                return self.state
            self.inflight += 1
            return None

    def release(self, completed: bool) -> None:
        crash = False
        with self.lock:
            self.inflight -= 1
            if completed:
                self.completed += 1
                crash = self.crash_after is not None and self.completed >= self.crash_after
                if self.collapse is not None and self.completed == self.collapse[0]:
                    self._collapse()
        if crash:
            log(f"ERROR: Scheduler hit an exception: simulated crash after {self.completed} completed "
                f"requests (SGLANG_SIM_CRASH_AFTER={self.crash_after}); exiting abruptly")
            os._exit(1)

    def _collapse(self) -> None:
        """The fault SGLANG_SIM_COLLAPSE_AFTER: acceptance falls for every later step, as when a drafter's
        state goes stale under live traffic; the server stays healthy and keeps answering."""
        assert self.collapse is not None
        after, mean = self.collapse
        with self.engine.cv:
            before = self.engine.accept_mean
            self.engine.accept_mean = min(mean, float(self.engine.cfg.cap))
        log(f"WARNING: simulated acceptance collapse after {after} completed requests "
            f"(SGLANG_SIM_COLLAPSE_AFTER={after}): mean accept length {before:.3f} -> {self.engine.accept_mean:.3f}")

    def server_info(self) -> dict:
        a = self.args
        info = {
            "model_path": a.model_path,
            "served_model_name": a.served_model_name,
            "host": a.host,
            "port": a.port,
            "tp_size": a.tp_size,
            "speculative_algorithm": None if a.speculative_algorithm == "NONE" else a.speculative_algorithm,
            "speculative_draft_model_path": a.speculative_draft_model_path,
            "speculative_dflash_block_size": a.speculative_dflash_block_size,
            "speculative_ddtree_budget": a.speculative_ddtree_budget,
            "speculative_ddtree_topk_cap": a.speculative_ddtree_topk_cap,
            "attention_backend": a.attention_backend,
            "mem_fraction_static": a.mem_fraction_static,
            "context_length": a.context_length or DEFAULT_CONTEXT_LEN,
            "trust_remote_code": a.trust_remote_code,
            "enable_metrics": a.enable_metrics,
            "version": self.version or "unknown",
            "simulator": {
                "name": "sglang_sim (test equipment)",
                "features": sorted(self.features),
                "hybrid_model": self.hybrid,
                "hybrid_source": self.hybrid_source,
                "state_forking": self.engine.cfg.fork,
                "fused_topk": self.engine.cfg.fused_topk,
                "model_mean_accept_length": round(self.engine.accept_mean, 4),
                "divergence_rate": round(leak_rate(self.engine.cfg), 4),
                "accept_override": self.accept_override,
            },
        }
        state: dict = {"last_gen_throughput": round(self.engine.gen_throughput, 3)}
        avg = self.engine.avg_spec_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = round(avg, 4)
        info["internal_states"] = [state]
        return info

    def metrics(self) -> str:
        """SGLang 0.5.23's exposition for what the project reads: the scheduler's gauges (labelled
        model_name, engine_type, tp_rank, pp_rank, moe_ep_rank) and the tokenizer's counters and
        histograms (model_name, engine_type; and is_streaming where 0.5.23 has it), counted when a request
        finishes, as ``TokenizerMetricsCollector.observe_one_finished_request`` counts them."""
        e = self.engine
        name = self.args.served_model_name.replace("\\", "\\\\").replace('"', '\\"')
        tok = f'model_name="{name}",engine_type="unified"'
        sched = tok + ',moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        out: list[str] = []

        def family(metric: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            # prometheus_client's text format: a counter's HELP/TYPE name carries "_total" like its sample
            # (SGLang runs it in multiprocess mode, which exposes no "_created" samples)
            out.append(f"# HELP {metric} {help_text}")
            out.append(f"# TYPE {metric} {kind}")
            out.extend(f"{metric}{{{labels}}} {float(value)}" for labels, value in samples)

        with e.cv:
            st = e.stats
            family("sglang:num_running_reqs", "gauge", "The number of running requests.", [(sched, len(e.reqs))])
            family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [(sched, 0)])
            family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                   [(sched, e.gen_throughput)])
            if self.args.speculative_algorithm != "NONE":
                family("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative "
                       "decoding.", [(sched, e.spec_accept_length)])
            family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                   [(f'{tok},is_streaming="{k}"', v) for k, v in st.prompt_tokens.items()])
            family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                   [(f'{tok},is_streaming="{k}"', v) for k, v in st.generation_tokens.items()])
            family("sglang:spec_verify_calls_total", "counter",
                   "Number of speculative decoding verification calls.", [(tok, st.spec_verify_calls)])
            family("sglang:num_requests_total", "counter", "Number of requests processed.",
                   [(f'{tok},is_streaming="{k}"', v) for k, v in st.requests.items()])
            family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.",
                   [(tok, st.aborted)])
            for metric, help_text, hists in (
                    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                     st.ttft),
                    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                     st.e2e)):
                out.append(f"# HELP {metric} {help_text}")
                out.append(f"# TYPE {metric} histogram")
                for k, h in hists.items():
                    out.extend(h.lines(metric, f'{tok},is_streaming="{k}"'))
            family("sglang:http_responses_total", "counter",
                   "Total number of HTTP responses by endpoint and status code",
                   [(f'endpoint="{ep}",method="{m}",status_code="{code}"', n)
                    for (ep, code, m), n in sorted(self.http_responses.items())])
            out.append("# HELP sglang:inter_token_latency_seconds Histogram of inter-token latency in seconds.")
            out.append("# TYPE sglang:inter_token_latency_seconds histogram")
            out.extend(st.itl.lines("sglang:inter_token_latency_seconds", tok))
        return "\n".join(out) + "\n"

def _number(body: dict, key: str, default, kind, lo, hi=None):
    value = body.get(key, default)
    if value is None:
        value = default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or value < lo or (hi is not None and value > hi):
        allowed = f"{'an integer' if kind is int else 'a number'} >= {lo}" + (f" and <= {hi}" if hi else "")
        raise BadRequest(f"{key}={value!r} is not allowed (allowed: {allowed})")
    return kind(value)


class Handler(BaseHTTPRequestHandler):
    server_version = "sglang_sim/" + BASE_VERSION
    timeout = 60  # seconds a connection may sit idle: bounds the exit's wait for handler threads
    sim: Sim  # set on the class by make_handler

    def log_message(self, format, *args):  # noqa: A002 - BaseHTTPRequestHandler's signature
        log(f'{self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {args[1]}'
            if len(args) >= 2 else format % args)

    def send_response(self, code, message=None):
        # SGLang 0.5.23's HTTP metrics (with --enable-metrics): every response by endpoint, status and method
        path = self.path.split("?", 1)[0]
        with self.sim.engine.cv:
            key = (path, str(code), self.command or "")
            self.sim.http_responses[key] = self.sim.http_responses.get(key, 0) + 1
        super().send_response(code, message)

    # -- helpers --------------------------------------------------------------------------------------
    def _send(self, code: int, payload, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str) -> None:
        self._send(code, {"error": {"message": message, "code": code}, "object": "error", "message": message})

    def _unavailable(self, state: str) -> None:
        why = {"loading": "the server is still loading the model",
               "draining": "the server is shutting down and not admitting new requests"}[state]
        self._error(503, why)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _sse(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _authorized(self, path: str) -> bool:
        """SGLang's API key check: 401 without the right Bearer, except on /health* and /metrics."""
        key = getattr(self.sim.args, "api_key", None)
        if not key or path.startswith("/health") or path == "/metrics":
            return True
        if hmac.compare_digest(self.headers.get("Authorization", "").encode(), f"Bearer {key}".encode()):
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    # -- routing --------------------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        sim = self.sim
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return
        if path == "/health":
            if sim.state == "ready":
                self._send(200, b"", "text/plain")
            else:
                self._unavailable(sim.state)
        elif path == "/health_generate":
            self._health_generate()
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, sim.server_info())
        elif path in ("/get_model_info", "/model_info"):
            self._send(200, {"model_path": sim.args.model_path, "tokenizer_path": sim.args.model_path,
                             "is_generation": True, "served_model_name": sim.args.served_model_name})
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": sim.args.served_model_name, "object": "model", "created": sim.created,
                "owned_by": "sglang", "root": sim.args.model_path,
                "max_model_len": sim.args.context_length or DEFAULT_CONTEXT_LEN}]})
        elif path == "/metrics":
            if not sim.args.enable_metrics:
                self._error(404, "metrics are disabled: start the server with --enable-metrics")
            else:
                self._send(200, sim.metrics(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no such endpoint: GET {path}")

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return
        routes = {"/generate": self._generate, "/v1/completions": self._completions,
                  "/v1/chat/completions": self._chat}
        handler = routes.get(path)
        if handler is None:
            self._error(404, f"no such endpoint: POST {path}")
            return
        try:
            body = self._body()
        except BadRequest as exc:
            self._error(400, str(exc))
            return
        state = self.sim.admit()
        if state is not None:
            self._unavailable(state)
            return
        completed = False
        try:
            handler(body)
            completed = True
        except BadRequest as exc:
            self._error(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            log(f"WARNING: client went away during POST {path}")
            with self.sim.engine.cv:
                self.sim.engine.stats.aborted += 1
        finally:
            self.sim.release(completed)

    # -- endpoints ------------------------------------------------------------------------------------
    def _health_generate(self) -> None:
        state = self.sim.admit()
        if state is not None:
            self._unavailable(state)
            return
        try:
            req = self.sim.engine.new_request("health", 1, True, False)
            self.sim.engine.submit(req)
            req.done.wait()
            self._send(200, b"", "text/plain")
        finally:
            self.sim.release(False)

    def _run(self, prompts: list, max_new: int, greedy: bool, stream: bool,
             logprob_start_len: int | None = None) -> list[Request]:
        reqs = [self.sim.engine.new_request(p, max_new, greedy, stream, logprob_start_len) for p in prompts]
        for r in reqs:
            self.sim.engine.submit(r)
        return reqs

    @staticmethod
    def _logprobs(r: Request, top_n: int, with_text: bool) -> dict:
        """SGLang 0.5.23's shape: per generated token [logprob, token_id, text|null], and per token a list
        of the top ``top_n`` such triples (only when top_logprobs_num > 0); the same for the input tokens from
        ``logprob_start_len`` (-1: the last prompt token only), the first of them without a log-probability
        (``[None, id, text]``, top list None), as SGLang pads it. The input side is the target's prefill."""
        def triple(token: int, lp: float | None) -> list:
            return [None if lp is None else round(lp, 6), token, token_text(token) if with_text else None]

        def top(st: TargetStep | None) -> list | None:
            return None if st is None else [triple(st.top1, st.lp1), triple(st.top2, st.lp2)][:top_n]

        start = r.logprob_start_len if r.logprob_start_len is not None and r.logprob_start_len >= 0 \
            else r.prompt_tokens - 1
        inputs = input_logprobs(r.prompt_ids, start)
        steps = r.steps[:r.generated]
        out: dict = {"input_token_logprobs": [triple(t, lp) for t, lp, _st in inputs],
                     "output_token_logprobs": [triple(t, lp) for t, lp, _st in steps],
                     "output_token_logprobs_length": len(steps)}
        if top_n > 0:
            out["input_top_logprobs"] = [top(st) for _t, _lp, st in inputs]
            out["output_top_logprobs"] = [top(st) for _t, _lp, st in steps]
        return out

    def _meta(self, r: Request) -> dict:
        end = r.end if r.end is not None else time.monotonic()
        meta = {"id": r.id, "prompt_tokens": r.prompt_tokens, "completion_tokens": r.generated,
                "cached_tokens": r.cached_tokens, "e2e_latency": round(end - r.start, 6)}
        if r.done.is_set():
            meta["finish_reason"] = {"type": "length", "length": r.max_new}
        else:
            meta["finish_reason"] = None
        if self.sim.args.speculative_algorithm != "NONE":
            meta["spec_verify_ct"] = r.verify_ct
            if r.verify_ct:
                meta["spec_accept_length"] = round(r.generated / r.verify_ct, 6)
        return meta

    @staticmethod
    def _sampling(body: dict, max_key: str, max_default: int, temp_default: float) -> tuple[int, bool]:
        max_new = _number(body, max_key, max_default, int, 0, DEFAULT_CONTEXT_LEN)
        temperature = _number(body, "temperature", temp_default, float, 0.0, 2.0)
        return max_new, temperature == 0.0

    @staticmethod
    def _prompts(body: dict) -> tuple[list, bool]:
        """The prompts of a /generate body (``text`` or ``input_ids``, one of them) and whether it is one."""
        text, ids = body.get("text"), body.get("input_ids")
        if text is not None and ids is not None:
            raise BadRequest("give either text or input_ids, not both")
        if ids is None:
            if isinstance(text, str):
                return [text], True
            if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
                return text, False
            raise BadRequest("text must be a string or a non-empty list of strings")

        def ok(x) -> bool:
            return (isinstance(x, list) and bool(x)
                    and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < VOCAB_SIZE for t in x))

        if ok(ids):
            return [ids], True
        if isinstance(ids, list) and ids and all(ok(x) for x in ids):
            return ids, False
        raise BadRequest(f"input_ids must be a non-empty list of token ids (integers from 0 to {VOCAB_SIZE - 1}) "
                         "or a non-empty list of such lists")

    def _generate(self, body: dict) -> None:
        prompts, single = self._prompts(body)
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params must be a JSON object")
        max_new, greedy = self._sampling(sp, "max_new_tokens", 128, 1.0)
        stream = bool(body.get("stream", False))
        return_logprob = body.get("return_logprob", False)
        if not isinstance(return_logprob, bool):
            raise BadRequest(f"return_logprob must be true or false, not {return_logprob!r}")
        top_n = _number(body, "top_logprobs_num", 0, int, 0, len(WORDS))
        with_text = bool(body.get("return_text_in_logprobs", False))
        start = _number(body, "logprob_start_len", -1, int, -1)
        for p in prompts:
            n = len(p) if isinstance(p, list) else prompt_tokens(p)
            if return_logprob and start >= n:
                raise BadRequest(f"logprob_start_len={start} is not allowed (allowed: -1, or less than the "
                                 f"{n} input tokens)")
        reqs = self._run(prompts, max_new, greedy, stream, start if return_logprob else None)
        if not stream:
            for r in reqs:
                r.done.wait()
            logprobs = (lambda r: self._logprobs(r, top_n, with_text)) if return_logprob else (lambda r: {})
            out = [{"text": r.text(), "output_ids": r.output_ids(),
                    "meta_info": {**self._meta(r), **logprobs(r)}} for r in reqs]
            self._send(200, out[0] if single else out)
            return
        self._sse_start()
        for i, r in enumerate(reqs):
            while (n := r.updates.get()) is not None:
                item = {"text": r.text(n), "meta_info": self._meta(r), "index": i}
                item["meta_info"]["completion_tokens"] = n
                self._sse(item)
            self._sse({"text": r.text(), "meta_info": self._meta(r), "index": i})
        self._sse("[DONE]")

    def _completions(self, body: dict) -> None:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = prompt
        else:
            raise BadRequest("prompt must be a string or a non-empty list of strings")
        max_new, greedy = self._sampling(body, "max_tokens", 16, 1.0)
        stream = bool(body.get("stream", False))
        model = self.sim.args.served_model_name
        cid = "cmpl-" + uuid.uuid4().hex
        reqs = self._run(prompts, max_new, greedy, stream)
        if not stream:
            for r in reqs:
                r.done.wait()
            self._send(200, {
                "id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": [{"index": i, "text": r.text(), "logprobs": None, "finish_reason": "length",
                             "matched_stop": None} for i, r in enumerate(reqs)],
                "usage": self._usage(reqs)})
            return
        self._sse_start()
        for i, r in enumerate(reqs):
            sent = 0
            while (n := r.updates.get()) is not None:
                chunk = r.text(n)[len(r.text(sent)):]
                self._sse({"id": cid, "object": "text_completion", "created": int(time.time()),
                           "model": model, "choices": [{"index": i, "text": chunk, "logprobs": None,
                                                        "finish_reason": None}]})
                sent = n
            self._sse({"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
                       "choices": [{"index": i, "text": "", "logprobs": None, "finish_reason": "length"}]})
        self._stream_usage(body, {"id": cid, "object": "text_completion", "created": int(time.time()),
                                  "model": model, "choices": []}, reqs)
        self._sse("[DONE]")

    def _chat(self, body: dict) -> None:
        messages = body.get("messages")
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)):
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        parts = []
        for m in messages:
            content = m.get("content", "")
            if isinstance(content, list):
                content = " ".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>")
        prompt = "\n".join(parts) + "\n<|im_start|>assistant\n"
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_new, greedy = self._sampling(body, key, 128, 1.0)
        stream = bool(body.get("stream", False))
        model = self.sim.args.served_model_name
        cid = "chatcmpl-" + uuid.uuid4().hex
        (r,) = self._run([prompt], max_new, greedy, stream)
        if not stream:
            r.done.wait()
            self._send(200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": r.text().lstrip()},
                             "logprobs": None, "finish_reason": "length", "matched_stop": None}],
                "usage": self._usage([r])})
            return
        self._sse_start()
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        self._sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]})
        sent = 0
        while (n := r.updates.get()) is not None:
            delta = r.text(n).lstrip()[len(r.text(sent).lstrip()):]
            self._sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}]})
            sent = n
        self._sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        self._stream_usage(body, {**base, "choices": []}, [r])
        self._sse("[DONE]")

    @staticmethod
    def _usage(reqs: list[Request]) -> dict:
        p = sum(r.prompt_tokens for r in reqs)
        c = sum(r.generated for r in reqs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _stream_usage(self, body: dict, base: dict, reqs: list[Request]) -> None:
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            self._sse({**base, "usage": self._usage(reqs)})


class Server(ThreadingHTTPServer):
    # Handler threads are joined by server_close() (block_on_close), so that the exit after a drain does
    # not tear a request that was accepted and is being answered (503 while draining): see close_listening.
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128
    allow_reuse_address = True  # SO_REUSEADDR: TIME_WAIT leftovers do not block a restart; a listener does

    def close_listening(self) -> None:
        """Stop accepting without tearing what was accepted: stop the accept loop, answer every connection
        already waiting in the listen backlog, close the listening socket, then wait for the handler threads
        (their sockets time out after the handler's ``timeout``). A connection that completes its handshake
        between the last accept and the close is reset by the kernel: a window of microseconds."""
        self.shutdown()
        while select.select([self.socket], [], [], 0)[0]:
            self._handle_request_noblock()
        self.server_close()


def make_server(host: str, port: int, sim_holder: type) -> Server:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise StartupError(f"cannot resolve --host {host!r}: {exc.strerror}") from None
    Server.address_family = infos[0][0]
    try:
        return Server((host, port), sim_holder)
    except OSError as exc:
        if exc.errno == 98 or "in use" in str(exc).lower():
            raise StartupError(f"port {host}:{port} is already in use") from None
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------------------------------------------------
# Main: bind, load (simulated), serve, drain on SIGTERM
# ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    version, features = release_features()
    args = parse_args(argv, version, features)
    if args.node_rank > 0:  # a rank above 0 serves no HTTP: it joins rank 0 and holds its GPUs
        return sim_nodes.follow(args, log)
    leader = None
    try:
        startup_s = env_float("SGLANG_SIM_STARTUP_S", 2.0)
        fail_start = env_flag("SGLANG_SIM_FAIL_START")
        never_healthy = env_flag("SGLANG_SIM_NEVER_HEALTHY")
        crash_after = env_int("SGLANG_SIM_CRASH_AFTER", None, lo=1)
        slowdown = env_float("SGLANG_SIM_SLOWDOWN", 1.0, lo=0.01)
        override_raw = os.environ.get("SGLANG_SIM_ACCEPT_OVERRIDE", "")
        accept_override = env_float("SGLANG_SIM_ACCEPT_OVERRIDE", 1.0, lo=1.0) if override_raw else None
        collapse_after = env_int("SGLANG_SIM_COLLAPSE_AFTER", None, lo=1)
        collapse_accept = env_float("SGLANG_SIM_COLLAPSE_ACCEPT", 1.2, lo=1.0)
        seed = env_int("SGLANG_SIM_SEED", 0)
        drain_timeout = env_float("SGLANG_SIM_DRAIN_TIMEOUT_S", 300.0)
        hybrid, hybrid_source = model_is_hybrid(args.model_path)
        server = make_server(args.host, args.port, Handler)
        if args.nnodes > 1:
            try:
                leader = sim_nodes.Leader(args, log)
            except OSError as exc:
                server.server_close()
                raise StartupError(str(exc)) from None
    except StartupError as exc:
        log(f"ERROR: {exc}")
        return 1

    fork, fused_topk = ddtree_switches(args, features)
    cfg = SpecConfig(
        algorithm=args.speculative_algorithm,
        block_size=args.speculative_dflash_block_size or 16,
        budget=args.speculative_ddtree_budget or 15,
        topk_cap=args.speculative_ddtree_topk_cap or DEFAULT_TOPK_CAP,
        hybrid=hybrid, fork=fork, fused_topk=fused_topk)
    accept = mean_accept(cfg)
    if accept_override is not None:
        accept = min(accept_override, float(cfg.cap))
    engine = Engine(cfg, accept, slowdown, seed, getattr(args, "speculative_ddtree_budget_schedule", None))
    collapse = None if collapse_after is None else (collapse_after, collapse_accept)
    sim = Sim(args, version, features, hybrid, hybrid_source, crash_after, accept_override, engine, collapse)
    Handler.sim = sim

    log("SGLang SIMULATOR (test equipment, no GPU, no model weights): sglang_sim.py")
    log(f"sglang version {version or 'unknown (not installed)'}; release features: "
        f"{', '.join(sorted(features)) or 'none (stock)'}")
    shown = {k: ("<redacted>" if k == "api_key" and v else v) for k, v in vars(args).items()}
    log("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")")
    log(f"model {args.model_path}: {'hybrid (recurrent GDN/Mamba layers)' if hybrid else 'pure attention'} "
        f"(from {hybrid_source}); state forking {'on' if cfg.fork else 'off'}; "
        f"fused top-k {'on' if cfg.fused_topk else 'off'}")
    if cfg.collapses:
        log(f"WARNING: DDTree budget {cfg.budget} > block size - 1 = {cfg.block_size - 1} on a hybrid model "
            "without state forking: sibling nodes share recurrent state")
    log(f"simulated acceptance: mean {accept:.3f} tokens/step (cap {cfg.cap})"
        + (f", overridden by SGLANG_SIM_ACCEPT_OVERRIDE={accept_override}" if accept_override else "")
        + f"; step {step_ms(cfg, accept) * slowdown:.1f} ms at batch 1")
    if engine.schedule is not None:
        log("DDTree budget schedule: " + ", ".join(f"{b} from {m} running" for m, b in engine.schedule)
            + " (each step's acceptance and step time at its budget)")

    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    log(f"Listening on http://{args.host}:{args.port} (health answers 503 until the model is loaded)")

    terms = []
    term_event = threading.Event()

    def on_signal(signum, _frame):
        terms.append(signum)
        if len(terms) > 1:
            log(f"Received {signal.Signals(signum).name} again; exiting now without waiting")
            sys.stderr.flush()
            os._exit(0)
        term_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if leader is not None and not leader.wait_joined(term_event):
        log("Received SIGTERM while waiting for the other ranks; exiting")
        leader.close()
        return 0
    log(f"Load weight begin. (simulated load: {startup_s:g} s)")
    if term_event.wait(startup_s):
        log("Received SIGTERM during model load; exiting")
        return 0
    if fail_start:
        log("ERROR: Capture cuda graph failed: RuntimeError: CUDA error: an illegal memory access was "
            "encountered (simulated by SGLANG_SIM_FAIL_START=1)")
        log("ERROR: Scheduler exited during initialization; exiting with status 1")
        return 1
    if never_healthy:
        log("Load weight end. Capturing CUDA graphs... (SGLANG_SIM_NEVER_HEALTHY=1: stays loading forever)")
    else:
        log("Load weight end. Capture cuda graph end.")
        with sim.lock:
            sim.state = "ready"
        log("The server is fired up and ready to roll!")

    while not term_event.wait(0.5):
        pass
    name = signal.Signals(terms[0]).name
    with sim.lock:
        sim.state = "draining"
        inflight = sim.inflight
    log(f"Received {name}: no new requests admitted; waiting for {inflight} in-flight request(s) to finish")
    deadline = time.monotonic() + drain_timeout
    while True:
        with sim.lock:
            inflight = sim.inflight
        if inflight == 0:
            break
        if time.monotonic() > deadline:
            log(f"WARNING: drain timeout ({drain_timeout:g} s) with {inflight} request(s) in flight; exiting")
            if leader is not None:
                leader.close()
            return 0
        time.sleep(0.05)
    log("All in-flight requests finished. Gracefully exiting.")
    server.close_listening()
    if leader is not None:
        leader.close()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
