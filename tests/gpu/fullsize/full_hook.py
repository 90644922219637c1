"""TEST EQUIPMENT: profiler ranges around the parts of a speculative decode step, inside the patched server
(installed by hook/sitecustomize.py when SGDEPLOY_FULL_HOOK=1; never part of a release). They change
nothing the server computes: each wrapped function runs inside ``torch.profiler.record_function(name)``,
which costs a few microseconds of host time and nothing on the GPU, and only records while a profiler
runs (SGLang's ``/start_profile``). breakdown.py maps the GPU kernels to these ranges.

| range (``RANGES``) | wraps | part |
| --- | --- | --- |
| ``sgdeploy_full::draft`` | ``ddtree_decode._draft_block_hidden`` | draft forward |
| ``sgdeploy_full::topk`` | ``ddtree_worker.depth_topk_logprobs`` | top-k |
| ``sgdeploy_full::tree`` | ``ddtree_worker.build_ddtree`` | tree build + mask |
| ``sgdeploy_full::mask`` | ``DDTreeVerifyInput.from_layout`` | tree build + mask |
| ``sgdeploy_full::verify`` | ``eagle_worker_common.run_eagle_verify`` | verify (sampling, commit) |
| ``sgdeploy_full::target_forward`` | ``TpModelWorker.forward_batch_generation`` | target verify forward |
| ``sgdeploy_full::fork_commit`` | ``ddtree_state_fork.commit_tree_steps`` | commit (forked states) |
| ``sgdeploy_full::draft_kv`` | ``DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc`` | commit (draft KV) |
| ``sgdeploy_full::dflash_decode`` / ``dflash_extend`` | ``DFlashWorkerV2.forward_batch_generation`` | a DFLASH step |

The DDTree step itself is e2e_hook's ``sgdeploy_e2e::ddtree_decode_step`` (``ddtree_decode.forward_decode``).
Functions imported by name into another module are wrapped where the caller looks them up (the
``ddtree_worker`` globals); ``run_eagle_verify`` and ``commit_tree_steps`` are imported inside the calling
function at call time, so wrapping the module attribute reaches them.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2e"))

import e2e_hook  # noqa: E402  (tests/gpu/e2e: its import-time loader)

PREFIX = "sgdeploy_full::"
# module -> [(attribute path, range name)]
RANGES: dict[str, list[tuple[str, str]]] = {
    "sglang.srt.speculative.ddtree_decode": [("_draft_block_hidden", "draft")],
    "sglang.srt.speculative.ddtree_worker": [("depth_topk_logprobs", "topk"), ("build_ddtree", "tree")],
    "sglang.srt.speculative.ddtree_info": [("DDTreeVerifyInput.from_layout", "mask")],
    "sglang.srt.speculative.eagle_worker_common": [("run_eagle_verify", "verify")],
    "sglang.srt.managers.tp_worker": [("TpModelWorker.forward_batch_generation", "target_forward")],
    "sglang.srt.speculative.ddtree_state_fork": [("commit_tree_steps", "fork_commit")],
    "sglang.srt.speculative.dflash_worker_v2": [
        ("DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc", "draft_kv"),
        ("DFlashWorkerV2.forward_batch_generation", "dflash"),
    ],
}


def _mode_suffix(args) -> str:
    """``dflash`` ranges say whether the batch decodes or extends (prefill)."""
    batch = args[1] if len(args) > 1 else None
    mode = getattr(batch, "forward_mode", None)
    try:
        return "_extend" if mode is not None and (mode.is_extend() or mode.is_idle()) else "_decode"
    except Exception:  # noqa: BLE001
        return "_decode"


def wrap(fn, name: str):
    if getattr(fn, "_sgdeploy_full", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import torch

        label = PREFIX + name + (_mode_suffix(args) if name == "dflash" else "")
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    wrapper._sgdeploy_full = True
    return wrapper


def patch_module(module, entries) -> list[str]:
    done = []
    for path, name in entries:
        owner, attr = module, path
        if "." in path:
            cls_name, attr = path.split(".", 1)
            owner = getattr(module, cls_name, None)
        if owner is None or not hasattr(owner, attr):
            continue
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(wrap(raw.__func__, name)))
        elif isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(wrap(raw.__func__, name)))
        else:
            setattr(owner, attr, wrap(getattr(owner, attr), name))
        done.append(path)
    return done


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the modules of ``RANGES`` the normal way and wraps their functions right after they execute
    (e2e_hook's loader)."""

    def find_spec(self, name, path=None, target=None):
        entries = RANGES.get(name)
        if entries is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = e2e_hook._Loader(spec.loader, functools.partial(_patch_both, name=name, entries=entries))
        return spec


def _patch_both(module, name: str, entries) -> None:
    """This finder is first on ``sys.meta_path``, so e2e_hook's finder never sees a module both hooks patch
    (``ddtree_decode``: its step range, ``ddtree_info``): apply e2e_hook's patch here too when it is on. The
    first full-size run lacked the e2e step range for this reason."""
    e2e_patch = e2e_hook.PATCHES.get(name)
    if e2e_patch is not None and os.environ.get("SGDEPLOY_E2E_HOOK") == "1":
        e2e_patch(module)
    patch_module(module, entries)


def install() -> None:
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, entries in RANGES.items():
        if name in sys.modules:
            patch_module(sys.modules[name], entries)
    sys.meta_path.insert(0, _Finder())
