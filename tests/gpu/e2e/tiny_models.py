"""TEST EQUIPMENT: a tiny hybrid target and a tiny DFlash drafter with random weights, made locally
(no hub), for the end-to-end server harness (tests/gpu/e2e/README.md).

    python tests/gpu/e2e/tiny_models.py OUTDIR [--vocab 16] [--seed 0] [--init 0.05]

OUTDIR/target : ``Qwen3_5ForCausalLM`` (``model_type qwen3_5_text``, transformers' own Qwen3.5 classes):
                4 layers = 3 Gated DeltaNet (linear attention) + 1 full attention, hidden 256, bf16,
                and a word-level tokenizer of ``vocab`` tokens (``<|endoftext|>`` = 0, ``w1`` .. ``wN``).
OUTDIR/drafter: ``DFlashDraftModel`` (SGLang's DFlash drafter), 1 layer, hidden 256, block 16, context
                features from target layers [0, 2], ``mask_token_id`` = vocab - 1 (inside the vocabulary).

Why a vocabulary of 16: with the top-k cap equal to it, depth 1 of every DDTree holds the target's own
next token, so every verify step accepts at least one draft token, and since the drafter is random the
accepted token is usually not the drafter's first choice: trees are accepted through non-first
siblings and, at budgets 32 and 64, two or more levels deep. Prompts are token ids (1 .. vocab - 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HIDDEN = 256
BLOCK_SIZE = 16
TARGET_LAYER_IDS = (0, 2)
ROPE_THETA = 10_000_000.0


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, vocab)}}
    # Unknown words (every word of a text prompt, e.g. the gates' smoke prompt) become the ordinary token w1,
    # not EOS: a prompt of EOS tokens makes the random target answer EOS only, an empty text.
    raw = Tokenizer(models.WordLevel(vocab=words, unk_token="w1"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>")
    if len(tok) != vocab:
        raise SystemExit(f"tokenizer has {len(tok)} tokens, expected {vocab}")
    return tok


def make_target(out: Path, vocab: int, seed: int, init: float) -> int:
    import torch
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(vocab)
    tok.save_pretrained(str(out))
    eos = 0
    cfg = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.25},
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, initializer_range=init,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    config = json.loads((out / "config.json").read_text())
    # SGLang's own Qwen3_5TextConfig derives the layer types from full_attention_interval and reads a
    # top-level rope_theta; real Qwen3.5 checkpoints carry both.
    config.update(architectures=["Qwen3_5ForCausalLM"], full_attention_interval=4, rope_theta=ROPE_THETA,
                  dtype="bfloat16", torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return sum(p.numel() for p in model.parameters())


def make_drafter(out: Path, vocab: int, seed: int, init: float) -> int:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed + 1)
    heads, kv_heads, head_dim, inter = 4, 2, 64, 512

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * init).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    p = "layers.0."
    weights = {
        p + "self_attn.q_proj.weight": rand(heads * head_dim, HIDDEN),
        p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, HIDDEN),
        p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, HIDDEN),
        p + "self_attn.o_proj.weight": rand(HIDDEN, heads * head_dim),
        p + "self_attn.q_norm.weight": ones(head_dim),
        p + "self_attn.k_norm.weight": ones(head_dim),
        p + "mlp.gate_proj.weight": rand(inter, HIDDEN),
        p + "mlp.up_proj.weight": rand(inter, HIDDEN),
        p + "mlp.down_proj.weight": rand(HIDDEN, inter),
        p + "input_layernorm.weight": ones(HIDDEN),
        p + "post_attention_layernorm.weight": ones(HIDDEN),
        "norm.weight": ones(HIDDEN),
        "hidden_norm.weight": ones(HIDDEN),
        "fc.weight": rand(HIDDEN, len(TARGET_LAYER_IDS) * HIDDEN),
    }
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": HIDDEN, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": ROPE_THETA,
        "max_position_embeddings": 4096, "vocab_size": vocab, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16", "dtype": "bfloat16",
        "block_size": BLOCK_SIZE, "num_target_layers": 4,
        "dflash_config": {"target_layer_ids": list(TARGET_LAYER_IDS), "mask_token_id": vocab - 1},
        "bos_token_id": 0, "eos_token_id": 0,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return sum(v.numel() for v in weights.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", type=float, default=0.05, help="std of the random weights")
    args = ap.parse_args(argv)
    if not 4 <= args.vocab <= 255:
        ap.error(f"--vocab {args.vocab}: give 4 to 255 (a word-level vocabulary)")
    n_target = make_target(args.out / "target", args.vocab, args.seed, args.init)
    n_drafter = make_drafter(args.out / "drafter", args.vocab, args.seed, args.init)
    print(json.dumps({"target_params": n_target, "drafter_params": n_drafter, "vocab": args.vocab,
                      "mask_token_id": args.vocab - 1, "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
