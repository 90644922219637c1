"""The learned test pair's recipe at toy size (tests/gpu/learned, issue 32): the DFlash block attention mask, the
loss weights, the block inputs and the accept-length walk against hand-computed examples; the drafter's files in
the format SGLang 0.5.23 loads (its own config parser, slow set, build/cpu-venv); the corpus split and prompts.

The fast tests need torch; they are skipped where the project's .venv has none (the GPU harness's packages are
not the deploy tool's) and run in the slow set's CPU virtualenv through ``test_recipe_in_cpu_venv``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LEARNED = REPO / "tests" / "gpu" / "learned"
sys.path.insert(0, str(LEARNED))
sys.path.insert(0, str(REPO / "tests" / "gpu" / "e2e"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "series"))  # test_patched_cli, torchvision_standin

import corpus  # noqa: E402
import e2e_stats  # noqa: E402
from test_patched_cli import cpu_python, downloads, site_dirs  # noqa: E402, F401  (build/cpu-venv, SGLang 0.5.23)

try:
    import dflash_train as dt
    import torch  # noqa: F811
except ImportError:  # the project's .venv: the torch tests run in the CPU virtualenv (slow set)
    if os.environ.get("SGDEPLOY_NEED_TORCH"):
        raise
    torch = dt = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed here (runs in build/cpu-venv)")


@needs_torch
def test_block_mask_matches_a_hand_computed_example():
    # 4 context positions, blocks of 2 at anchors 1 and 3: keys are ctx 0..3, block 0 (keys 4, 5), block 1 (6, 7).
    m = dt.block_attention_mask(torch.tensor([[1, 3]]), seq_len=4, block_size=2)[0].int().tolist()
    assert m == [
        # ctx < anchor | own block only
        [1, 0, 0, 0, 1, 1, 0, 0],  # block 0 (anchor 1), position 0: sees ctx 0, and block 0 both ways
        [1, 0, 0, 0, 1, 1, 0, 0],  # block 0, position 1
        [1, 1, 1, 0, 0, 0, 1, 1],  # block 1 (anchor 3): ctx 0..2, never ctx 3 (the anchor's own features)
        [1, 1, 1, 0, 0, 0, 1, 1],
    ]


@needs_torch
def test_loss_weights_are_zero_at_the_anchor_and_decay_after():
    w = dt.loss_weights(block_size=4, gamma=2.0).tolist()
    assert w[0] == 0.0
    for got, want in zip(w[1:], (1.0, math.exp(-0.5), math.exp(-1.0)), strict=True):
        assert abs(got - want) < 1e-7  # float32 of the exact values


@needs_torch
def test_block_inputs_put_the_anchor_token_first_then_the_mask_token():
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    ids, pos, labels = dt.block_inputs(tokens, torch.tensor([[1, 3]]), mask_token_id=99, block_size=3)
    assert ids.tolist() == [[11, 99, 99, 13, 99, 99]]
    assert pos.tolist() == [[1, 2, 3, 3, 4, 5]]
    assert labels.tolist() == [[11, 12, 13, 13, 14, -100]]  # past the end: ignored


@needs_torch
def test_loss_ignores_the_anchor_and_positions_past_the_end():
    labels = torch.tensor([[5, 6, -100]])
    logits = torch.full((1, 3, 8), -10.0)
    logits[0, 0, 0] = 10.0  # wrong at the anchor: not scored
    logits[0, 1, 6] = 10.0  # right at position 1
    loss, acc = dt.dflash_loss(logits, labels, block_size=3, gamma=7.0)
    assert acc.item() == 1.0 and loss.item() < 1e-6
    logits[0, 1, 6], logits[0, 1, 2] = -10.0, 10.0
    loss, acc = dt.dflash_loss(logits, labels, block_size=3, gamma=7.0)
    assert acc.item() == 0.0 and loss.item() > 10


@needs_torch
def test_the_accept_walk_counts_like_the_server():
    target = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    # anchored at 0: drafts 2, 3, 9 -> 2 accepted + the target's own = 3; next anchor 3: drafts 5, 6, 7 -> 3 + 1
    draft = torch.zeros(7, 4, dtype=torch.long)
    draft[0, 1:] = torch.tensor([2, 3, 9])
    draft[3, 1:] = torch.tensor([5, 6, 7])
    assert dt.chain_accept_lengths(draft, target) == [3, 4]


@needs_torch
def test_sampled_anchors_are_distinct_sorted_and_in_range():
    g = torch.Generator().manual_seed(0)
    a = dt.sample_anchors(5, 6, 3, 10, g)
    assert a.shape == (5, 6)
    for row in a.tolist():
        assert row == sorted(set(row)) and all(3 <= x <= 10 for x in row)
    with pytest.raises(ValueError):
        dt.sample_anchors(1, 9, 3, 10, g)


@needs_torch
def test_drafter_files_carry_the_names_and_keys_sglang_loads(tmp_path):
    s = dt.DrafterShape(hidden=32, vocab=64, target_layers=4, target_layer_ids=(1, 3), mask_token_id=1, layers=2,
                        heads=2, kv_heads=1, head_dim=16, intermediate=48)
    dt.save_drafter(dt.Drafter(s), tmp_path)
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    # the names the tiny random drafter (tests/gpu/e2e/tiny_models.py) uses, which SGLang loaded on the H200
    per_layer = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
                 "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                 "post_attention_layernorm"}
    want = {f"layers.{i}.{n}.weight" for i in range(2) for n in per_layer} | {"norm.weight", "hidden_norm.weight",
                                                                               "fc.weight"}
    assert names == want
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 16
    assert cfg["dflash_config"] == {"target_layer_ids": [1, 3], "mask_token_id": 1, "mask_token": "<|mask|>",
                                    "block_size": 16}
    assert cfg["is_causal"] is False and cfg["layer_types"] == ["full_attention"] * 2


def test_held_out_files_are_chosen_by_path_and_never_trained_on(tmp_path):
    for i in range(60):
        (tmp_path / f"m{i}.py").write_text(f'def f{i}(x):\n    """Return the value of the thing here."""\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("def test(): pass\n")
    train, held, facts = corpus.load([str(tmp_path)], max_chars=10**9)
    names = [rel for rel, _ in corpus.source_files([str(tmp_path)])]
    assert "tests/t.py" not in names
    assert facts["held_out_files"] == sum(corpus.held_out(n) for n in names) > 0
    assert set(train).isdisjoint(held) and len(train) + len(held) == 60


def test_prompts_come_in_two_kinds_of_the_same_length():
    held = ['x = 1\n\ndef alpha(a, b):\n    """Return the sum of both values here."""\n    return a + b\n'] * 3
    ps = corpus.prompts(held, lambda s: list(s.encode()), per_kind=2, tokens=12)
    assert [p["kind"] for p in ps] == ["code", "code", "prose", "prose"]
    assert all(len(p["ids"]) == 12 for p in ps)
    assert bytes(ps[0]["ids"]).decode().startswith("def alpha(")
    assert bytes(ps[2]["ids"]).decode().lstrip().startswith('"""Retur')
    with pytest.raises(ValueError, match="prose prompts"):
        corpus.prompts(["def f(x):\n    return x\n"], lambda s: list(s.encode()), per_kind=1, tokens=4)


