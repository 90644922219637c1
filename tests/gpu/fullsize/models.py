"""TEST EQUIPMENT: a Qwen3.6-27B-shaped target and a DFlash drafter of the published drafters' shape, as
config files only (the servers load them with ``--load-format dummy``: random weights, nothing downloaded),
plus a word-level tokenizer of the full vocabulary (no hub; the servers run with ``--skip-tokenizer-init``).

    python tests/gpu/fullsize/models.py OUTDIR          (OUTDIR/target, OUTDIR/drafter; pure Python)

Where each number comes from:

- hidden 5120, 64 layers, MLP 17 408, 24 query heads / 4 KV heads of dim 256 (gated attention output),
  vocabulary 248 320, RoPE theta 1e7 on a quarter of each head (partial rotary 0.25), RMSNorm eps 1e-6,
  untied embeddings: Qwen3.5-27B's model arguments in THUDM/slime ``scripts/models/qwen3.5-27B.sh``
  (``--num-layers 64 --hidden-size 5120 --ffn-hidden-size 17408 --num-attention-heads 24
  --num-query-groups 4 --kv-channels 256 --vocab-size 248320 --rotary-percent 0.25 --rotary-base 10000000
  --untie-embeddings-and-output-weights``).
- layer pattern 16 x (3 Gated DeltaNet + 1 full attention) = ``full_attention_interval`` 4, GDN heads 16
  query-key / 48 value of dim 128, conv kernel 4, float32 SSM state: ``sgdeploy/budget.py``
  (``QWEN3_5_27B`` / ``QWEN3_6_27B``: the Qwen3.6-27B model card and the Qwen3.5-27B config; the same
  ``qwen3_5`` architecture). The issue names hidden 5120 and vocabulary 248 320 for Qwen3.6-27B.
- architecture ``Qwen3_5ForCausalLM`` / ``model_type qwen3_5_text`` (the text model of the checkpoint's
  ``Qwen3_5ForConditionalGeneration``; the vision tower does not take part in a decode step), the keys as
  the tiny harness's transformers-made config has them (tests/gpu/e2e/tiny_models.py).
- drafter: z-lab's published DFlash drafters (``z-lab/Qwen3-8B-DFlash-b16`` and the other ``-b16``
  ones, z-lab/dflash README) are ``DFlashDraftModel`` / ``model_type qwen3`` with 5 layers at the target's
  hidden size and MLP size, block size 16, context features from 5 target layers chosen by SGLang's
  ``build_target_layer_ids(num_target_layers, 5)`` (``srt/speculative/dflash_utils.py``: 1 .. L - 3
  evenly), and no embedding or head of their own (they use the target's). Attention 32 query / 8 KV
  heads of dim 128 as in those drafters. UNCONFIRMED for Qwen3.6-27B: its drafter's config.json is not in
  the sources searched; the mask token id 248 077 is the one seen with a Qwen3.5-family DFlash config.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB = 248_320
HIDDEN = 5120
LAYERS = 64
FULL_ATTENTION_INTERVAL = 4
INTERMEDIATE = 17_408
HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256
GDN_KEY_HEADS, GDN_VALUE_HEADS, GDN_HEAD_DIM, CONV_KERNEL = 16, 48, 128, 4
ROPE_THETA = 10_000_000.0
BLOCK_SIZE = 16
DRAFT_LAYERS = 5
DRAFT_HEADS, DRAFT_KV_HEADS, DRAFT_HEAD_DIM = 32, 8, 128
MASK_TOKEN_ID = 248_077
EOS = 248_044  # any id inside the vocabulary; the runs use ignore_eos


def layer_types(layers: int = LAYERS, interval: int = FULL_ATTENTION_INTERVAL) -> list[str]:
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def target_layer_ids(num_target_layers: int = LAYERS, num_draft_layers: int = DRAFT_LAYERS) -> list[int]:
    """SGLang 0.5.23's ``dflash_utils.build_target_layer_ids`` (the default when a config names none)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def target_config() -> dict:
    return {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": EOS, "eos_token_id": EOS,
        "pad_token_id": EOS, "dtype": "bfloat16", "torch_dtype": "bfloat16", "hidden_act": "silu",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "layer_types": layer_types(), "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "linear_conv_kernel_dim": CONV_KERNEL, "linear_key_head_dim": GDN_HEAD_DIM,
        "linear_value_head_dim": GDN_HEAD_DIM, "linear_num_key_heads": GDN_KEY_HEADS,
        "linear_num_value_heads": GDN_VALUE_HEADS, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262_144, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.25},
        "rope_theta": ROPE_THETA, "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB,
    }


def drafter_config() -> dict:
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": DRAFT_HEADS, "num_key_value_heads": DRAFT_KV_HEADS, "head_dim": DRAFT_HEAD_DIM,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": ROPE_THETA, "max_position_embeddings": 262_144,
        "vocab_size": VOCAB, "tie_word_embeddings": False, "attention_bias": False,
        "dtype": "bfloat16", "torch_dtype": "bfloat16", "block_size": BLOCK_SIZE, "num_target_layers": LAYERS,
        "dflash_config": {"target_layer_ids": target_layer_ids(), "mask_token_id": MASK_TOKEN_ID},
        "bos_token_id": EOS, "eos_token_id": EOS,
    }


def parameter_counts() -> dict[str, int]:
    """bf16 parameters of each model (what ``--load-format dummy`` allocates), from the shapes above."""
    h, i = HIDDEN, INTERMEDIATE
    mlp = 3 * h * i
    attn = h * (HEADS * HEAD_DIM * 2) + 2 * h * KV_HEADS * HEAD_DIM + HEADS * HEAD_DIM * h  # q (+gate), k, v, o
    kd, vd = GDN_KEY_HEADS * GDN_HEAD_DIM, GDN_VALUE_HEADS * GDN_HEAD_DIM
    conv_dim = 2 * kd + vd
    gdn = h * (conv_dim + vd) + h * 2 * GDN_VALUE_HEADS + conv_dim * CONV_KERNEL + vd * h  # qkvz, ba, conv, out
    full = LAYERS // FULL_ATTENTION_INTERVAL
    target = 2 * VOCAB * h + full * attn + (LAYERS - full) * gdn + LAYERS * mlp
    d_attn = h * DRAFT_HEADS * DRAFT_HEAD_DIM * 2 + 2 * h * DRAFT_KV_HEADS * DRAFT_HEAD_DIM
    drafter = DRAFT_LAYERS * (d_attn + mlp) + DRAFT_LAYERS * h * h  # + fc over the 5 context features
    return {"target": target, "drafter": drafter}


def write_tokenizer(out: Path) -> bool:
    """A word-level tokenizer of VOCAB tokens (``w0`` .. ``w248319``), if ``tokenizers`` is installed (the GPU
    image has it). The servers skip it (``--skip-tokenizer-init``); it is there for tools that look."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        return False
    words = {f"w{i}": i for i in range(VOCAB)}
    raw = Tokenizer(models.WordLevel(vocab=words, unk_token="w1"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"w{EOS}", "pad_token": f"w{EOS}",
        "bos_token": f"w{EOS}", "model_max_length": 262_144}, indent=1) + "\n")
    return True


def make(out: Path) -> dict:
    for name, cfg in (("target", target_config()), ("drafter", drafter_config())):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok = write_tokenizer(out / "target")
    return {"out": str(out), "tokenizer": tok, **{f"{k}_params": v for k, v in parameter_counts().items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(json.dumps(make(args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
