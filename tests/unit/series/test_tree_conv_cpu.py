"""DDTree's tree conv (patch 0004) equals SGLang 0.5.23's tree conv bit for bit, on the CPU (Triton's interpreter).

The GPU check (tests/gpu/fullsize/gdn_verify_split.py, full size, bf16) needs the lent H200; this runs
tests/gpu/tree_conv_check.py in build/cpu-venv under TRITON_INTERPRET=1 against the wheel the
repository's series builds (upstream's ``causal_conv1d_triton.py`` from it,
``kernels/ops/speculative/ddtree/tree_conv.py`` from patches/sglang/src): random trees and a chain,
widths 2-4, bias or none, int32 and int64 parents, a padded row, verify widths 2-17, fp16 (the
interpreter has no bf16). Every conv output, conv window and conv state must be equal; with the
parents all read as the root (a kernel that ignores them) most cases must differ, so the check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_ddtree_plumbing import patched_site  # noqa: F401  (the patched-wheel fixture)
from test_patched_cli import cpu_python, downloads  # noqa: F401  (build/cpu-venv; the wheel's downloads)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
CHECK = REPO / "tests" / "gpu" / "tree_conv_check.py"
SRC = REPO / "patches" / "sglang" / "src"
KERNEL = SRC / "sglang" / "kernels" / "ops" / "speculative" / "ddtree" / "tree_conv.py"
SELECT = SRC / "sglang" / "srt" / "speculative" / "ddtree_tree_conv.py"


def _run(python, site: Path, src: Path) -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", SGLANG_UPSTREAM_ROOT=str(site),
               SGLANG_SRC_ROOT=str(src))
    proc = subprocess.run([str(python), str(CHECK)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_tree_conv_equals_upstream_bit_for_bit(cpu_python, patched_site):  # noqa: F811
    rows = _run(cpu_python, patched_site, REPO / "patches" / "sglang" / "src")
    assert len(rows) >= 20
    assert {r["width"] for r in rows} == {2, 3, 4} and {r["links"] for r in rows} == {"int32", "int64"}
    assert any(r["chain"] for r in rows) and any(r["bias"] for r in rows)
    bad = [r for r in rows if not all(r["equal"].values())]
    assert not bad, bad


def test_the_check_fails_a_kernel_that_ignores_the_parents(cpu_python, patched_site, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    dest = src / KERNEL.relative_to(REPO / "patches" / "sglang" / "src")
    dest.parent.mkdir(parents=True)
    text = KERNEL.read_text()
    clamp = "p = tl.where((p >= 0) & (p < a), p, 0)"
    assert clamp in text
    dest.write_text(text.replace(clamp, clamp + " * 0"))  # every parent read as the root
    rows = _run(cpu_python, patched_site, src)
    wrong = [r for r in rows if not r["equal"]["out"]]
    assert len(wrong) >= len(rows) // 2, rows


def test_the_parents_reach_every_tree_conv_the_series_routes(patched_site):  # noqa: F811
    """Diff 0004 in the built wheel: DDTree's parents are copied wherever the tree links are (the eager parent
    tensor and both CUDA-graph copy sites: a missed site would leave a captured graph reading stale parents),
    and the GDN verify's conv goes through the switch, guarded by the forking flag."""
    hybrid = (patched_site / "sglang/srt/layers/attention/hybrid_linear_attn_backend.py").read_text()
    link_copies = hybrid.count("retrieve_next_sibling_list[")
    parent_copies = hybrid.count("self.retrieve_parent_token_list[cuda_graph_bs - 1][:bs_without_pad].copy_(") + \
        hybrid.count("self.retrieve_parent_token_list[bs - 1][:bs_without_pad].copy_(")
    # One retrieve_next_sibling_list[...] is the capture-time ForwardMetadata argument, the rest are copies.
    graph_link_copies = hybrid.count("retrieve_next_sibling_list[cuda_graph_bs - 1][:bs_without_pad].copy_(") + \
        hybrid.count("retrieve_next_sibling_list[bs - 1][:bs_without_pad].copy_(")
    assert graph_link_copies == 2 and link_copies >= graph_link_copies, (link_copies, graph_link_copies)
    assert parent_copies == graph_link_copies, (parent_copies, graph_link_copies)
    assert "retrieve_parent_token.copy_(forward_batch.spec_info.retrieve_parent_token)" in hybrid
    assert hybrid.count("if self._ddtree_forking:  # patch 0004") == 3
    gdn = (patched_site / "sglang/srt/layers/attention/linear/gdn_backend.py").read_text()
    assert "if self._ddtree_forking and retrieve_next_token is not None:" in gdn
    assert "from sglang.srt.speculative.ddtree_tree_conv import select_tree_conv" in gdn
    assert "conv_update = select_tree_conv(causal_conv1d_update)" in gdn
    assert "mixed_qkv_processed = conv_update(" in gdn
    assert "from sglang.kernels.ops.speculative.ddtree.tree_conv import ddtree_tree_conv1d_update" in SELECT.read_text()
    for new in (KERNEL, SELECT):  # the kernel with upstream's speculative kernels, its switch in srt/speculative
        assert (patched_site / new.relative_to(SRC)).read_bytes() == new.read_bytes()
