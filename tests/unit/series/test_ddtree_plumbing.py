"""Patch 0001's DDTree code against the real SGLang 0.5.23 it calls into, on the CPU.

`ddtree_decode.py`, `ddtree_worker.py` and `ddtree_info.py` have never run inside a server (that
needs torch 2.14.1, sglang-kernel and a GPU). Their risk is plumbing: a keyword that the 0.5.23
function does not take, a wrong number of positional arguments, a method or attribute that the
0.5.23 classes do not have, a dataclass field that is not there. This test runs in build/cpu-venv
with the patched wheel (the whole series, as the wheel build applies it) installed, imports the
three modules from where they live (patches/sglang/src/, put first on the packages' `__path__`)
and walks their AST. For every call whose callee resolves, by import or through the classes it
reaches (DDTreeWorker -> DFlashWorkerV2, DDTreeVerifyInput -> EagleVerifyInput, the values that
their methods return and their attributes hold), to an SGLang function, method or class,
`inspect.signature(callee).bind(...)` is tried with placeholders for the arguments the call passes.
Every attribute read or written on an SGLang object of a known class must be defined by that class
(its MRO: class attributes, dataclass fields, annotations, or `self.NAME = ...` in a method).

How types are known, without running anything: `self` / `cls`; parameter annotations (or the
overridden base method's); arguments at the call sites inside the three files (a fixed point over
them); return annotations; class annotations and dataclass fields; properties' return annotations;
`self.NAME = value` in the class's methods, where `value` is typed the same way; `if not
isinstance(x, C): raise`. Also checked: `getattr(obj, "name", default)` (a name the class does not
have makes the default permanent), names read through a `__getattr__` that forwards to a member
(DFlashWorkerV2 -> target_worker), leaves of SGLang's config namespaces (`get_spec().x`: the
ServerArgs fields that SGLang's `namespace_of` puts under "spec") and of `get_parallel()`, and an
override that forwards `*args, **kwargs` (the callee must take the base method's parameters).
What cannot be typed is listed as unresolved, never guessed; a name that only subclasses of the
declared type have (a downcast the annotations do not show) is listed as unresolved too. Not bound:
calls into torch, triton, builtins and the standard library (counted per package).

`DDTreeVerifyInput.from_layout` and `set_accepted_nodes` are also run on a tiny CPU tree.

The paths that are not DDTree stay out of DDTree code (a second child run, `--trace`): importing the
upstream modules that the series edits loads no module of src/; parsing and resolving an AR and a
DFLASH command line with the patched SGLang calls no function defined in src/ (a `sys.setprofile`
trace) and leaves the DDTree switches unset, which is what the edited upstream lines test before
they import anything from src/; the same trace of a DDTREE line does enter src/ (the control). The
forking-off warning of `ddtree_state_fork.hybrid_forking` is checked there too.

The checker half of this file is standard-library only and runs as a script inside build/cpu-venv
(`python test_ddtree_plumbing.py MODULE...`: JSON on stdout); the pytest half below it builds the
wheel and the venv (fixtures of test_patched_cli.py) and asserts on that JSON. A self-test feeds
the checker a snippet with a wrong keyword, a wrong positional count and a missing method.

Slow (the wheel build, and the venv when it must be made; about 25 s when it exists): `pytest -m slow`.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import importlib.machinery
import inspect
import json
import sys
import types
import typing
from pathlib import Path

# The modules of patch 0001 whose calls into SGLang are checked.
DDTREE_MODULES = (
    "sglang.srt.speculative.ddtree_decode",
    "sglang.srt.speculative.ddtree_worker",
    "sglang.srt.speculative.ddtree_info",
)

# Calls are bound only when the callee is SGLang's (its __module__ starts with "sglang"): the risk
# is drift against 0.5.23's own API. Everything else is counted per top-level module, not bound:
# torch / triton (tensor ops and their stable public API, not patched by the series), and Python's
# builtins and standard library (int, len, getattr, contextlib.nullcontext, logging).
CHECKED_PACKAGE = "sglang"


# ---------------------------------------------------------------------------------------------
# Values the analysis tracks


@dataclasses.dataclass(frozen=True)
class Obj:
    """A known Python object: a module, class, function or constant."""

    value: object


@dataclasses.dataclass(frozen=True)
class Inst:
    """An instance of one of `classes` (more than one for a Union annotation)."""

    classes: tuple


@dataclasses.dataclass(frozen=True)
class Method:
    """`raw` (as found in `owner.__dict__`) looked up through an instance or `super()`."""

    raw: object
    owner: type
    name: str


@dataclasses.dataclass(frozen=True)
class Super:
    cls: type


@dataclasses.dataclass(frozen=True)
class Foreign:
    """A value of a package other than SGLang (a tensor, a list...): its calls are counted as excluded."""

    top: str


def _sglang(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == CHECKED_PACKAGE


def _top_module(obj) -> str:
    mod = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "") or "?"
    return mod.split(".")[0]


# ---------------------------------------------------------------------------------------------
# Annotations and class members


_TYPE_CHECKING_IMPORTS: dict[str, dict[str, tuple[str, str | None]]] = {}


def _type_checking_imports(module: types.ModuleType) -> dict[str, tuple[str, str | None]]:
    """Names imported under `if TYPE_CHECKING:` (string annotations often refer to them)."""
    name = module.__name__
    if name not in _TYPE_CHECKING_IMPORTS:
        found: dict[str, tuple[str, str | None]] = {}
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for sub in node.body:
                    if isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                        for alias in sub.names:
                            found[alias.asname or alias.name] = (sub.module, alias.name)
                    elif isinstance(sub, ast.Import):
                        for alias in sub.names:
                            found[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        _TYPE_CHECKING_IMPORTS[name] = found
    return _TYPE_CHECKING_IMPORTS[name]


_MISSING = object()


def _lookup(module: types.ModuleType | None, name: str):
    if module is not None and name in vars(module):
        return vars(module)[name]
    if hasattr(builtins, name):
        return getattr(builtins, name)
    if module is not None and name in _type_checking_imports(module):
        mod_name, attr = _type_checking_imports(module)[name]
        try:
            mod = importlib.import_module(mod_name)
            return mod if attr is None else getattr(mod, attr)
        except Exception:  # an import that only works for a type checker
            return _MISSING
    return _MISSING


def _classes_of(obj) -> tuple | None:
    """The classes an evaluated annotation stands for; None when unknown or not a class."""
    if obj is None or obj is type(None):
        return ()
    if isinstance(obj, type) and obj.__module__ != "typing":
        return (obj,)
    origin = typing.get_origin(obj)
    if origin is typing.Union or origin is types.UnionType:
        out: list = []
        for arg in typing.get_args(obj):
            sub = _classes_of(arg)
            if sub is None:
                return None
            out.extend(sub)
        return tuple(out)
    return None


def _eval_annotation(node: ast.expr, module) -> tuple | None:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return ()
        if isinstance(node.value, str):
            return _eval_annotation(ast.parse(node.value, mode="eval").body, module)
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _eval_annotation(node.left, module), _eval_annotation(node.right, module)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.Subscript):
        base = _eval_annotation_obj(node.value, module)
        if base in (typing.Optional, typing.Union):
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            out: list = []
            for part in parts:
                sub = _eval_annotation(part, module)
                if sub is None:
                    return None
                out.extend(sub)
            return tuple(out)
        return None  # containers (List[...], Tuple[...]): element types are not tracked
    return _classes_of(_eval_annotation_obj(node, module))


def _eval_annotation_obj(node: ast.expr, module):
    if isinstance(node, ast.Name):
        obj = _lookup(module, node.id)
        return None if obj is _MISSING else obj
    if isinstance(node, ast.Attribute):
        base = _eval_annotation_obj(node.value, module)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def resolve_annotation(ann, module) -> tuple | None:
    if ann is inspect.Parameter.empty or ann is inspect.Signature.empty:
        return None
    if isinstance(ann, str):
        try:
            return _eval_annotation(ast.parse(ann, mode="eval").body, module)
        except SyntaxError:
            return None
    return _classes_of(ann)


def _module_of(obj) -> types.ModuleType | None:
    return sys.modules.get(getattr(obj, "__module__", None) or "")


def _function_of(raw):
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    if isinstance(raw, types.MethodType):
        return raw.__func__
    return raw


def _returns(func) -> tuple | None:
    func = _function_of(func)
    if isinstance(func, type):
        return (func,)
    ann = getattr(func, "__annotations__", {}).get("return", inspect.Signature.empty)
    return resolve_annotation(ann, _module_of(func))


_CLASS_TREES: dict[type, ast.ClassDef | None] = {}


def _class_tree(cls: type) -> ast.ClassDef | None:
    if cls not in _CLASS_TREES:
        tree = None
        try:
            import textwrap

            parsed = ast.parse(textwrap.dedent(inspect.getsource(cls)))
            tree = next((n for n in parsed.body if isinstance(n, ast.ClassDef)), None)
        except (OSError, TypeError, SyntaxError):
            pass
        _CLASS_TREES[cls] = tree
    return _CLASS_TREES[cls]


def _self_assignments(cls: type) -> dict[str, list[tuple[ast.FunctionDef, ast.AST]]]:
    """`self.NAME = value` / `self.NAME: T = value` / setattr(self, "NAME", ...) in `cls`'s own methods."""
    out: dict[str, list] = {}
    tree = _class_tree(cls)
    if tree is None:
        return out
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
            continue
        me = fn.args.args[0].arg
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.AnnAssign):
                pairs = [(node.target, node)]
            elif isinstance(node, ast.AugAssign):
                pairs = [(node.target, None)]
            elif (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                and len(node.args) == 3 and isinstance(node.args[0], ast.Name) and node.args[0].id == me
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            ):  # fmt: skip
                out.setdefault(node.args[1].value, []).append((fn, None))
                continue
            else:
                continue
            for target, value in pairs:
                targets = target.elts if isinstance(target, ast.Tuple) else [target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == me:
                        out.setdefault(t.attr, []).append((fn, value if len(targets) == 1 else None))
    return out


_DEFINED: dict[type, set[str]] = {}


def defined_names(cls: type) -> set[str]:
    """Every attribute name an instance of `cls` can have, as far as its classes say."""
    if cls not in _DEFINED:
        names = set(dir(cls))
        for k in cls.__mro__:
            names |= set(vars(k))  # dir() of an Enum class leaves out its methods
            names |= set(vars(k).get("__annotations__", {}))
            slots = vars(k).get("__slots__", ())
            names |= {slots} if isinstance(slots, str) else set(slots)
            names |= set(_self_assignments(k))
        if dataclasses.is_dataclass(cls):
            names |= {f.name for f in dataclasses.fields(cls)}
        _DEFINED[cls] = names
    return _DEFINED[cls]


def _subclasses(cls: type) -> list[type]:
    out, todo = [], list(cls.__subclasses__())
    while todo:
        k = todo.pop()
        if k not in out:
            out.append(k)
            todo.extend(k.__subclasses__())
    return out


def dynamic_getattr(cls: type) -> bool:
    return any("__getattr__" in vars(k) for k in cls.__mro__ if k is not object)


def delegate_of(cls: type) -> str | None:
    """X when the class's __getattr__ is `return getattr(self.X, name)` (forwarding to a member)."""
    for k in cls.__mro__:
        fn = vars(k).get("__getattr__")
        if fn is None:
            continue
        try:
            import textwrap

            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return None
        me = tree.body[0].args.args[0].arg
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Return) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "getattr"
                and isinstance(node.value.args[0], ast.Attribute)
                and isinstance(node.value.args[0].value, ast.Name) and node.value.args[0].value.id == me
            ):  # fmt: skip
                return node.value.args[0].attr
        return None
    return None


