"""Import single SGLang modules from where they live without running package ``__init__``s.

The series' new modules live in the repository (``patches/sglang/src``, ``SGLANG_SRC_ROOT``); the
upstream modules they use come from an unpacked wheel (``SGLANG_UPSTREAM_ROOT``, default
``build/patchwork/tree``, which ``make patch-work`` fills with pristine 0.5.23 + src + the series).
``ROOTS`` is both, src first: each package's ``__path__`` lists the folders of both that exist.

The lent GPU machine has neither SGLang's pinned torch nor sglang-kernel, so importing
``sglang`` (whose ``__init__`` pulls in the whole runtime) fails there. Kernel modules
only need their parent packages to exist: register empty package objects whose
``__path__`` points at the real folders, plus a stub ``sglang.srt.utils.common``
exposing ``torch_release``, then import the module normally.

    mod = load_module(ROOTS, "sglang.srt.speculative.ddtree_tree")
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC_ROOT = Path(os.environ.get("SGLANG_SRC_ROOT", REPO / "patches" / "sglang" / "src"))
UPSTREAM_ROOT = Path(os.environ.get("SGLANG_UPSTREAM_ROOT", REPO / "build" / "patchwork" / "tree"))
ROOTS = (SRC_ROOT, UPSTREAM_ROOT)


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


def series_packages(src_root=None) -> list[str]:
    """Every package that holds a file of the series (``src_root``, default ``SRC_ROOT``), parents first:
    ``sglang.srt.speculative``, ``sglang.kernels.ops.speculative.ddtree``, ..."""
    root = Path(src_root or SRC_ROOT)
    names = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parent.parts
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(names, key=lambda n: (n.count("."), n))


def _ensure_chain(roots, parts, required: bool) -> None:
    for i in range(1, len(parts) + 1):
        pkg = ".".join(parts[:i])
        folders = [r.joinpath(*parts[:i]) for r in roots if r.joinpath(*parts[:i]).is_dir()]
        if not folders:
            if not required:
                return
            raise FileNotFoundError(f"package {pkg} not found under {', '.join(map(str, roots))}")
        for folder in folders:
            _ensure_package(pkg, folder)


def load_module(roots, dotted: str):
    """Import ``dotted`` (e.g. ``sglang.srt.speculative.ddtree_tree``) from ``roots`` (a folder
    holding ``sglang/``, or several, searched in order).

    The packages of the series' files (``series_packages``) are set up over every root first, so a
    module of one series package imports one of another (the host side in ``sglang.srt.speculative``
    imports its kernels from ``sglang.kernels.ops.speculative.ddtree``) from src/ as well as from the
    unpacked tree, without running upstream's package ``__init__``s."""
    roots = [Path(r).resolve() for r in ([roots] if isinstance(roots, (str, os.PathLike)) else roots)]
    for pkg in series_packages():
        _ensure_chain(roots, pkg.split("."), required=False)
    _ensure_chain(roots, dotted.split(".")[:-1], required=True)
    for r in roots:
        if (r / "sglang" / "srt" / "utils").is_dir():
            _ensure_package("sglang.srt", r / "sglang" / "srt")
            _ensure_package("sglang.srt.utils", r / "sglang" / "srt" / "utils")
            _ensure_common_stub()
    return importlib.import_module(dotted)


def stub_jit_utils() -> None:
    """0.5.23's kernel modules import ``is_arch_support_pdl`` from ``sglang.kernels.jit.utils``, whose
    package pulls in the JIT toolchain: stand in for it (PDL on Hopper and newer, as SGLang decides)."""
    name = "sglang.kernels.jit.utils"
    if name in sys.modules:
        return
    import torch

    stub = types.ModuleType(name)
    stub.is_arch_support_pdl = lambda: torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.jit"):
        for root in map(Path, ROOTS):
            folder = root.joinpath(*pkg.split("."))
            if folder.is_dir():
                _ensure_package(pkg, folder)
    sys.modules[name] = stub
