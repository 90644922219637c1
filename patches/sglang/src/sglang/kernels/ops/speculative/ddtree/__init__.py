"""DDTree's Triton and Gluon kernels, next to upstream's speculative kernels (as 0.5.23 keeps DSPARK's in
``dspark/``): ``tree`` (the draft-tree builder and its ancestor mask), ``tree_conv`` (the GDN verify's tree
conv from the parents, feature ``fork``) and ``fused_depth_topk`` (the per-depth top-k over the lm_head,
feature ``topk``). The host logic that calls them stays in ``sglang/srt/speculative/ddtree_*.py``.

New file of the sgdeploy patch series (the package of DDTree's kernels; not in SGLang 0.5.23), laid over the
pristine wheel at this path by the build.
"""
