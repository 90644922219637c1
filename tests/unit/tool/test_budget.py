"""The DDTree budget memory rule (sgdeploy.budget)."""

from dataclasses import replace

import pytest

from sgdeploy.budget import (
    GIB,
    KNOWN_SHAPES,
    QWEN3_6_27B,
    RecurrentShape,
    forking_buffer_bytes,
    gdn_conv_dim,
    max_ddtree_budget,
    shape_for_model,
)

MIB = 1 << 20


def test_qwen36_27b_shape():
    s = QWEN3_6_27B
    assert (s.recurrent_layers, s.value_heads, s.key_head_dim, s.value_head_dim) == (48, 48, 128, 128)
    assert s.conv_dim == 2 * 16 * 128 + 48 * 128 == 10240
    # one verify position, one request row, 48 layers: 48 x (48*128*128*4 + 10240*3*2) bytes
    assert s.node_bytes() == 48 * (3 * MIB + 61440) == 153_944_064
    assert s.node_bytes(tp_size=2) == 48 * (3 * MIB // 2 + 30720)


def test_buffer_bytes_match_the_sglang_allocation():
    # [L, R, T, HV, V, K] fp32 + [L, R, T, conv_dim, W-1] bf16, R = running + 1, T = budget + 1
    s = QWEN3_6_27B
    want = 48 * 9 * 16 * (48 * 128 * 128 * 4 + 10240 * 3 * 2)
    assert forking_buffer_bytes(s, budget=15, max_running_requests=8) == want


def test_worked_example_96gb_card():
    """docs/state-forking.md: Qwen3.6-27B at TP 1 on a 96 GB RTX PRO 6000."""
    card = 97_887 * MIB  # what nvidia-smi reports for the card
    weights = 55_560_000_000  # bf16 checkpoint, model.safetensors.index.json total_size
    kv_cache = 16 * GIB  # 262 144 tokens x 64 KiB (16 attention layers x 4 KV heads x 256 x K,V x bf16)
    rest = 6 * GIB  # drafter, activations, CUDA graphs (an assumption of the example)
    left = card - weights - kv_cache - rest
    assert round(left / GIB, 1) == 21.8
    budgets = [max_ddtree_budget(QWEN3_6_27B, max_running_requests=r, memory_left_bytes=left) for r in (1, 4, 8, 16)]
    assert budgets == [75, 29, 15, 7]
    # budget 15 at 8 requests is the DFlash block-16 footprint: T = 16 positions either way
    assert round(forking_buffer_bytes(QWEN3_6_27B, 15, 8) / GIB, 2) == 20.65


@pytest.mark.parametrize("running", [1, 3, 8, 32])
@pytest.mark.parametrize("left_gib", [1, 7.5, 21, 64])
def test_result_is_the_largest_budget_that_fits(running, left_gib):
    left = int(left_gib * GIB)
    b = max_ddtree_budget(QWEN3_6_27B, max_running_requests=running, memory_left_bytes=left)
    if b > 0:
        assert forking_buffer_bytes(QWEN3_6_27B, b, running) <= left
    assert forking_buffer_bytes(QWEN3_6_27B, b + 1, running) > left


def test_nothing_fits():
    # Budget 1 needs two positions (root + one node); one position's worth is not enough.
    one_position = forking_buffer_bytes(QWEN3_6_27B, 0, 8)
    assert max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=0) == 0
    assert max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=one_position) == 0
    assert max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=2 * one_position) == 1


def test_cap_and_tensor_parallel():
    left = 21 * GIB
    assert max_ddtree_budget(QWEN3_6_27B, max_running_requests=1, memory_left_bytes=left, cap=63) == 63
    tp2 = max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=left, tp_size=2)
    assert tp2 == 31  # half the heads per GPU: twice the positions (32), minus the root
    with pytest.raises(ValueError, match="does not divide"):
        max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=left, tp_size=5)


def test_pure_attention_model_is_not_bounded():
    attn_only = replace(QWEN3_6_27B, recurrent_layers=0)
    assert max_ddtree_budget(attn_only, max_running_requests=64, memory_left_bytes=0) is None
    assert max_ddtree_budget(attn_only, max_running_requests=64, memory_left_bytes=0, cap=256) == 256


def test_dtype_sizes_scale_the_rule():
    bf16_state = replace(QWEN3_6_27B, ssm_dtype_bytes=2)
    left = 21 * GIB
    fp32 = max_ddtree_budget(QWEN3_6_27B, max_running_requests=8, memory_left_bytes=left)
    bf16 = max_ddtree_budget(bf16_state, max_running_requests=8, memory_left_bytes=left)
    assert (fp32, bf16) == (15, 30)  # the state dominates; conv windows stay bf16


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_running_requests": 0, "memory_left_bytes": GIB},
        {"max_running_requests": 1, "memory_left_bytes": -1},
        {"max_running_requests": 1, "memory_left_bytes": GIB, "cap": -1},
        {"max_running_requests": 1, "memory_left_bytes": GIB, "tp_size": 0},
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        max_ddtree_budget(QWEN3_6_27B, **kwargs)


def test_bad_shapes():
    with pytest.raises(ValueError):
        RecurrentShape(recurrent_layers=-1, value_heads=1, key_head_dim=1, value_head_dim=1, conv_dim=1, conv_width=4)
    with pytest.raises(ValueError):
        RecurrentShape(recurrent_layers=1, value_heads=0, key_head_dim=1, value_head_dim=1, conv_dim=1, conv_width=4)
    with pytest.raises(ValueError):
        forking_buffer_bytes(QWEN3_6_27B, budget=-1, max_running_requests=1)


def test_known_shapes():
    assert shape_for_model("qwen/qwen3.6-27b") is QWEN3_6_27B
    assert shape_for_model("moonshotai/Kimi-K2.6") is None
    assert gdn_conv_dim(16, 32, 128, 128) == 8192
    for name, shape in KNOWN_SHAPES.items():
        assert shape.node_bytes() > 0, name
        assert shape.note, name
