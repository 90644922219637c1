"""DDTree budget memory rule: the largest draft-tree budget whose forking buffers fit.

With state forking (patch 0002), verifying a DDTree tree of ``budget`` draft nodes on a
hybrid target keeps, per recurrent layer and per request row, one intermediate SSM state
and one conv window for every verify position ``T = budget + 1`` (root + nodes):

    ssm   [L, R, T, HV, V, K]        at the SSM state dtype (float32 for Qwen3.5/3.6)
    conv  [L, R, T, conv_dim, W - 1] at the conv dtype (the model dtype, bf16)

``R = max_running_requests + 1`` (SGLang allocates one padding row), heads and conv
channels are divided by the tensor-parallel size, and conv windows are dense (DDTree
turns off the deduplicated conv-window layout). Both buffers grow linearly in ``T``, so
the rule is a division. See docs/state-forking.md for the derivation and a worked
example.

Pure functions only: config validation calls :func:`max_ddtree_budget` with the
model's :class:`RecurrentShape` (from :data:`KNOWN_SHAPES` or built from its config).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1 << 30


@dataclass(frozen=True)
class RecurrentShape:
    """The recurrent (GDN / Mamba) part of a model, whole-model numbers (before TP)."""

    recurrent_layers: int  # L: layers with a recurrent state (linear-attention layers)
    value_heads: int  # HV: value heads per recurrent layer
    key_head_dim: int  # K
    value_head_dim: int  # V
    conv_dim: int  # channels of the short causal conv (q, k and v together for GDN)
    conv_width: int  # W: conv kernel size; the window keeps W - 1 inputs
    ssm_dtype_bytes: int = 4  # intermediate SSM state dtype (mamba_ssm_dtype)
    conv_dtype_bytes: int = 2  # conv window dtype (the model dtype)
    note: str = ""  # where the numbers come from, what is unconfirmed

    def __post_init__(self) -> None:
        for name in ("value_heads", "key_head_dim", "value_head_dim", "conv_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.recurrent_layers < 0:
            raise ValueError(f"recurrent_layers must be >= 0, got {self.recurrent_layers}")
        if self.conv_width < 1:
            raise ValueError(f"conv_width must be >= 1, got {self.conv_width}")
        if self.ssm_dtype_bytes <= 0 or self.conv_dtype_bytes <= 0:
            raise ValueError("dtype sizes must be positive")

    def node_bytes(self, tp_size: int = 1) -> int:
        """Bytes of one verify position of one request row, all layers, one GPU."""
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        if self.value_heads % tp_size or self.conv_dim % tp_size:
            raise ValueError(
                f"tp_size {tp_size} does not divide value_heads {self.value_heads} and conv_dim {self.conv_dim}"
            )
        ssm = (self.value_heads // tp_size) * self.value_head_dim * self.key_head_dim
        conv = (self.conv_dim // tp_size) * (self.conv_width - 1)
        per_layer = ssm * self.ssm_dtype_bytes + conv * self.conv_dtype_bytes
        return self.recurrent_layers * per_layer


def gdn_conv_dim(key_heads: int, value_heads: int, key_head_dim: int, value_head_dim: int) -> int:
    """GDN's conv runs over q, k and v: 2 * key_heads * K + value_heads * V channels."""
    return 2 * key_heads * key_head_dim + value_heads * value_head_dim


def forking_buffer_bytes(shape: RecurrentShape, budget: int, max_running_requests: int, tp_size: int = 1) -> int:
    """Per-GPU bytes of the intermediate SSM states and conv windows at ``budget``."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if max_running_requests < 1:
        raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
    rows = max_running_requests + 1
    return shape.node_bytes(tp_size) * rows * (budget + 1)


def max_ddtree_budget(
    shape: RecurrentShape,
    *,
    max_running_requests: int,
    memory_left_bytes: int,
    tp_size: int = 1,
    cap: int | None = None,
) -> int | None:
    """The largest DDTree budget whose forking buffers fit in ``memory_left_bytes``.

    ``memory_left_bytes``: per-GPU memory left after weights and KV cache (what the
    speculative buffers may use). Returns 0 when not even budget 1 fits, and ``cap``
    (``None`` when no cap) for a model without recurrent layers: memory does not bound
    its budget through this rule.
    """
    if memory_left_bytes < 0:
        raise ValueError(f"memory_left_bytes must be >= 0, got {memory_left_bytes}")
    if cap is not None and cap < 0:
        raise ValueError(f"cap must be >= 0, got {cap}")
    per_position = forking_buffer_bytes(shape, 0, max_running_requests, tp_size)
    if per_position == 0:
        return cap
    positions = memory_left_bytes // per_position  # T = budget + 1
    budget = max(positions - 1, 0)
    return budget if cap is None else min(budget, cap)


QWEN3_5_27B = RecurrentShape(
    recurrent_layers=48,
    value_heads=48,
    key_head_dim=128,
    value_head_dim=128,
    conv_dim=gdn_conv_dim(16, 48, 128, 128),
    conv_width=4,
    note="Qwen3.5-27B text_config: 64 layers, full_attention_interval 4, "
    "linear heads 16/48, dims 128, linear_conv_kernel_dim 4, mamba_ssm_dtype float32",
)

# Qwen3.6-27B: 64 layers in 16 x (3 GDN + 1 gated attention), so 48 GDN layers; GDN heads
# 48 value / 16 query-key, head dim 128 (Qwen model card, mirrored at
# shilu.ai/articles/qwen-hf/qwen-qwen3.6-27b; layer split also in the config.json quoted by
# eadst.com/blog/325): the Qwen3.5-27B shape. Conv kernel 4 and mamba_ssm_dtype float32 are
# read from the Qwen3.5-27B config (same qwen3_5 architecture); not confirmed on a
# Qwen3.6-27B config.json here.
QWEN3_6_27B = replace(
    QWEN3_5_27B,
    note="layers/heads/dims: Qwen3.6-27B model card; conv width 4 and float32 SSM "
    "state: Qwen3.5-27B config (same architecture), unconfirmed for 3.6",
)

KNOWN_SHAPES: dict[str, RecurrentShape] = {
    "Qwen/Qwen3.6-27B": QWEN3_6_27B,
    "Qwen/Qwen3.6-27B-FP8": QWEN3_6_27B,  # same recurrent shapes; FP8 weights only
    "Qwen/Qwen3.5-27B": QWEN3_5_27B,
}


def shape_for_model(model: str) -> RecurrentShape | None:
    """The known recurrent shape of a model id (exact, case-insensitive), or None."""
    for name, shape in KNOWN_SHAPES.items():
        if name.lower() == model.lower():
            return shape
    return None
