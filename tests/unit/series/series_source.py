"""Load one module of the patch series' source (patches/sglang/src/sglang/srt/...) by path, for the tests of the modules
that need neither torch nor SGLang at import."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SRC = Path(__file__).resolve().parents[3] / "patches/sglang/src/sglang/srt"


def load(relative: str) -> ModuleType:
    """The module at ``SRC / relative`` (e.g. ``speculative/ddtree_schedule.py``), under a name of its own."""
    path = SRC / relative
    spec = importlib.util.spec_from_file_location(f"series_under_test_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
