"""TEST EQUIPMENT: a DFlash drafter written in plain torch, trained here and saved in SGLang 0.5.23's
``DFlashDraftModel`` format (tests/gpu/learned/README.md).

The drafter computes what ``sglang/srt/models/dflash.py`` and ``DFlashWorkerV2`` compute at serving time, so
that what it learns here is what the server drafts with:

- context: the output of each target layer of ``target_layer_ids`` (SGLang's Qwen3.5 text model captures
  before layer i + 1: HF ``output_hidden_states[i + 1]``; ids below layers - 1), concatenated, then ``fc`` and
  ``hidden_norm``;
  each draft layer turns it into keys and values with its own ``k_proj`` / ``v_proj`` (no input norm),
  ``k_norm`` and RoPE at the context positions (``kv_proj_only``, ``apply_k_norm``, ``apply_k_rope``);
- the block: the target's embedding of ``[x_t, MASK x (block - 1)]`` at positions ``t .. t + block - 1``,
  pre-norm Qwen3-style layers whose queries see every context position before ``t`` and every position of
  their own block (bidirectional, no attention across blocks), then ``norm``; the target's LM head turns
  block position ``k`` into the draft of token ``t + k`` (``draft_hidden[:, 1:]``).

Training follows the DFlash objective (SpecForge's ``OnlineDFlashModel`` is the public reference; this is
our own code): random anchors inside the region the loss covers, one block per anchor, cross-entropy on
block positions 1 .. block - 1 weighted by ``exp(-(k - 1) / gamma)``.

Only torch is needed (the CPU tests run every piece at toy size).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BLOCK_SIZE = 16
LOSS_GAMMA = 7.0  # the DFlash paper's decay for block 16


@dataclass(frozen=True)
class DrafterShape:
    hidden: int
    vocab: int
    target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    mask_token: str = "<|mask|>"
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1536
    block_size: int = BLOCK_SIZE
    rope_theta: float = 10_000_000.0
    rms_eps: float = 1e-6
    max_positions: int = 4096
    eos_token_id: int = 0
    extra: dict = field(default_factory=dict)


# --- the pieces the CPU tests check against hand-computed examples -------------------------------------------------

def loss_weights(block_size: int = BLOCK_SIZE, gamma: float = LOSS_GAMMA) -> torch.Tensor:
    """Per block position: 0 for the anchor (it is the known token), ``exp(-(k - 1) / gamma)`` for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1).clamp(min=0) / gamma)
    w[0] = 0.0
    return w