def test_looping_finds_a_repeated_run():
    assert e2e_stats.looping([1, 2, 3, 4, 5, 6, 7, 8] * 3)
    assert not e2e_stats.looping(list(range(40)))
    assert not e2e_stats.looping([1, 2, 3, 4, 5, 6, 7, 8] * 2 + list(range(20, 40)))  # twice is not a loop


@pytest.mark.slow
def test_recipe_in_cpu_venv(cpu_python):  # noqa: F811
    """The torch tests above in build/cpu-venv, then SGLang 0.5.23's own parser on the saved drafter: block 16,
    the target layer ids, the mask token, full bidirectional (ENCODER_ONLY) attention, the RoPE base."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "unit" / "series"), str(REPO)]),
               SGDEPLOY_NEED_TORCH="1")
    if subprocess.run([str(cpu_python), "-c", "import pytest"], capture_output=True).returncode:
        import importlib.metadata

        pin = f"pytest=={importlib.metadata.version('pytest')}"
        subprocess.run([str(cpu_python), "-m", "pip", "install", "-q", "--disable-pip-version-check", pin], check=True)
    proc = subprocess.run([str(cpu_python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                           str(Path(__file__))], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-500:]


@pytest.mark.slow
def test_sglang_reads_the_drafter_config(cpu_python, site_dirs, tmp_path):  # noqa: F811
    code = f"""
import json, sys
sys.path.insert(0, {str(LEARNED)!r})
import torchvision_standin
torchvision_standin.install()
import dflash_train as dt
s = dt.DrafterShape(hidden=32, vocab=64, target_layers=8, target_layer_ids=(1, 4, 7), mask_token_id=1, layers=2,
                    heads=2, kv_heads=1, head_dim=16, intermediate=48)
dt.save_drafter(dt.Drafter(s), __import__("pathlib").Path({str(tmp_path)!r}))
from transformers import AutoConfig
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
from sglang.srt.models.dflash import _get_dflash_layer_attention_params
from sglang.srt.utils.hf_transformers.common import get_rope_config
cfg = AutoConfig.from_pretrained({str(tmp_path)!r})
d = parse_dflash_draft_config(draft_hf_config=cfg)
print(json.dumps({{"block": d.resolve_block_size(default=0),
                  "ids": d.resolve_target_layer_ids(target_num_layers=8, draft_num_layers=2),
                  "mask": [d.mask_token, d.mask_token_id],
                  "attn": [str(x) for x in _get_dflash_layer_attention_params(cfg, 1)],
                  "rope": get_rope_config(cfg)[0], "partial": getattr(cfg, "partial_rotary_factor", 1.0)}}))
"""
    sglang_tree = site_dirs["stock"][1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sglang_tree), str(REPO / "tests" / "unit" / "series")]))
    proc = subprocess.run([str(cpu_python), "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["block"] == 16 and got["ids"] == [1, 4, 7] and got["mask"] == ["<|mask|>", 1]
    assert got["attn"] == ["-1", "AttentionType.ENCODER_ONLY"]
    assert got["rope"] == 10_000_000.0 and got["partial"] == 1.0  # the drafter rotates whole heads, as trained
