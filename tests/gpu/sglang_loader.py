"""Import single modules of an unpacked SGLang wheel without running package ``__init__``s.

The lent GPU machine has neither SGLang's pinned torch nor sglang-kernel, so importing
``sglang`` (whose ``__init__`` pulls in the whole runtime) fails there. Kernel modules
only need their parent packages to exist: register empty package objects whose
``__path__`` points at the real folders, plus a stub ``sglang.srt.utils.common``
exposing ``torch_release``, then import the module normally.

    mod = load_module(wheel_root, "sglang.srt.speculative.ddtree_tree")
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path


def _torch_release() -> tuple[int, ...]:
    import torch

    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _ensure_package(name: str, folder: Path) -> None:
    mod = sys.modules.get(name)
    if mod is not None and getattr(mod, "__path__", None) is not None:
        if str(folder) not in list(mod.__path__):
            mod.__path__.append(str(folder))
        return
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(folder)]
    pkg.__package__ = name
    sys.modules[name] = pkg
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, pkg)


def _ensure_common_stub() -> None:
    name = "sglang.srt.utils.common"
    if name in sys.modules:
        return
    stub = types.ModuleType(name)
    stub.torch_release = _torch_release()
    sys.modules[name] = stub
    sys.modules["sglang.srt.utils"].common = stub


def load_module(wheel_root, dotted: str):
    """Import ``dotted`` (e.g. ``sglang.srt.speculative.ddtree_tree``) from ``wheel_root``."""
    root = Path(wheel_root).resolve()
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        folder = root.joinpath(*parts[:i])
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} (package {pkg}) not found under {root}")
        _ensure_package(pkg, folder)
    if (root / "sglang" / "srt" / "utils").is_dir():
        _ensure_package("sglang.srt", root / "sglang" / "srt")
        _ensure_package("sglang.srt.utils", root / "sglang" / "srt" / "utils")
        _ensure_common_stub()
    return importlib.import_module(dotted)