def block_attention_mask(anchors: torch.Tensor, seq_len: int, block_size: int = BLOCK_SIZE) -> torch.Tensor:
    """Which keys each block query may see: ``[batch, n * block, seq_len + n * block]`` booleans (True: may).

    Keys are the ``seq_len`` context positions followed by the ``n`` blocks. A query of block ``j`` sees the
    context positions strictly before its anchor (the target's features of the anchor token itself do not exist
    yet when the server drafts) and every position of block ``j``, and nothing of the other blocks."""
    b, n = anchors.shape
    q = torch.arange(n * block_size, device=anchors.device)
    q_block = q // block_size
    kv = torch.arange(seq_len + n * block_size, device=anchors.device)
    anchor_q = anchors[:, q_block]  # [b, Q]
    ctx = (kv[None, None, :] < seq_len) & (kv[None, None, :] < anchor_q[:, :, None])
    own = (kv[None, :] >= seq_len) & ((kv[None, :] - seq_len).div(block_size, rounding_mode="floor") == q_block[:, None])
    return ctx | own[None]


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, mask_token_id: int,
                 block_size: int = BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, positions, labels) of the blocks, each ``[batch, n * block]``: the anchor's token then the mask
    token; positions ``anchor + k``; labels ``tokens[anchor + k]`` (-100 past the end)."""
    b, s = tokens.shape
    k = torch.arange(block_size, device=tokens.device)
    pos = anchors[:, :, None] + k  # [b, n, B]
    ids = torch.full_like(pos, mask_token_id)
    ids[:, :, 0] = tokens.gather(1, anchors)
    labels = tokens.gather(1, pos.clamp(max=s - 1).reshape(b, -1)).reshape(pos.shape)
    labels = labels.masked_fill(pos >= s, -100)
    return ids.reshape(b, -1), pos.reshape(b, -1), labels.reshape(b, -1)


def sample_anchors(batch: int, n: int, low: int, high: int, generator: torch.Generator,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """``n`` distinct anchors per row from ``low .. high`` inclusive, sorted."""
    span = high - low + 1
    if n > span:
        raise ValueError(f"{n} anchors from {span} positions")
    r = torch.rand(batch, span, generator=generator).argsort(dim=1)[:, :n] + low
    return r.sort(dim=1).values.to(device)


# --- the model --------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX-style rotary embedding over the whole head: x ``[b, t, h, d]``, pos ``[b, t]`` or ``[t]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[..., None] * inv  # [.., t, d/2]
    if ang.dim() == 2:
        ang = ang[None]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        h, hd = s.hidden, s.head_dim
        self.input_layernorm = RMSNorm(h, s.rms_eps)
        self.q_proj = nn.Linear(h, s.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, s.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(s.heads * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, s.rms_eps)
        self.k_norm = RMSNorm(hd, s.rms_eps)
        self.post_attention_layernorm = RMSNorm(h, s.rms_eps)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)

    def forward(self, hidden, residual, ctx, ctx_pos, block_pos, mask):
        s = self.s
        residual = hidden if residual is None else hidden + residual
        x = self.input_layernorm(residual)
        b, q_len, _ = x.shape
        c_len = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, q_len, s.heads, s.head_dim))
        kb = self.k_norm(self.k_proj(x).view(b, q_len, s.kv_heads, s.head_dim))
        vb = self.v_proj(x).view(b, q_len, s.kv_heads, s.head_dim)
        kc = self.k_norm(self.k_proj(ctx).view(b, c_len, s.kv_heads, s.head_dim))
        vc = self.v_proj(ctx).view(b, c_len, s.kv_heads, s.head_dim)
        q = rope(q, block_pos, s.rope_theta)
        kb = rope(kb, block_pos, s.rope_theta)
        kc = rope(kc, ctx_pos, s.rope_theta)
        k = torch.cat([kc, kb], dim=1).transpose(1, 2)
        v = torch.cat([vc, vb], dim=1).transpose(1, 2)
        rep = s.heads // s.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None],
                                             scale=s.head_dim ** -0.5)
        att = self.o_proj(att.transpose(1, 2).reshape(b, q_len, s.heads * s.head_dim))
        residual = att + residual
        x = self.post_attention_layernorm(residual)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)), residual


class Drafter(nn.Module):
    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        self.fc = nn.Linear(len(s.target_layer_ids) * s.hidden, s.hidden, bias=False)
        self.hidden_norm = RMSNorm(s.hidden, s.rms_eps)
        self.layers = nn.ModuleList(DraftLayer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.rms_eps)

    def forward(self, features: torch.Tensor, block_embeds: torch.Tensor, block_pos: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """features ``[b, S, len(ids) * hidden]`` (context positions 0 .. S - 1), block_embeds ``[b, Q, hidden]``."""
        ctx = self.hidden_norm(self.fc(features))
        ctx_pos = torch.arange(features.shape[1], device=features.device)
        hidden, residual = block_embeds, None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, ctx, ctx_pos, block_pos, mask)
        return self.norm(hidden + residual)


def block_logits(drafter: Drafter, embed: nn.Module, lm_head: nn.Module, features: torch.Tensor,
                 tokens: torch.Tensor, anchors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits ``[b, n * block, vocab]``, labels ``[b, n * block]``) of one block per anchor."""
    s = drafter.s
    ids, pos, labels = block_inputs(tokens, anchors, s.mask_token_id, s.block_size)
    mask = block_attention_mask(anchors, features.shape[1], s.block_size)
    hidden = drafter(features, embed(ids), pos, mask)
    return lm_head(hidden), labels


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, block_size: int = BLOCK_SIZE,
                gamma: float = LOSS_GAMMA) -> tuple[torch.Tensor, torch.Tensor]:
    """(weighted cross-entropy, top-1 accuracy on positions 1 .. block - 1)."""
    b, q, v = logits.shape
    w = loss_weights(block_size, gamma).to(logits.device).repeat(q // block_size)[None].expand(b, -1)
    valid = labels >= 0
    w = w * valid
    ce = F.cross_entropy(logits.float().reshape(-1, v), labels.clamp(min=0).reshape(-1), reduction="none").view(b, q)
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    scored = (w > 0)
    acc = ((logits.argmax(-1) == labels) & scored).sum().float() / scored.sum().clamp(min=1)
    return loss, acc


def chain_accept_lengths(draft: torch.Tensor, target: torch.Tensor) -> list[int]:
    """Accept lengths of a linear DFlash walk over one sequence, as the server counts them (accepted drafts + 1).

    ``draft[t]`` is the drafter's argmax block when anchored at ``t`` (``draft[t][k]`` for ``k >= 1`` drafts
    ``target[t + k]``); ``target`` is the target's own greedy sequence. From anchor ``t`` the step accepts the
    leading drafts that equal the target, plus the target's next token, and the next step anchors there."""
    out, t, n = [], 0, target.shape[0]
    block = draft.shape[1]
    while t < draft.shape[0] and t + 1 < n:
        k = 0
        while k + 1 < block and t + k + 1 < n and int(draft[t, k + 1]) == int(target[t + k + 1]):
            k += 1
        out.append(k + 1)
        t += k + 1
    return out


# --- SGLang's format ----------------------------------------------------------------------------------------------

def sglang_config(s: DrafterShape) -> dict:
    """config.json of SGLang 0.5.23's ``DFlashDraftModel`` (the keys ``parse_dflash_draft_config`` reads)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": s.hidden, "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim,
        "hidden_act": "silu", "rms_norm_eps": s.rms_eps, "rope_theta": s.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta},
        "max_position_embeddings": s.max_positions, "vocab_size": s.vocab, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16", "dtype": "bfloat16",
        # Every layer full, bidirectional attention (ENCODER_ONLY in SGLang): what the training mask does.
        "layer_types": ["full_attention"] * s.layers, "is_causal": False, "use_sliding_window": False,
        "block_size": s.block_size, "num_target_layers": s.target_layers,
        "dflash_config": {"target_layer_ids": list(s.target_layer_ids), "mask_token_id": s.mask_token_id,
                          "mask_token": s.mask_token, "block_size": s.block_size},
        "bos_token_id": s.eos_token_id, "eos_token_id": s.eos_token_id,
        "sgdeploy_test_equipment": {"what": "trained by tests/gpu/learned/train_pair.py", **s.extra},
    }


def state_dict_for_sglang(drafter: Drafter) -> dict[str, torch.Tensor]:
    """The weights under the names ``DFlashDraftModel.load_weights`` maps (q/k/v and gate/up are stacked there)."""
    out = {"fc.weight": drafter.fc.weight, "hidden_norm.weight": drafter.hidden_norm.weight,
           "norm.weight": drafter.norm.weight}
    for i, layer in enumerate(drafter.layers):
        p = f"layers.{i}."
        out.update({
            p + "input_layernorm.weight": layer.input_layernorm.weight,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
            p + "self_attn.q_proj.weight": layer.q_proj.weight, p + "self_attn.k_proj.weight": layer.k_proj.weight,
            p + "self_attn.v_proj.weight": layer.v_proj.weight, p + "self_attn.o_proj.weight": layer.o_proj.weight,
            p + "self_attn.q_norm.weight": layer.q_norm.weight, p + "self_attn.k_norm.weight": layer.k_norm.weight,
            p + "mlp.gate_proj.weight": layer.gate_proj.weight, p + "mlp.up_proj.weight": layer.up_proj.weight,
            p + "mlp.down_proj.weight": layer.down_proj.weight,
        })
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def save_drafter(drafter: Drafter, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(state_dict_for_sglang(drafter), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(sglang_config(drafter.s), indent=2) + "\n")


def shape_dict(s: DrafterShape) -> dict:
    return asdict(s)


def params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
