"""TEST EQUIPMENT: top-k / top-p renormalisation by SGLang's Triton kernels (renorm_triton)."""


def top_k_renorm_probs(probs, top_k):
    from sglang.kernels.ops.sampling.renorm_triton import top_k_renorm_probs_triton

    return top_k_renorm_probs_triton(probs, top_k)


def top_p_renorm_probs(probs, top_p):
    from sglang.kernels.ops.sampling.renorm_triton import top_p_renorm_probs_triton

    return top_p_renorm_probs_triton(probs, top_p)