@dataclasses.dataclass(frozen=True)
class Bag:
    """SGLang's runtime config namespace `path` (`_ConfigBag`, from get_spec() etc.): its leaves are
    the ServerArgs fields that SGLang's own declarations (namespace_of) put under that path."""

    path: str


def _bag_path(func) -> str | None:
    """`spec` for a getter whose body returns `...config_bag("spec")`."""
    try:
        import textwrap

        tree = ast.parse(textwrap.dedent(inspect.getsource(_function_of(func))))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "config_bag"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        ):  # fmt: skip
            return node.args[0].value
    return None


_BAG_NAMES: dict[str, set[str]] = {}


def bag_names(path: str) -> set[str]:
    if path not in _BAG_NAMES:
        from sglang.srt.arg_groups.arg_utils import Derived, namespace_of
        from sglang.srt.server_args import ServerArgs

        declared = namespace_of(ServerArgs)  # field -> namespace path
        names = {f for f, p in declared.items() if p == path}
        names |= {p[len(path) + 1 :].split(".")[0] for p in set(declared.values()) if p.startswith(path + ".")}
        for source in getattr(ServerArgs, "_NAMESPACES", ()):
            if getattr(source, "_NS_PATH", None) == path:
                names |= {n for n, d in vars(source).items() if isinstance(d, Derived)}
        # Leaves that publication adds by hand (`spec._set("max_speculative_num_draft_tokens", ...)`).
        import sglang.srt.runtime_context as rc

        for node in ast.walk(ast.parse(inspect.getsource(rc))):
            if (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_set"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == path.split(".")[-1]
                and node.args and isinstance(node.args[0], ast.Constant)
            ):  # fmt: skip
                names.add(node.args[0].value)
        _BAG_NAMES[path] = names
    return _BAG_NAMES[path]


