"""TEST EQUIPMENT: the harness's hook inside the patched SGLang server (installed by hook/sitecustomize.py
when SGDEPLOY_E2E_HOOK=1; never part of a release).

Two things, both without changing what the server computes:

- **Accepted-path log.** After each DDTree verify, ``DDTreeVerifyInput.set_accepted_nodes`` is given
  EAGLE's ``accept_index`` / ``accept_lens``; the wrapper reads them and the tree links on the host and
  appends one JSON line per decode step to ``$SGDEPLOY_E2E_PATH_LOG/paths-<pid>.jsonl``:
  ``{"rows": [[accepted draft tokens, [sibling rank of each accepted node]], ...]}`` (one row per
  request, ``e2e_stats.step_rows``). The read is a host synchronisation, so it runs only while the file
  ``$SGDEPLOY_E2E_PATH_LOG/on`` exists (the harness creates it for the measured requests and removes
  it before the profiled ones).
- **Profiler range.** ``ddtree_decode.forward_decode`` runs inside
  ``torch.profiler.record_function("sgdeploy_e2e::ddtree_decode_step")``: the torch profiler (SGLang's
  ``/start_profile``) then shows where a decode step begins and ends, for ``trace_check``.

The server exposes neither (only per-request ``spec_correct_drafts_histogram``): the change the series
would need to expose the path itself is in FINDINGS.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading

RANGE_NAME = "sgdeploy_e2e::ddtree_decode_step"
INFO_MODULE = "sglang.srt.speculative.ddtree_info"
DECODE_MODULE = "sglang.srt.speculative.ddtree_decode"

_lock = threading.Lock()
_errors = [0]


def log_dir() -> str | None:
    return os.environ.get("SGDEPLOY_E2E_PATH_LOG") or None


def logging_on() -> bool:
    d = log_dir()
    return bool(d) and os.path.exists(os.path.join(d, "on"))


def _write(record: dict) -> None:
    d = log_dir()
    if not d:
        return
    line = json.dumps(record, separators=(",", ":")) + "\n"
    with _lock, open(os.path.join(d, f"paths-{os.getpid()}.jsonl"), "a") as f:
        f.write(line)


def log_step(verify_input, accept_index, accept_lens) -> None:
    """Append this step's accepted paths (host reads: a synchronisation)."""
    import e2e_stats as stats  # beside this file

    lens = [int(x) for x in accept_lens.tolist()]
    index = accept_index.tolist()
    parents = verify_input.retrieve_parent_token.tolist()
    firsts = verify_input.retrieve_next_token.tolist()
    siblings = verify_input.retrieve_next_sibling.tolist()
    bs = min(len(lens), len(parents))
    rows = stats.step_rows(index[:bs], lens[:bs], parents, firsts, siblings, int(verify_input.draft_token_num))
    _write({"rows": rows})


def patch_info(module) -> None:
    cls = module.DDTreeVerifyInput
    original = cls.set_accepted_nodes
    if getattr(original, "_sgdeploy_e2e", False):
        return

    def set_accepted_nodes(self, accept_index, accept_lens):
        out = original(self, accept_index, accept_lens)
        if logging_on():
            try:
                log_step(self, accept_index, accept_lens)
            except Exception as err:  # noqa: BLE001 - the log must never break a decode step
                if _errors[0] < 5:
                    _errors[0] += 1
                    _write({"error": f"{type(err).__name__}: {err}"})
        return out

    set_accepted_nodes._sgdeploy_e2e = True
    cls.set_accepted_nodes = set_accepted_nodes


def patch_decode(module) -> None:
    original = module.forward_decode
    if getattr(original, "_sgdeploy_e2e", False):
        return

    def forward_decode(*args, **kwargs):
        import torch

        with torch.profiler.record_function(RANGE_NAME):
            return original(*args, **kwargs)

    forward_decode._sgdeploy_e2e = True
    module.forward_decode = forward_decode


PATCHES = {INFO_MODULE: patch_info, DECODE_MODULE: patch_decode}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the two modules the normal way and patches them right after they execute (before any other
    module can bind their names)."""

    def find_spec(self, name, path=None, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, patch)
        return spec


def install() -> None:
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
