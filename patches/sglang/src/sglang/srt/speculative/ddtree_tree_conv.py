"""Which tree conv a DDTree tree verify runs (patch 0004, feature ``fork``): the host side of the kernel.

What: ``select_tree_conv`` (called by gdn_backend.py, diff 0004, with DDTree state forking on and a tree
verify) returns DDTree's tree conv from the parents (``ddtree_tree_conv1d_update``,
``sglang/kernels/ops/speculative/ddtree/tree_conv.py``) unless the server was started with
``--speculative-ddtree-tree-conv upstream``, then 0.5.23's ``causal_conv1d_update`` (passed in). Same
outputs bit for bit; the switch is there to compare the two side by side.

Why a file of its own: the kernel lives with upstream's speculative kernels; reading the server's
settings is the runtime's business, so it stays here, next to the other DDTree host logic.

New file of the sgdeploy patch series (feature ``fork``; not in SGLang 0.5.23), laid over the pristine
wheel at this path by the build.
"""

from __future__ import annotations


def select_tree_conv(upstream_conv):
    """The conv a DDTree tree verify runs (gdn_backend, diff 0004): DDTree's from the parents, unless the
    server was started with ``--speculative-ddtree-tree-conv upstream`` (0.5.23's ``causal_conv1d_update``,
    passed in)."""
    try:
        from sglang.srt.runtime_context import get_spec

        choice = getattr(get_spec(), "speculative_ddtree_tree_conv", None) or "parents"
    except Exception:  # no runtime context (tests, tools): the default
        choice = "parents"
    if choice == "upstream":
        return upstream_conv
    from sglang.kernels.ops.speculative.ddtree.tree_conv import ddtree_tree_conv1d_update

    return ddtree_tree_conv1d_update
