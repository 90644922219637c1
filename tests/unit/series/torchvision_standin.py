"""An empty stand-in for torchvision inside build/cpu-venv (stdlib only, imported by the child
processes of test_patched_cli.py and test_ddtree_plumbing.py).

torchvision has no CPU wheel for torch 2.13 here. Only SGLang's multimodal modules import it, and
neither argument parsing nor the DDTree modules call into it, so any attribute is another stub.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


class Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Stub(f"{self.__name__}.{name}")

    def __call__(self, *a, **k):
        return self


class StubFinder:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = Stub(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install() -> None:
    """Import transformers' availability table first (it records torchvision as absent), then let
    every later `import torchvision...` find the stand-in."""
    import transformers.utils.import_utils  # noqa: F401

    sys.meta_path.append(StubFinder())