def _parallel_names() -> set[str]:
    from sglang.srt.runtime_context import _parallel_fields

    return set(_parallel_fields())


# Classes whose __getattr__ answers from SGLang's declared configuration, and the function that
# lists what it answers (the same declarations SGLang validates overrides against).
DECLARED_GETATTR = {"sglang.srt.runtime_context.ParallelContext": _parallel_names}


# ---------------------------------------------------------------------------------------------
# The analysis


class Report:
    def __init__(self):
        self.problems: list[dict] = []
        self.calls_bound: list[dict] = []
        self.attrs_checked: list[dict] = []
        self.excluded: dict[str, int] = {}
        self.unresolved: list[dict] = []

    def as_json(self) -> dict:
        return {
            "problems": self.problems,
            "calls_bound": self.calls_bound,
            "attrs_checked": self.attrs_checked,
            "excluded": self.excluded,
            "unresolved": self.unresolved,
        }


class FunctionAnalysis:
    """One pass over one function body, statement by statement, tracking the names' values."""

    def __init__(self, checker: Checker, module, cls, fn: ast.FunctionDef, quiet: bool = False):
        self.checker, self.module, self.cls, self.fn, self.quiet = checker, module, cls, fn, quiet
        self.file = Path(getattr(module, "__file__", "?")).name
        self.env: dict[str, object] = {}
        self.base = self._overridden()
        self._seed_params()

    # -- parameters

    def _overridden(self):
        if self.cls is None:
            return None
        for k in self.cls.__mro__[1:]:
            if self.fn.name in vars(k):
                return _function_of(vars(k)[self.fn.name])
        return None

    def _seed_params(self):
        args = self.fn.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        decorators = {ast.unparse(d) for d in self.fn.decorator_list}
        func_obj = self.checker.function_object(self.module, self.cls, self.fn.name)
        own_hints = getattr(_function_of(func_obj), "__annotations__", {}) if func_obj else {}
        base_hints = getattr(self.base, "__annotations__", {}) if callable(self.base) else {}
        for i, p in enumerate(params):
            value = None
            if i == 0 and self.cls is not None and "staticmethod" not in decorators:
                value = Obj(self.cls) if "classmethod" in decorators else Inst((self.cls,))
            else:
                for hints, mod in ((own_hints, self.module), (base_hints, _module_of(self.base))):
                    classes = resolve_annotation(hints.get(p.arg, inspect.Parameter.empty), mod)
                    if classes:
                        value = Inst(classes)
                        break
                if value is None:
                    value = self.checker.param_types.get((self.module.__name__, self._qualname(), p.arg))
            if value is not None:
                self.env[p.arg] = value

    def _qualname(self) -> str:
        return f"{self.cls.__name__}.{self.fn.name}" if self.cls is not None else self.fn.name

    # -- reporting

    def _where(self, node) -> str:
        return f"{self.file}:{node.lineno}"

    def problem(self, node, what: str, detail: str):
        if not self.quiet:
            self.checker.report.problems.append({"where": self._where(node), "what": what, "problem": detail})

    def unresolved(self, node, what: str, why: str):
        if not self.quiet:
            self.checker.report.unresolved.append({"where": self._where(node), "what": what, "why": why})

    def excluded(self, top: str):
        if not self.quiet:
            self.checker.report.excluded[top] = self.checker.report.excluded.get(top, 0) + 1

    # -- statements

    def run(self):
        for stmt in self.fn.body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt):  # noqa: C901 - one case per statement kind
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.do_import(node)
        elif isinstance(node, ast.Assign):
            value = self.expr(node.value)
            for target in node.targets:
                self.assign(target, value)
        elif isinstance(node, ast.AnnAssign):
            value = self.expr(node.value) if node.value is not None else None
            classes = resolve_annotation(ast.unparse(node.annotation), self.module)
            self.assign(node.target, Inst(classes) if classes else value)
        elif isinstance(node, ast.AugAssign):
            self.expr(node.value)
            self.assign(node.target, None, aug=True)
        elif (
            isinstance(node, ast.For) and isinstance(node.target, ast.Name)
            and isinstance(node.iter, (ast.Tuple, ast.List))
            and all(isinstance(e, ast.Constant) for e in node.iter.elts)
        ):  # fmt: skip
            for element in node.iter.elts:  # `for name in ("a", "b"): getattr(x, name)`: once per constant
                self.env[node.target.id] = Obj(element.value)
                for sub in node.body:
                    self.stmt(sub)
            for sub in node.orelse:
                self.stmt(sub)
        elif isinstance(node, ast.If):
            self.expr(node.test)
            negated = isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
            narrowed = self.isinstance_test(node.test.operand if negated else node.test)
            saved = dict(self.env)
            if narrowed and not negated:
                self.env[narrowed[0]] = narrowed[1]
            for sub in node.body:
                self.stmt(sub)
            if narrowed and not negated:
                self.env = {**self.env, narrowed[0]: saved[narrowed[0]]} if narrowed[0] in saved else self.env
            for sub in node.orelse:
                self.stmt(sub)
            if narrowed and negated and node.body and isinstance(node.body[-1], (ast.Raise, ast.Return)):
                self.env[narrowed[0]] = narrowed[1]  # `if not isinstance(x, C): raise` -> x is a C below
        else:
            for field in ast.iter_child_nodes(node):
                if isinstance(field, ast.stmt):
                    self.stmt(field)
                elif isinstance(field, ast.expr):
                    self.expr(field)
                elif isinstance(field, ast.withitem):
                    self.expr(field.context_expr)
                    if field.optional_vars is not None:
                        self.assign(field.optional_vars, None)
                elif isinstance(field, ast.excepthandler):
                    for sub in field.body:
                        self.stmt(sub)

    def isinstance_test(self, test):
        if (
            isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"
            and len(test.args) == 2 and isinstance(test.args[0], ast.Name)
        ):  # fmt: skip
            cls = self.expr(test.args[1])
            if isinstance(cls, Obj) and isinstance(cls.value, type):
                return test.args[0].id, Inst((cls.value,))
        return None

    def do_import(self, node):
        for alias in node.names:
            try:
                if isinstance(node, ast.ImportFrom):
                    mod = importlib.import_module(node.module)
                    value = getattr(mod, alias.name, _MISSING)
                    if value is _MISSING:
                        value = importlib.import_module(f"{node.module}.{alias.name}")
                    self.env[alias.asname or alias.name] = Obj(value)
                else:
                    mod = importlib.import_module(alias.name)
                    self.env[alias.asname or alias.name.split(".")[0]] = Obj(
                        mod if alias.asname else sys.modules[alias.name.split(".")[0]]
                    )
            except Exception as exc:
                self.problem(node, f"import {alias.name}", f"{type(exc).__name__}: {exc}")

    def assign(self, target, value, aug: bool = False):
        if isinstance(target, ast.Name):
            if aug:
                return
            if value is not None:
                self.env[target.id] = value
            else:
                self.env.pop(target.id, None)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.assign(t, None)
        elif isinstance(target, ast.Attribute):
            owner = self.expr(target.value)
            self.attribute(target, owner, target.attr, store=True)
        elif isinstance(target, ast.Subscript):
            self.expr(target.value)
            self.expr(target.slice)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, None)

    # -- expressions

    def expr(self, node):
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            obj = _lookup(self.module, node.id)
            return None if obj is _MISSING else Obj(obj)
        if isinstance(node, ast.Constant):
            return Obj(node.value)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, self.expr(node.value), node.attr)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, (ast.IfExp, ast.BoolOp)):
            values = [self.expr(v) for v in ((node.body, node.orelse) if isinstance(node, ast.IfExp) else node.values)]
            if isinstance(node, ast.IfExp):
                self.expr(node.test)
            return next((v for v in values if v is not None and v != Obj(None)), None)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return None  # not used by the checked files; their own scopes are not tracked
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.JoinedStr)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)
            return Foreign("builtins")
        foreign = None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                value = self.expr(child)
                if isinstance(value, Inst) and value.classes and not any(_sglang(c) for c in value.classes):
                    value = Foreign(_top_module(value.classes[0]))
                if isinstance(value, Foreign) and foreign is None:
                    foreign = value  # x[i], x + y, -x of a tensor: a tensor
        return foreign

    def attribute(self, node, owner, name: str, store: bool = False, via: str = "attribute"):  # noqa: C901
        what = f"{ast.unparse(node) if not isinstance(node, ast.Call) else ast.unparse(node.args[0]) + '.' + name}"
        if isinstance(owner, Foreign):
            return owner
        if isinstance(owner, Obj):
            value = owner.value
            if (
                isinstance(value, (types.ModuleType, type))
                and _sglang(value)
                or (isinstance(value, types.ModuleType) and value.__name__.split(".")[0] == CHECKED_PACKAGE)
            ):
                found = getattr(value, name, _MISSING)
                self.record_attr(node, what, value, found is not _MISSING, via)
                if found is _MISSING:
                    return None
                return Obj(found)
            found = getattr(value, name, _MISSING)
            return None if found is _MISSING else Obj(found)
        if isinstance(owner, Super):
            mro = owner.cls.__mro__
            for k in mro[1:]:
                if name in vars(k):
                    self.record_attr(node, what, owner.cls, True, via)
                    return self.member(k, name)
            self.record_attr(node, what, owner.cls, False, via)
            return None
        if isinstance(owner, Bag):
            ok = name in bag_names(owner.path)
            self.record_attr(node, what, f"config namespace {owner.path!r}", ok, via, store=store)
            sub = f"{owner.path}.{name}"
            return Bag(sub) if any(p == sub or p.startswith(sub + ".") for p in self.checker.bag_paths()) else None
        if isinstance(owner, Inst):
            classes = [c for c in owner.classes if c is not type(None)]
            checked = [c for c in classes if _sglang(c) or c.__module__ in self.checker.modules]
            if not checked:
                return Foreign(_top_module(classes[0])) if classes else None
            for c in classes:
                if name in defined_names(c):
                    self.record_attr(node, what, checked[0], True, via, store=store)
                    return self.checker.attr_value(c, name)
            searched = [c.__qualname__ for c in checked]
            for c in checked:
                declared = DECLARED_GETATTR.get(f"{c.__module__}.{c.__qualname__}")
                if declared is not None:
                    self.record_attr(node, what, c, name in declared(), via, store=store)
                    return None
                member = delegate_of(c)
                if member is not None and not store:
                    # `__getattr__` forwards to self.<member>: the name must be on the member's class.
                    target = self.checker.attr_value(c, member)
                    if not isinstance(target, Inst):
                        self.unresolved(node, what, f"{c.__qualname__}.__getattr__ forwards to {member}, type unknown")
                        return None
                    for t in target.classes:
                        if name in defined_names(t):
                            self.record_attr(node, what, f"{c.__qualname__} -> {member}: {t.__qualname__}", True, via)
                            return self.checker.attr_value(t, name)
                    searched.append(f"{member}: " + " | ".join(t.__qualname__ for t in target.classes))
                    break
                if dynamic_getattr(c) and not store:
                    self.unresolved(node, what, f"{c.__qualname__} answers attributes with __getattr__")
                    return None
            below = sorted({k.__qualname__ for c in checked for k in _subclasses(c) if name in defined_names(k)})
            if below and not store:
                # The declared type is a base class (e.g. `next_draft_input: SpecInput`); only subclasses
                # have the name. A downcast that the annotations do not show: not decidable here.
                self.unresolved(node, what, f"not on {', '.join(searched)}; only on subclasses {', '.join(below)}")
                return None
            self.record_attr(node, what, " nor ".join(searched), False, via, store=store)
        return None

    def record_attr(self, node, what, cls, ok: bool, via: str, store: bool = False):
        if self.quiet:
            return
        owner = cls if isinstance(cls, str) else getattr(cls, "__qualname__", getattr(cls, "__name__", str(cls)))
        self.checker.report.attrs_checked.append(
            {"where": self._where(node), "what": what, "on": owner, "ok": ok, "store": store, "via": via}
        )
        if not ok:
            kind = "getattr default always taken" if via == "getattr" else "not defined"
            self.problem(node, what, f"{kind}: {owner} (0.5.23, patched) has no attribute {what.rsplit('.', 1)[-1]!r}")

    def member(self, k: type, name: str):
        raw = vars(k)[name]
        if isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
            return Method(raw, k, name)
        if isinstance(raw, property):
            classes = _returns(raw.fget)
            return Inst(classes) if classes else None
        return None

    def call(self, node: ast.Call):
        callee = self.expr(node.func)
        values = [self.expr(a.value if isinstance(a, ast.Starred) else a) for a in node.args]
        kw_values = {k.arg: self.expr(k.value) for k in node.keywords}
        name = ast.unparse(node.func)
        # Builtins with meaning for the analysis.
        if isinstance(callee, Obj) and callee.value is super and not node.args and self.cls is not None:
            return Super(self.cls)
        if isinstance(callee, Obj) and callee.value is getattr and len(node.args) >= 2:
            attr = values[1]
            if isinstance(attr, Obj) and isinstance(attr.value, str):
                return self.attribute(node, values[0], attr.value, via="getattr")
            self.unresolved(node, name, "getattr with a name that is not a known string")
            return None
        if callee is None:
            self.unresolved(node, name, "callee's value or type unknown")
            return None
        if isinstance(callee, Foreign):
            self.excluded(callee.top)
            return callee
        if isinstance(callee, Inst) and not any(_sglang(c) for c in callee.classes):
            self.excluded(_top_module(callee.classes[0]))  # a torch module called
            return Foreign(_top_module(callee.classes[0]))
        target, implicit = self.callable_of(callee)
        if target is None:
            self.unresolved(node, name, f"not a callable SGLang object ({type(callee).__name__})")
            return None
        if not _sglang(_function_of(target)) and not (isinstance(target, type) and _sglang(target)):
            top = _top_module(_function_of(target))
            self.excluded(top)
            return self.result_of(target) or (Foreign(top) if top != "builtins" else None)
        self.bind(node, name, target, implicit, values, kw_values)
        return self.result_of(target)

    def callable_of(self, callee):
        """(the object whose signature applies, how many implicit leading arguments it gets)."""
        if isinstance(callee, Obj):
            v = callee.value
            if isinstance(v, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or callable(v):
                return v, 0
            return None, 0
        if isinstance(callee, Method):
            if isinstance(callee.raw, staticmethod):
                return callee.raw.__func__, 0
            if isinstance(callee.raw, classmethod):
                return callee.raw.__func__, 1
            return callee.raw, 1
        return None, 0

    def result_of(self, target):
        if isinstance(target, type):
            return Inst((target,))
        classes = _returns(target)
        if classes and [c.__name__ for c in classes] == ["_ConfigBag"] and _bag_path(target):
            return Bag(_bag_path(target))
        return Inst(classes) if classes else None

    def bind(self, node: ast.Call, name: str, target, implicit: int, values, kw_values):
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError) as exc:
            self.unresolved(node, name, f"no signature: {exc}")
            return
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        dstarred = any(k.arg is None for k in node.keywords)
        positional = ["<self>"] * implicit + [
            f"<arg{i}>" for i, a in enumerate(node.args) if not isinstance(a, ast.Starred)
        ]
        keywords = {k.arg: f"<{k.arg}>" for k in node.keywords if k.arg is not None}
        try:
            bound = (sig.bind_partial if starred or dstarred else sig.bind)(*positional, **keywords)
        except TypeError as exc:
            params = sig.parameters
            unknown = (
                []
                if any(p.kind == p.VAR_KEYWORD for p in params.values())
                else [k for k in keywords if k not in params or params[k].kind == params[k].POSITIONAL_ONLY]
            )
            detail = f"unknown keyword(s) {unknown}; " if unknown else ""
            self.problem(node, name, f"{detail}{exc} (signature {self.qual(target)}{sig})")
            bound = None
        if not self.quiet:
            self.checker.report.calls_bound.append(
                {"where": self._where(node), "callee": self.qual(target), "ok": bound is not None,
                 "partial": starred or dstarred}
            )  # fmt: skip
        if bound is not None:
            self.propagate(target, sig, node, implicit, values, kw_values)
        if starred or dstarred:
            self.forwarded(node, name, target, sig, implicit)

    def forwarded(self, node, name, target, sig, implicit):
        """`f(..., *args, **kwargs)` forwarding an override's own *args/**kwargs: the callee must take
        whatever the overridden base method takes beyond the override's named parameters."""
        a = self.fn.args
        var, kw = (a.vararg.arg if a.vararg else None), (a.kwarg.arg if a.kwarg else None)
        fwd_var = any(
            isinstance(x, ast.Starred) and isinstance(x.value, ast.Name) and x.value.id == var for x in node.args
        )
        fwd_kw = any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kw for k in node.keywords)
        if not (fwd_var or fwd_kw) or not callable(self.base):
            return
        own = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        base_params = list(inspect.signature(self.base).parameters.values())[1:]  # without self
        rest = [p for p in base_params if p.name not in own and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        positional = ["<self>"] * implicit + [
            f"<arg{i}>" for i, x in enumerate(node.args) if not isinstance(x, ast.Starred)
        ]
        keywords = {k.arg: f"<{k.arg}>" for k in node.keywords if k.arg is not None}
        forms = []
        if fwd_kw:
            forms.append(("by keyword", positional, {**keywords, **{p.name: f"<{p.name}>" for p in rest}}))
        if fwd_var:
            pos_rest = [p for p in rest if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            forms.append(("by position", positional + [f"<{p.name}>" for p in pos_rest], keywords))
        base_name = f"{self.base.__qualname__}"
        for how, pos, kws in forms:
            try:
                sig.bind(*pos, **kws)
                ok = True
            except TypeError as exc:
                ok = False
                self.problem(
                    node, name,
                    f"forwards {base_name}'s parameters {[p.name for p in rest]} {how}: {exc} "
                    f"(signature {self.qual(target)}{sig})",
                )  # fmt: skip
            if not self.quiet:
                self.checker.report.calls_bound.append(
                    {"where": self._where(node), "callee": f"{self.qual(target)} <- {base_name} {how}", "ok": ok,
                     "partial": False}
                )  # fmt: skip

    def propagate(self, target, sig, node, implicit, values, kw_values):
        """Arguments' values at a call of a function of the checked modules type its parameters."""
        func = _function_of(target)
        mod = _module_of(func)
        if mod is None or mod.__name__ not in self.checker.modules:
            return
        positional = [None] * implicit + [
            v for a, v in zip(node.args, values, strict=True) if not isinstance(a, ast.Starred)
        ]
        keywords = {k: v for k, v in kw_values.items() if k is not None}
        try:
            bound = sig.bind_partial(*range(len(positional)), **{k: k for k in keywords})
        except TypeError:
            return
        qual = func.__qualname__
        for pname, token in bound.arguments.items():
            value = positional[token] if isinstance(token, int) else keywords.get(token)
            constant = isinstance(value, Obj) and isinstance(value.value, (str, bytes, int, float, bool, type(None)))
            if isinstance(value, (Inst, Obj, Bag)) and not constant:
                self.checker.param_types.setdefault((mod.__name__, qual, pname), value)

    @staticmethod
    def qual(target) -> str:
        func = _function_of(target)
        return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


class Checker:
    def __init__(self, modules: list[str]):
        self.modules = modules
        self.param_types: dict[tuple[str, str, str], object] = {}
        self.report = Report()
        self._attr_values: dict[tuple[type, str], object] = {}

    def bag_paths(self) -> set[str]:
        from sglang.srt.arg_groups.arg_utils import namespace_of
        from sglang.srt.server_args import ServerArgs

        return set(namespace_of(ServerArgs).values())

    def function_object(self, module, cls, name):
        owner = cls if cls is not None else module
        return vars(owner).get(name) if owner is not None else None

    def attr_value(self, cls: type, name: str):
        key = (cls, name)
        if key in self._attr_values:
            return self._attr_values[key]
        self._attr_values[key] = None  # breaks cycles
        value = self._attr_value(cls, name)
        self._attr_values[key] = value
        return value

    def _attr_value(self, cls: type, name: str):
        for k in cls.__mro__:
            if name in vars(k) and not isinstance(vars(k)[name], (type(None), int, float, str, bool)):
                raw = vars(k)[name]
                if isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
                    return Method(raw, k, name)
                if isinstance(raw, property):
                    classes = _returns(raw.fget)
                    return Inst(classes) if classes else None
            ann = vars(k).get("__annotations__", {}).get(name)
            if ann is not None:
                classes = resolve_annotation(ann, _module_of(k))
                if classes:
                    return Inst(classes)
        for k in cls.__mro__:
            for fn, value in _self_assignments(k).get(name, []):
                if isinstance(value, ast.AnnAssign):
                    classes = resolve_annotation(ast.unparse(value.annotation), _module_of(k))
                    if classes:
                        return Inst(classes)
                    value = value.value
                if value is None:
                    continue
                try:  # SGLang's own method, read quietly: whatever it does that is not modelled, skip it
                    quiet = FunctionAnalysis(self, _module_of(k), k, fn, quiet=True)
                    for stmt in fn.body:  # the names the value refers to (imports, locals) as far as known
                        if any(n is value for n in ast.walk(stmt)):
                            break
                        quiet.stmt(stmt)
                    got = quiet.expr(value)
                except Exception:
                    continue
                if isinstance(got, (Inst, Foreign)) or isinstance(got, Obj) and got.value is not None:
                    return got
        return None

    def functions(self):
        for name in self.modules:
            module = importlib.import_module(name)
            tree = ast.parse(inspect.getsource(module))
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield module, None, node
                elif isinstance(node, ast.ClassDef):
                    cls = getattr(module, node.name)
                    for sub in node.body:
                        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            yield module, cls, sub

    def run(self) -> dict:
        functions = list(self.functions())
        for _ in range(8):  # argument types flow into the callees' parameters: to a fixed point
            before = dict(self.param_types)
            for module, cls, fn in functions:
                FunctionAnalysis(self, module, cls, fn, quiet=True).run()
            if self.param_types == before:
                break
        for module, cls, fn in functions:
            FunctionAnalysis(self, module, cls, fn).run()
        out = self.report.as_json()
        out["param_types"] = {f"{m}:{q}({p})": _describe(v) for (m, q, p), v in sorted(self.param_types.items())}
        return out


def _describe(value) -> str:
    if isinstance(value, Inst):
        return " | ".join(c.__qualname__ for c in value.classes)
    if isinstance(value, Obj):
        return f"object {getattr(value.value, '__qualname__', type(value.value).__name__)}"
    return repr(value)


# ---------------------------------------------------------------------------------------------
# The child process: build/cpu-venv with the patched wheel on PYTHONPATH


def construct_verify_input() -> dict:
    """Run `DDTreeVerifyInput.from_layout` (the dataclass construction, EagleVerifyInput's __post_init__,
    the FULL_MASK custom mask) and `set_accepted_nodes` on a CPU tree: root + a 2-node chain,
    prefix 5. Returns what came out, or the error."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput
    from sglang.srt.speculative.ddtree_tree import DDTreeLayout

    i64 = dict(dtype=torch.int64)
    try:
        layout = DDTreeLayout(
            parents=torch.tensor([[-1, 0]], **i64), depths=torch.tensor([[1, 2]], **i64),
            scores=torch.tensor([[-0.1, -0.3]]), node_tokens=torch.tensor([[11, 12]], **i64),
            num_nodes=torch.tensor([2], dtype=torch.int32), verify_tokens=torch.tensor([[10, 11, 12]], **i64),
            positions=torch.tensor([[5, 6, 7]], **i64), retrieve_parent_token=torch.tensor([[-1, 0, 1]], **i64),
            retrieve_next_token=torch.tensor([[1, 2, -1]], **i64),
            retrieve_next_sibling=torch.tensor([[-1, -1, -1]], **i64),
            tree_mask=torch.tril(torch.ones(1, 3, 3, dtype=torch.bool)),
        )  # fmt: skip
        vi = DDTreeVerifyInput.from_layout(
            layout, seq_lens=torch.tensor([5]), tree_depth=2, topk_cap=1, full_mask=True,
            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=5,
        )  # fmt: skip
        node = vi.set_accepted_nodes(torch.tensor([[0, 1, -1]]), torch.tensor([2]))
        return {
            "draft_token_num": vi.draft_token_num, "num_tokens_per_req": vi.num_tokens_per_req,
            "max_tree_depth": vi.max_tree_depth, "tree_topk": vi.tree_topk, "is_ddtree": vi.is_ddtree,
            "custom_mask_numel": int(vi.custom_mask.numel()), "custom_mask_true": int(vi.custom_mask.sum()),
            "accepted_node_index": node.tolist(), "spec_input_type": str(vi.spec_input_type),
        }  # fmt: skip
    except Exception as exc:
        import traceback

        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}


def src_first(src_root: Path) -> None:
    """Make every package that src/ adds files to find them in src/ first (the installed wheel's copies
    are the same bytes; the test reads the ones in the repository)."""
    for folder in sorted({p.parent for p in src_root.rglob("*.py")}):
        package = ".".join(folder.relative_to(src_root).parts)
        mod = importlib.import_module(package)
        mod.__path__ = [str(folder), *(p for p in mod.__path__ if p != str(folder))]  # also namespace packages


# Upstream modules the series edits (and that AR / DFLASH servers import).
EDITED_UPSTREAM = (
    "sglang.srt.arg_groups.field_order", "sglang.srt.arg_groups.fields.spec",
    "sglang.srt.arg_groups.speculative_hook", "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.dflash_worker_v2", "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.layers.attention.linear.kda_backend", "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.layers.attention.linear.gdn_backend",
)  # fmt: skip


def trace_non_ddtree_paths(src_root: Path, lines: dict[str, list[str]]) -> dict:
    """What of src/ the AR / DFLASH paths load and call (nothing, if the guards hold); DDTREE last."""
    import logging

    src_first(src_root)
    files = {str(p.resolve()) for p in src_root.rglob("*.py")}

    def loaded() -> list[str]:
        where = {n: str(Path(getattr(m, "__file__", None) or ".").resolve()) for n, m in list(sys.modules.items())}
        return sorted(n for n, f in where.items() if f in files)

    out: dict = {"before": loaded()}
    failed = {}
    for name in EDITED_UPSTREAM:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an import that needs the GPU stack: reported, not hidden
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    out["import_failed"] = failed
    out["after_upstream_imports"] = loaded()
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    for name, argv in lines.items():
        entered: set[str] = set()

        def profile(frame, event, _arg, entered=entered):
            if event == "call" and frame.f_code.co_filename in files:
                entered.add(f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}")

        sys.setprofile(profile)
        try:
            args = prepare_server_args(argv)
            handle_speculative_decoding(args)
            view = resolving_view(args)
            result = {"algorithm": view.speculative_algorithm,
                      "state_forking": view.speculative_ddtree_state_forking, "topk": view.speculative_ddtree_topk,
                      "tree_conv": view.speculative_ddtree_tree_conv}
        except Exception as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        finally:
            sys.setprofile(None)
        out[name] = {**result, "entered": sorted(entered), "loaded": loaded()}

    from sglang.srt.speculative import ddtree_state_fork as fork

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    fork.logger.addHandler(Keep())
    out["hybrid_forking"] = {
        "off_target": [fork.hybrid_forking(False, "DDTREE", "off"), list(records)],
        "off_draft": [fork.hybrid_forking(True, "DDTREE", "off"), list(records)],
        "on_target": [fork.hybrid_forking(False, "DDTREE", "on"), list(records)],
        "dflash": [fork.hybrid_forking(False, "DFLASH", None), list(records)],
    }
    return out


def main(argv: list[str]) -> int:
    import torchvision_standin  # beside this file, so on sys.path when it runs as a script

    torchvision_standin.install()
    if argv[:1] == ["--trace"]:
        print(json.dumps(trace_non_ddtree_paths(Path(argv[1]), json.loads(argv[2]))))
        return 0
    if argv[:1] == ["--src"]:
        src_first(Path(argv[1]))
        argv = argv[2:]
    modules = []
    for arg in argv:
        if arg.endswith(".py"):  # a snippet (the self-test): imported as a module from its folder
            sys.path.insert(0, str(Path(arg).parent))
            arg = Path(arg).stem
        importlib.import_module(arg)
        modules.append(arg)
    out = Checker(modules).run()
    out["files"] = {m: sys.modules[m].__file__ for m in modules}
    if "sglang.srt.speculative.ddtree_info" in modules:
        out["constructed"] = construct_verify_input()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":  # the checker half ends here; the child exits before the pytest half
    raise SystemExit(main(sys.argv[1:]))


# ---------------------------------------------------------------------------------------------
# The pytest half

import os  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402
from test_patched_cli import cpu_python, ddtree_line, dflash_line, downloads, install, models  # noqa: E402, F401

from sgdeploy import patchset, wheel  # noqa: E402

pytestmark = pytest.mark.slow
SRC = patchset.DEFAULT_PATCHES_DIR / patchset.SRC_NAME

SNIPPET = """
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.eagle_worker_common import run_eagle_verify


def wrong_keyword(batch, worker):
    return run_eagle_verify(
        batch, target_worker=worker, req_to_token_pool=None, token_to_kv_pool_allocator=None, plan_stream=None,
        plan_stream_ctx=None, topk=2, num_draft_token=16, device="cuda", metadata_ready_pre_pad=False,
        finalize_tree_path=True,
    )


class Worker(DFlashWorkerV2):
    def wrong_count(self, plan):
        return self._draft_write_ids(plan, plan)

    def missing_method(self):
        return self._no_such_helper()
"""


@pytest.fixture(scope="session")
def patched_site(tmp_path_factory, downloads) -> Path:  # noqa: F811  (test_patched_cli's fixture)
    series = patchset.load()
    if "ddtree" not in series.features():
        pytest.skip(f"{series.path} has no ddtree patch yet")
    out = tmp_path_factory.mktemp("wheels")
    built = wheel.build(series.select(series.features()), "3.11", out, downloads, log=lambda m: None)
    return install(built, tmp_path_factory.mktemp("patched-site"))


@pytest.fixture(scope="session")
def checked(cpu_python, patched_site, tmp_path_factory) -> dict:  # noqa: F811
    snippet = tmp_path_factory.mktemp("snippet") / "ddtree_plumbing_snippet.py"
    snippet.write_text(SNIPPET)
    env = dict(os.environ, PYTHONPATH=str(patched_site), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [cpu_python, __file__, "--src", str(SRC), *DDTREE_MODULES, str(snippet)],
        capture_output=True, text=True, env=env, timeout=900, cwd=patched_site,
    )  # fmt: skip
    assert proc.returncode == 0, f"the checker failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _in(entries: list[dict], files: tuple[str, ...]) -> list[dict]:
    return [e for e in entries if e["where"].split(":")[0] in files]


DDTREE_FILES = tuple(f"{m.rsplit('.', 1)[1]}.py" for m in DDTREE_MODULES)


def test_ddtree_calls_and_attributes_match_sglang_0_5_23(checked):
    problems = _in(checked["problems"], DDTREE_FILES)
    calls = _in(checked["calls_bound"], DDTREE_FILES)
    attrs = _in(checked["attrs_checked"], DDTREE_FILES)
    summary = (
        f"{len(calls)} calls bound, {len(attrs)} attributes checked, excluded {checked['excluded']}, "
        f"{len(_in(checked['unresolved'], DDTREE_FILES))} unresolved"
    )
    assert not problems, summary + "\n" + "\n".join(f"{p['where']}: {p['what']}: {p['problem']}" for p in problems)
    # The analysis reached the SGLang API it exists to check (a checker that typed nothing would pass).
    callees = {c["callee"] for c in calls}
    for needed in ("run_eagle_verify", "DDTreeVerifyInput", "ForwardBatch", "GenerationBatchResult"):
        assert any(needed in c for c in callees), f"no call to {needed} was bound: {summary}"
    assert len(calls) >= 20 and len(attrs) >= 50, summary


def test_checker_reports_a_wrong_keyword_a_wrong_count_and_a_missing_method(checked):
    problems = _in(checked["problems"], ("ddtree_plumbing_snippet.py",))
    text = "\n".join(f"{p['where']}: {p['what']}: {p['problem']}" for p in problems)
    assert any("run_eagle_verify" in p["what"] and "num_draft_token" in p["problem"] for p in problems), text
    assert any("_draft_write_ids" in p["what"] and "too many positional" in p["problem"] for p in problems), text
    assert any("_no_such_helper" in p["what"] and "not defined" in p["problem"] for p in problems), text
    assert len(problems) == 3, text


def test_ddtree_verify_input_is_built_on_the_cpu(checked):
    """`from_layout` constructs the dataclass (EagleVerifyInput's fields and __post_init__) with the
    arguments the worker passes; root + a 2-node chain after a prefix of 5."""
    got = checked["constructed"]
    assert "error" not in got, got.get("traceback", got)
    assert got["draft_token_num"] == 3 and got["num_tokens_per_req"] == 3
    assert got["max_tree_depth"] == 3 and got["tree_topk"] == -1 and got["is_ddtree"] is True
    # FULL_MASK: per request [T, prefix + T] = 3 x 8; the prefix columns and the 3 x 3 ancestor mask.
    assert got["custom_mask_numel"] == 24 and got["custom_mask_true"] == 15 + 6
    assert got["accepted_node_index"] == [1]


def test_ddtree_modules_are_imported_from_the_repository(checked):
    for module, file in checked["files"].items():
        if module in DDTREE_MODULES:
            assert Path(file).resolve() == (SRC / (module.replace(".", "/") + ".py")).resolve(), (module, file)


AR_LINE = ["--model-path", "MODELS/target", "--host", "127.0.0.1", "--port", "30000", "--tp-size", "1",
           "--device", "cuda", "--attention-backend", "triton", "--page-size", "1"]


@pytest.fixture(scope="session")
def traced(cpu_python, patched_site, models) -> dict:  # noqa: F811
    lines = {"AR": [a.replace("MODELS", str(models)) for a in AR_LINE], "DFLASH": dflash_line(models),
             "DDTREE": ddtree_line(models, 15, 8, "--speculative-ddtree-state-forking", "off")}
    env = dict(os.environ, PYTHONPATH=str(patched_site), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [cpu_python, __file__, "--trace", str(SRC), json.dumps(lines)],
        capture_output=True, text=True, env=env, timeout=900, cwd=patched_site,
    )  # fmt: skip
    assert proc.returncode == 0, f"the trace failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ar_and_dflash_paths_do_not_enter_ddtree_code(traced):
    assert traced["import_failed"] == {}, traced["import_failed"]
    # Importing every upstream module the series edits loads nothing of src/.
    assert traced["after_upstream_imports"] == [], traced["after_upstream_imports"]
    for name in ("AR", "DFLASH"):
        got = traced[name]
        assert "error" not in got, got
        assert got["entered"] == [] and got["loaded"] == [], (name, got)
        assert got["state_forking"] is None and got["topk"] is None and got["tree_conv"] is None, (name, got)
    assert traced["DFLASH"]["algorithm"] == "DFLASH"
    # The control: the same trace sees a DDTREE line go through src/ (so an empty trace means something).
    ddtree = traced["DDTREE"]
    assert "ddtree_hook.py:handle_ddtree" in ddtree["entered"], ddtree
    assert ddtree["state_forking"] == "off" and ddtree["topk"] == "fused" and ddtree["tree_conv"] == "parents", ddtree


def test_forking_off_on_a_hybrid_target_warns_why_it_is_lossy(traced):
    got = traced["hybrid_forking"]
    on, logged = got["off_target"]
    assert on is False and len(logged) == 1, got
    assert "lossy" in logged[0] and "sibling tree nodes share one recurrent state" in logged[0], logged[0]
    assert got["off_draft"] == [False, logged], "the draft model's backend warns too"
    assert got["on_target"] == [True, logged] and got["dflash"] == [False, logged], got
