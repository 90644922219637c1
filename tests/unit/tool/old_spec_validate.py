"""The config validator as it was before issue 35 (sgdeploy/spec.py's `validate` and its schema tables, frozen).

The reference of tests/unit/tool/test_config_model.py only: the pydantic models of sgdeploy.config_model must
give the same problem lines, in the same order, and the same Config. Not used by sgdeploy. Copied from
sgdeploy/spec.py at commit 0ff3a46 (the loading, merging and YAML output left out; the typed classes are
sgdeploy.spec's own, so that the Configs compare equal).
"""
# ruff: noqa

from __future__ import annotations

import ipaddress
import re
import unicodedata
from pathlib import Path
from typing import Any

import yaml

from sgdeploy import gate_schema
from sgdeploy.spec import Config, ConfigError, Drafter, Gates, Model, Serving, Speculative

REPO_ROOT = Path(__file__).resolve().parents[3]
ALGORITHMS = ("NONE", "DFLASH", "DDTREE")
ATTENTION_BACKENDS = ("triton", "flashinfer", "fa3", "torch_native", "flex_attention")
# Largest budget the project accepts in a config. The memory rule (sgdeploy.budget) can lower it
# per model and card; 256 nodes is already far past the measured acceptance plateau.
MAX_BUDGET = 256
MAX_TOPK_CAP = 16
FEATURE_ORDER = ("ddtree", "fork", "topk")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where a model's weights come from (docs/models.md).
MODEL_SOURCES = ("hf", "path", "controller")
HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Strings that reach a unit file, an env file or a host's command line (docs/configs.md, "Strings"):
# a model folder on the host, and the longest description the unit's header comment takes.
HOST_PATH_RE = re.compile(r"^/[A-Za-z0-9._+@=,/-]*$")
MAX_DESCRIPTION = 200
# The fields each source takes (besides `source`; the model's recurrent_layers always).
SOURCE_FIELDS = {"hf": ("path", "revision", "allow_patterns"), "path": ("path",),
                 "controller": ("controller_path", "version")}

# --------------------------------------------------------------------------------------------------
# Schema. Each leaf: (kind, default, extra). kind: str, bool, int, float, ip, list[int], list[str],
# map[str], choice. A default of REQUIRED means the field must be given.

REQUIRED = object()
ABSENT = object()

# Where a model's weights come from (docs/models.md); shared by the target model and the drafter.
WEIGHTS_SCHEMA: dict[str, Any] = {
    "source": ("choice", "hf", MODEL_SOURCES),
    "path": ("str", None),
    "revision": ("str", None),
    "controller_path": ("str", None),
    "version": ("str", None),
    "allow_patterns": ("list[str]", None),
}

SCHEMA: dict[str, Any] = {
    "extends": ("str", None),
    "description": ("str", ""),
    "model": {**WEIGHTS_SCHEMA, "recurrent_layers": ("bool", REQUIRED)},
    "drafter": dict(WEIGHTS_SCHEMA),
    "speculative": {
        "algorithm": ("choice", "NONE", ALGORITHMS),
        "block_size": ("int", None),
        "budget": ("int", None),
        "topk_cap": ("int", None),
        "state_forking": ("bool", None),
        "fused_topk": ("bool", None),
        "reproduce_state_leak": ("bool", None),
    },
    "serving": {
        "gpus": ("list[int]", [0]),
        "tp_size": ("int", 1),
        "host": ("ip", "127.0.0.1"),
        "port": ("int", 30000),
        "nccl_port": ("int", None),
        "attention_backend": ("choice", REQUIRED, ATTENTION_BACKENDS),
        "mem_fraction_static": ("float", 0.85),
        "max_running_requests": ("int", None),
        "extra_args": ("list[str]", []),
        "env": ("map[str]", {}),
        "start_timeout_s": ("int", 1800),
        "stop_timeout_s": ("int", 600),
        "drain_timeout_s": ("int", 300),
        "forking_memory_gib": ("float", None),
        "replicas": ("int", 1),
        "router": ("bool", None),
        "api_key_secret": ("str", None),
    },
    # The gates section is defined once, in sgdeploy.gate_schema (the gate reads the same definition).
    "gates": {key: (f.kind, f.default) for key, f in gate_schema.FIELDS.items()},
}

SPEC_FIELDS_BY_ALGORITHM = {
    "NONE": set(),
    "DFLASH": {"block_size"},
    "DDTREE": {"block_size", "budget", "topk_cap", "state_forking", "fused_topk", "reproduce_state_leak"},
}

# What extra_args may not set, by SGLang's field (dest), whatever the spelling (alias, unique prefix,
# --flag=value; sgdeploy.sglang_flags resolves them with SGLang 0.5.23's own parser table):
# the fields the config sets, the secrets (never in argv: serving.api_key_secret), and --config (a
# file of options that could set any of them).
MANAGED_DESTS = {
    "model_path": "set from model.*", "tp_size": "set from serving.tp_size", "host": "set from serving.host",
    "port": "set from serving.port", "nccl_port": "set from serving.nccl_port",
    "attention_backend": "set from serving.attention_backend",
    "mem_fraction_static": "set from serving.mem_fraction_static",
    "max_running_requests": "set from serving.max_running_requests",
    "revision": "the weights are a local folder placed before the switch (model.revision)",
    "speculative_algorithm": "set from speculative.algorithm",
    "speculative_draft_model_path": "set from drafter.*",
    "speculative_dflash_block_size": "set from speculative.block_size",
    "speculative_ddtree_budget": "set from speculative.budget",
    "speculative_ddtree_topk_cap": "set from speculative.topk_cap",
    "speculative_ddtree_state_forking": "set from speculative.state_forking",
    "speculative_ddtree_topk": "set from speculative.fused_topk",
    "api_key": "a secret never goes on the command line (the unit file, ps and the journal show it): name its "
               "key in the inventory's sglang_secret_env with serving.api_key_secret",
    "admin_api_key": "a secret never goes on the command line (the unit file, ps and the journal show it)",
    "ssl_keyfile_password": "a secret never goes on the command line (the unit file, ps and the journal show it)",
    "config": "a file of options could set any of the managed ones; give the flags themselves",
}
# Environment names serving.env may not set: the unit sets them (the env file would override its
# Environment= lines), they change what code or libraries the service loads, or which GPUs and
# which Hugging Face cache it uses, or they are secrets (the inventory's sglang_secret_env holds those).
MANAGED_ENV = {
    "CUDA_VISIBLE_DEVICES": "set from serving.gpus", "NVIDIA_VISIBLE_DEVICES": "set from serving.gpus",
    "CUDA_DEVICE_ORDER": "serving.gpus are indices in the driver's order",
    "CUDA_HOME": "set by the unit", "PATH": "set by the unit", "HOME": "set by the unit",
    "USER": "set by systemd", "SHELL": "set by systemd",
    "HF_HOME": "set by the unit (the service's Hugging Face cache)", "HF_HUB_CACHE": "set by the unit (HF_HOME)",
    "TRANSFORMERS_CACHE": "set by the unit (HF_HOME)", "HF_HUB_OFFLINE": "set by the unit: the service never "
    "reaches the Hub (the models role places the weights)", "TRANSFORMERS_OFFLINE": "the service never reaches the "
    "Hub", "HF_DATASETS_OFFLINE": "the service never reaches the Hub", "HF_ENDPOINT": "the service never reaches "
    "the Hub", "HF_TOKEN": "a secret: the inventory's sglang_secret_env", "HUGGING_FACE_HUB_TOKEN": "a secret: the "
    "inventory's sglang_secret_env", "PYTHONUNBUFFERED": "set by the unit",
}
# Prefixes of the same kind: the dynamic loader (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...), the
# interpreter (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, ...) and sgdeploy's own.
MANAGED_ENV_PREFIXES = {
    "LD_": "the dynamic loader's settings change what code the service runs",
    "PYTHON": "the interpreter's settings change what code the service runs",
    "SGDEPLOY_": "sgdeploy's own",
}
# A config's longest unit name is sglang-<name>-r<i>.service (i up to MAX_REPLICAS - 1); a file name
# holds 255 bytes, and tools write temporary files beside the unit whose names add about 20 (Ansible's
# .ansible_tmp prefix and random part). Names longer than this would validate and fail at the deploy.
MAX_NAME = 200
# Names another unit of the project takes: the router's (sglang-router-<port>.service, a config named
# router-<port> would write over it) and a replica's (sglang-<config>-r<i>.service, env file and state
# folder <config>-r<i>).
RESERVED_NAME_RES = (
    (re.compile(r"^router(-|$)"), "names starting with 'router-' are the routers' "
                                  "(sglang-router-<port>.service): pick another name"),
    (re.compile(r"-r[0-9]+$"), "names ending in -r<number> are the replicas' (sglang-<config>-r<i>.service, "
                               "/etc/sglang/<config>-r<i>.env): pick another name"),
)


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


# --------------------------------------------------------------------------------------------------
# Validation


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The kinds of leaf that are one type test: kind → (test, what is allowed).
_PLAIN_KINDS: dict[str, tuple[Any, str]] = {
    "str": (lambda value: isinstance(value, str) and bool(value), "must be a non-empty string"),
    "bool": (lambda value: isinstance(value, bool), "must be true or false"),
    "int": (_whole, "must be a whole number"),
    "float": (lambda value: not isinstance(value, bool) and isinstance(value, (int, float)), "must be a number"),
    "list[int]": (lambda value: isinstance(value, list) and all(_whole(v) for v in value),
                  "must be a list of whole numbers"),
    "list[str]": (lambda value: isinstance(value, list) and all(isinstance(v, str) for v in value),
                  "must be a list of strings"),
}


class _Checker:
    def __init__(self, source: Path):
        self.source = source
        self.problems: list[str] = []

    def bad(self, path: str, value: Any, allowed: str) -> None:
        shown = "missing" if value is ABSENT else _fmt(value)
        self.problems.append(f"{self.source}: {path}: {shown}: {allowed}")

    def leaf(self, path: str, value: Any, spec: tuple) -> Any:
        kind, default = spec[0], spec[1]
        if value is ABSENT or value is None:
            if default is REQUIRED:
                self.bad(path, ABSENT, "required")
                return None
            return default() if callable(default) else default
        if kind in _PLAIN_KINDS:
            ok, allowed = _PLAIN_KINDS[kind]
            if not ok(value):
                return self.bad(path, value, allowed)
            return float(value) if kind == "float" else value
        if kind == "choice":
            if value not in spec[2]:
                return self.bad(path, value, f"must be one of {', '.join(spec[2])}")
            return value
        if kind == "ip":
            try:
                ipaddress.ip_address(str(value))
            except ValueError:
                return self.bad(path, value, "must be an IP address (e.g. 127.0.0.1 for loopback only)")
            return str(value)
        if kind == "map[str]":
            return self.env_map(path, value)
        raise AssertionError(kind)

    def env_map(self, path: str, value: Any) -> dict[str, str] | None:
        """A mapping of environment variable NAME: value, each value a string (true/false in lower case)."""
        if not isinstance(value, dict):
            return self.bad(path, value, "must be a mapping of NAME: value")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
                self.bad(f"{path}.{_key(k)}", k, "environment variable names are letters, digits and _")
            elif isinstance(v, (dict, list)) or v is None:
                self.bad(f"{path}.{k}", v, "must be a string, number or boolean")
            else:
                out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def section(self, path: str, data: Any, schema: dict[str, Any]) -> dict[str, Any]:
        if data is ABSENT or data is None:
            data = {}
        if not isinstance(data, dict):
            self.bad(path, data, "must be a mapping")
            data = {}
        for key in data:
            if key not in schema:
                hint = _close_match(str(key), schema)
                self.bad(f"{path}.{_key(key)}" if path else _key(key), data[key],
                         f"unknown field{hint}; allowed: {', '.join(schema)}")
        out: dict[str, Any] = {}
        for key, spec in schema.items():
            sub = f"{path}.{key}" if path else key
            value = data.get(key, ABSENT)
            if isinstance(spec, dict):
                out[key] = None if value is ABSENT and key == "drafter" else self.section(sub, value, spec)
            else:
                out[key] = self.leaf(sub, value, spec)
        return out


def _key(key: Any) -> str:
    """A mapping key as a field path shows it: as written, or quoted when it is not one plain line."""
    text = str(key)
    return text if text.isprintable() else repr(text)


def _close_match(key: str, schema: dict[str, Any]) -> str:
    import difflib

    match = difflib.get_close_matches(key, list(schema), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _check_forking_memory(chk: _Checker, model: dict, spec: dict, serving: dict) -> None:
    """The budget memory rule (sgdeploy.budget): with state forking on, every tree node of every
    running request holds its own recurrent state, so the budget is bounded by the memory left
    after weights and KV cache. Checked when the config says how much that is."""
    gib = serving.get("forking_memory_gib")
    if gib is None:
        return
    if gib <= 0:
        chk.bad("serving.forking_memory_gib", gib, "must be above 0 (GiB per GPU left for the forking buffers)")
        return
    if spec.get("algorithm") != "DDTREE" or not spec.get("state_forking") or not isinstance(spec.get("budget"), int):
        return
    from sgdeploy import budget as budget_rule

    shape = budget_rule.shape_for_model(str(model.get("path")))
    if shape is None:
        known = ", ".join(budget_rule.KNOWN_SHAPES)
        chk.bad("serving.forking_memory_gib", gib, f"the recurrent shape of model {model.get('path')!r} is not "
                f"known to sgdeploy.budget (known: {known}); add it there or leave this field out")
        return
    requests = serving.get("max_running_requests")
    if not isinstance(requests, int) or requests < 1:
        chk.bad("serving.max_running_requests", requests, "required with serving.forking_memory_gib: the forking "
                "buffers grow with the number of running requests")
        return
    tp = serving.get("tp_size") if isinstance(serving.get("tp_size"), int) else 1
    try:
        largest = budget_rule.max_ddtree_budget(shape, max_running_requests=requests,
                                                memory_left_bytes=int(gib * 2**30), tp_size=tp)
        need = budget_rule.forking_buffer_bytes(shape, spec["budget"], requests, tp) / 2**30
    except ValueError as exc:
        chk.bad("serving.tp_size", tp, str(exc))
        return
    if largest is not None and spec["budget"] > largest:
        chk.bad("speculative.budget", spec["budget"],
                f"the forking buffers of {model.get('path')} at {requests} running request(s) need {need:.1f} GiB "
                f"per GPU, serving.forking_memory_gib allows {gib:g}: the largest budget that fits is {largest}")


# --------------------------------------------------------------------------------------------------
# Strings that reach a unit, an env file or a shell on the host


def _control_characters(text: str) -> list[str]:
    """The characters of `text` that end a line or a shell word, or that a terminal acts on:
    newline, carriage return, NUL, tab, escape, the Unicode line and paragraph separators."""
    return sorted({c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def _one_line(chk: _Checker, path: str, value: Any, what: str) -> bool:
    """False (and a problem naming the characters) when a string holds a control character."""
    if not isinstance(value, str):
        return True
    bad = _control_characters(value)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        chk.bad(path, value, f"{what}: one line of printable text, without newline, tab or other control "
                             f"characters (found {shown})")
        return False
    return True


def _check_strings(chk: _Checker, v: dict[str, Any]) -> None:
    """Every config string that reaches the unit, the env file or a command on the host: one line
    of printable text, and paths without `..`. The unit template and render quote what remains
    (`%`, `$`, quotes, backslashes, spaces), so a value is always one argument or one comment."""
    desc = v["description"]
    if _one_line(chk, "description", desc, "the description goes into the unit's header comment") and \
            isinstance(desc, str) and len(desc) > MAX_DESCRIPTION:
        chk.bad("description", desc, f"at most {MAX_DESCRIPTION} characters (it goes into the unit's header comment)")
    serving = v["serving"]
    for i, arg in enumerate(serving["extra_args"] or []):
        where = f"serving.extra_args[{i}]"
        if _one_line(chk, where, arg, "each is one argument of the unit's ExecStart") and arg == "":
            chk.bad(where, arg, "an argument of the unit's ExecStart: must not be empty")
    for key, value in (serving["env"] or {}).items():
        _one_line(chk, f"serving.env.{key}", value, "a value of the service's environment file")
    for part in ("model", "drafter"):
        m = v[part]
        if m is None:
            continue
        # path, revision and version have patterns of their own (_check_source); this one has none.
        _one_line(chk, f"{part}.controller_path", m["controller_path"], "a model folder on the controller")
        for i, pattern in enumerate(m["allow_patterns"] or []):
            where = f"{part}.allow_patterns[{i}]"
            if not _one_line(chk, where, pattern, "a file pattern of the download"):
                continue
            if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                chk.bad(where, pattern, "a file pattern relative to the repository (e.g. '*.safetensors'), not empty, "
                                        "not absolute, without '..'")


def validate(merged: dict[str, Any], source: Path, name: str) -> Config:
    """Typed config from a merged mapping, or ConfigError with every problem found."""
    chk = _Checker(source)
    _check_name(chk, name)
    v = chk.section("", merged, SCHEMA)
    spec, serving, gates = v["speculative"], v["serving"], v["gates"]
    algo = spec["algorithm"]

    _check_algorithm_fields(chk, merged, v)
    if algo == "DDTREE":
        _check_ddtree(chk, spec, v["model"]["recurrent_layers"])

    # Model sources.
    for part in ("model", "drafter"):
        if v[part] is not None and not (part == "drafter" and algo == "NONE"):
            _check_source(chk, part, v[part])

    # Serving.
    replicas, router = _check_replicas(chk, serving)
    _check_gpus(chk, serving, replicas)
    port, nccl = _check_ports(chk, serving, replicas, router)
    _check_serving_numbers(chk, serving)
    _check_extra_args(chk, serving["extra_args"] or [])
    _check_env(chk, serving["env"] or {})
    _check_api_key_secret(chk, serving)

    _check_forking_memory(chk, v["model"], spec, serving)
    _check_strings(chk, v)
    _check_gates(chk, gates, algo)

    if chk.problems:
        raise ConfigError(chk.problems)
    return _config(merged, source, name, v, replicas=replicas, router=router, port=port, nccl=nccl)


def _check_name(chk: _Checker, name: str) -> None:
    """The config's name (its file name): it names the units and the files beside them."""
    if not NAME_RE.fullmatch(name):
        chk.bad("name", name, "config file names are lower-case letters, digits, '.', '_' and '-'")
    elif len(name) > MAX_NAME:
        chk.bad("name", name, f"at most {MAX_NAME} characters ({len(name)} given): the unit "
                              f"sglang-<name>-r<i>.service and the files beside it must fit a file name")
    else:
        for reserved, why in RESERVED_NAME_RES:
            if reserved.search(name):
                chk.bad("name", name, why)


def _check_algorithm_fields(chk: _Checker, merged: dict[str, Any], v: dict[str, Any]) -> None:
    """Algorithm-specific fields: only for the algorithms that take them; a drafter and a block size
    for DFLASH and DDTREE."""
    spec = v["speculative"]
    algo = spec["algorithm"]
    raw_spec = merged.get("speculative") if isinstance(merged.get("speculative"), dict) else {}
    allowed = SPEC_FIELDS_BY_ALGORITHM.get(algo, set())
    for key in ("block_size", "budget", "topk_cap", "state_forking", "fused_topk", "reproduce_state_leak"):
        if key in raw_spec and raw_spec[key] is not None and key not in allowed:
            users = [a for a, keys in SPEC_FIELDS_BY_ALGORITHM.items() if key in keys]
            chk.bad(f"speculative.{key}", raw_spec[key],
                    f"only for algorithm {' or '.join(users)}, not {algo}")
    if algo == "NONE" and merged.get("drafter") is not None:
        chk.bad("drafter", merged.get("drafter"), "a drafter is only for algorithm DFLASH or DDTREE, not NONE")
    if algo in ("DFLASH", "DDTREE"):
        if v["drafter"] is None:
            chk.bad("drafter.path", ABSENT, f"required for algorithm {algo}")
        bs = spec["block_size"]
        if bs is None:
            chk.bad("speculative.block_size", ABSENT, f"required for algorithm {algo}")
        elif bs < 2 or bs > 64:
            chk.bad("speculative.block_size", bs, "must be between 2 and 64")


def _check_ddtree(chk: _Checker, spec: dict[str, Any], recurrent: Any) -> None:
    """DDTREE's budget and top-k cap, and its state switches against the model's recurrent layers.
    Sets the switches left out to false."""
    budget, cap, bs = spec["budget"], spec["topk_cap"], spec["block_size"]
    if budget is None:
        chk.bad("speculative.budget", ABSENT, "required for algorithm DDTREE")
    elif budget < 1 or budget > MAX_BUDGET:
        chk.bad("speculative.budget", budget, f"must be between 1 and {MAX_BUDGET}")
    if cap is None:
        chk.bad("speculative.topk_cap", ABSENT, "required for algorithm DDTREE")
    elif cap < 1 or cap > MAX_TOPK_CAP:
        chk.bad("speculative.topk_cap", cap, f"must be between 1 and {MAX_TOPK_CAP}")
    elif budget is not None and 1 <= budget and cap > budget:
        chk.bad("speculative.topk_cap", cap, f"must not exceed speculative.budget ({budget})")
    for key in ("state_forking", "fused_topk", "reproduce_state_leak"):
        if spec[key] is None:
            spec[key] = False
    if (recurrent and not spec["state_forking"] and budget is not None and bs is not None
            and budget > bs - 1 and not spec["reproduce_state_leak"]):
        chk.bad("speculative.budget", budget,
                f"on a model with recurrent layers and state_forking off, must be at most block_size - 1 "
                f"({bs - 1}): sibling nodes would share the recurrent state and acceptance collapses; "
                "turn speculative.state_forking on, or set speculative.reproduce_state_leak: true to "
                "reproduce the collapse on purpose")
    if spec["state_forking"] and recurrent is False:
        chk.bad("speculative.state_forking", True,
                "only for models with recurrent layers (model.recurrent_layers: true)")
    if spec["reproduce_state_leak"] and (spec["state_forking"] or not recurrent):
        chk.bad("speculative.reproduce_state_leak", True,
                "only with state_forking: false on a model with recurrent layers")


def _check_gpus(chk: _Checker, serving: dict[str, Any], replicas: int) -> None:
    """serving.gpus: distinct indices, tp_size of them per replica; serving.tp_size 1 or more."""
    gpus, tp = serving["gpus"], serving["tp_size"]
    if isinstance(gpus, list):
        if not gpus:
            chk.bad("serving.gpus", gpus, "must list at least one GPU index")
        if any(g < 0 for g in gpus):
            chk.bad("serving.gpus", gpus, "GPU indices are 0 or more")
        if len(set(gpus)) != len(gpus):
            chk.bad("serving.gpus", gpus, "each GPU index may appear only once")
        if isinstance(tp, int) and replicas == 1 and len(gpus) != tp:
            chk.bad("serving.gpus", gpus, f"must list exactly serving.tp_size ({tp}) GPUs")
        elif isinstance(tp, int) and replicas > 1 and len(gpus) != tp * replicas:
            chk.bad("serving.gpus", gpus, f"must list serving.replicas x serving.tp_size ({replicas} x {tp} = "
                                          f"{replicas * tp}) GPUs: replica i runs on gpus[i*tp_size:(i+1)*tp_size]")
    if isinstance(tp, int) and tp < 1:
        chk.bad("serving.tp_size", tp, "must be 1 or more")


def _check_ports(chk: _Checker, serving: dict[str, Any], replicas: int, router: bool) -> tuple[Any, Any]:
    """serving.port and serving.nccl_port → (port, nccl_port); a bad port is None. Sets the NCCL port
    left out (serving.port + 1, or + 2 with the router)."""
    port = serving["port"]
    top = 65535 - (2 * replicas if router else 0)
    bottom = 1025 if router else 1024
    if isinstance(port, int) and not bottom <= port <= top:
        chk.bad("serving.port", port, f"must be between {bottom} and {top}" +
                (f" (with the router, its metrics take the port below it and its {replicas} replica(s) the "
                 f"{2 * replicas} ports above it)" if router else ""))
        port = None
    nccl = serving["nccl_port"]
    if router and nccl is not None:
        chk.bad("serving.nccl_port", nccl, "not with the router: replica i takes port serving.port + 1 + 2i and "
                                          "NCCL port serving.port + 2 + 2i; leave nccl_port out")
        nccl = None
    if router and isinstance(port, int):
        nccl = port + 2
        serving["nccl_port"] = nccl
    elif nccl is None and isinstance(port, int):
        nccl = port + 1 if port < 65535 else port - 1
        serving["nccl_port"] = nccl
    elif isinstance(nccl, int) and (not 1024 <= nccl <= 65535 or nccl == port):
        chk.bad("serving.nccl_port", nccl, "must be between 1024 and 65535 and differ from serving.port")
    return port, nccl


def _check_serving_numbers(chk: _Checker, serving: dict[str, Any]) -> None:
    """serving.mem_fraction_static, max_running_requests and the timeouts: within their bounds."""
    mem = serving["mem_fraction_static"]
    if isinstance(mem, float) and not 0.1 <= mem <= 0.98:
        chk.bad("serving.mem_fraction_static", mem, "must be between 0.1 and 0.98")
    mrr = serving["max_running_requests"]
    if isinstance(mrr, int) and mrr < 1:
        chk.bad("serving.max_running_requests", mrr, "must be 1 or more")
    for key in ("start_timeout_s", "stop_timeout_s", "drain_timeout_s"):
        t = serving[key]
        if isinstance(t, int) and not 1 <= t <= 86400:
            chk.bad(f"serving.{key}", t, "must be between 1 and 86400 seconds (a timeout of 0 never gives up)")


def _check_gates(chk: _Checker, gates: dict[str, Any], algo: str) -> None:
    """Gates (bounds from sgdeploy.gate_schema; the kinds were checked by the schema). Replaces each
    given gate by the checked one."""
    for key, g in gates.items():
        if g is not None:
            try:
                gates[key] = gate_schema.check(key, g)
            except ValueError as exc:
                chk.bad(f"gates.{key}", g, str(exc))
    if isinstance(gates["min_accept_length"], float) and algo == "NONE" and gates["min_accept_length"] > 1:
        chk.bad("gates.min_accept_length", gates["min_accept_length"],
                "an autoregressive config accepts exactly 1 token per step; use at most 1 or leave it out")


def _config(merged: dict[str, Any], source: Path, name: str, v: dict[str, Any], *, replicas: int, router: bool,
            port: int, nccl: int) -> Config:
    """The typed Config of a config that passed every check."""
    spec, serving, gates = v["speculative"], v["serving"], v["gates"]
    algo = spec["algorithm"]
    for part in ("model", "drafter"):
        if v[part] is not None and v[part]["allow_patterns"] is not None:
            v[part]["allow_patterns"] = tuple(v[part]["allow_patterns"])
    model = Model(**v["model"])
    drafter = Drafter(**v["drafter"]) if v["drafter"] is not None and algo != "NONE" else None
    speculative = Speculative(**{k: val for k, val in spec.items() if val is not None or k == "algorithm"})
    serving_obj = Serving(
        gpus=tuple(serving["gpus"]), tp_size=serving["tp_size"], host=serving["host"], port=port, nccl_port=nccl,
        attention_backend=serving["attention_backend"], mem_fraction_static=serving["mem_fraction_static"],
        max_running_requests=serving["max_running_requests"], extra_args=tuple(serving["extra_args"]),
        env=dict(serving["env"]),
        start_timeout_s=serving["start_timeout_s"], stop_timeout_s=serving["stop_timeout_s"],
        drain_timeout_s=serving["drain_timeout_s"], forking_memory_gib=serving["forking_memory_gib"],
        replicas=replicas, router=router, api_key_secret=serving["api_key_secret"],
    )
    return Config(name=name, source=source, description=v["description"], model=model, drafter=drafter,
                  speculative=speculative, serving=serving_obj, gates=Gates(dict(gates)), merged=merged)

MAX_REPLICAS = 64


def _check_extra_args(chk: _Checker, extra_args: list[str]) -> None:
    """No argument may set a managed field, in any spelling SGLang's parser takes (sgdeploy.sglang_flags)."""
    from sgdeploy import sglang_flags

    for i, arg in enumerate(extra_args):
        if not isinstance(arg, str) or not arg.startswith("-") or arg == "-" or _is_number(arg):
            continue
        written, dests = sglang_flags.resolve(arg)
        managed = sorted(d for d in dests if d in MANAGED_DESTS)
        if not managed:
            continue
        flags = sglang_flags.table()
        dest = managed[0]
        canonical = f"--{dest.replace('_', '-')}"
        canonical = canonical if canonical in flags else next(o for o in flags if flags[o] == dest)
        spelled = written if written == canonical else f"{written} (SGLang reads it as {canonical})"
        if dest in ("api_key", "admin_api_key", "ssl_keyfile_password", "config"):
            chk.bad(f"serving.extra_args[{i}]", arg, f"{spelled}: {MANAGED_DESTS[dest]}")
        else:
            chk.bad(f"serving.extra_args[{i}]", arg, f"{spelled} is set from the config's own fields "
                                                     f"({MANAGED_DESTS[dest]}); set those instead")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _check_api_key_secret(chk: _Checker, serving: dict[str, Any]) -> None:
    """serving.api_key_secret names the engines' API key in the inventory's sglang_secret_env (Vault);
    required when the service binds an address other hosts reach."""
    name = serving["api_key_secret"]
    if name is None:
        host = serving["host"]
        if isinstance(host, str) and not is_loopback(host):
            chk.bad("serving.api_key_secret", ABSENT, f"required with serving.host {host} (not loopback): name the "
                    "engines' API key in the inventory's sglang_secret_env; engines and router then refuse requests "
                    "without it")
        return
    if not ENV_NAME_RE.fullmatch(name):
        chk.bad("serving.api_key_secret", name, "the name of a key of the inventory's sglang_secret_env: letters, "
                                                "digits and _")
    elif name in MANAGED_ENV or any(name.startswith(p) for p in MANAGED_ENV_PREFIXES):
        chk.bad("serving.api_key_secret", name, "a name of sglang_secret_env that the unit does not manage (not "
                                                f"{', '.join(MANAGED_ENV_PREFIXES)}*, nor a variable the unit sets)")


def _check_env(chk: _Checker, env: dict[str, str]) -> None:
    for key in env:
        why = MANAGED_ENV.get(key) or next((w for p, w in MANAGED_ENV_PREFIXES.items() if key.startswith(p)), None)
        if why:
            chk.bad(f"serving.env.{key}", env[key], f"{key} may not be set in serving.env: {why}")


def _check_replicas(chk: _Checker, serving: dict[str, Any]) -> tuple[int, bool]:
    """serving.replicas and serving.router → (replicas, router); a bad value counts as one replica."""
    replicas = serving["replicas"]
    if not isinstance(replicas, int):
        replicas = 1
    elif not 1 <= replicas <= MAX_REPLICAS:
        chk.bad("serving.replicas", replicas, f"must be between 1 and {MAX_REPLICAS} (engines of tp_size GPUs each)")
        replicas = 1
    router = serving["router"]
    if router is None:
        router = replicas > 1
    elif router is False and replicas > 1:
        chk.bad("serving.router", router, f"with serving.replicas {replicas} the router must hold serving.port in "
                                          "front of the replicas; leave it out or set it true")
        router = True
    return replicas, router


def controller_folder(controller_path: str) -> Path:
    """A `source: controller` folder: absolute, or relative to the repository root."""
    p = Path(controller_path)
    return p if p.is_absolute() else REPO_ROOT / p


def _check_source(chk: _Checker, part: str, m: dict[str, Any]) -> None:
    source = m["source"]
    if source is None:  # an invalid choice, already reported
        return
    for key in ("path", "revision", "controller_path", "version", "allow_patterns"):
        if m[key] is not None and key not in SOURCE_FIELDS[source]:
            users = [s for s, keys in SOURCE_FIELDS.items() if key in keys]
            chk.bad(f"{part}.{key}", m[key], f"only for source {' or '.join(users)}, not {source} (set it to null "
                                            "when a parent config gives it)")
    if source == "hf":
        if m["path"] is None:
            chk.bad(f"{part}.path", ABSENT, "required for source hf: a Hugging Face repository ORG/NAME")
        elif not HF_REPO_RE.fullmatch(m["path"]):
            chk.bad(f"{part}.path", m["path"], "for source hf, a Hugging Face repository ORG/NAME (letters, digits, "
                                               "'.', '_', '-'); for a folder on the host use source: path")
        if m["revision"] is None:
            chk.bad(f"{part}.revision", ABSENT, "required for source hf: pin a commit hash (or a branch or tag name)")
        elif not REVISION_RE.fullmatch(m["revision"]):
            chk.bad(f"{part}.revision", m["revision"], "a commit hash, branch or tag of letters, digits, '.', '_' "
                                                       "and '-'")
    elif source == "path":
        if m["path"] is None:
            chk.bad(f"{part}.path", ABSENT, "required for source path: the model folder on the host")
        elif not HOST_PATH_RE.fullmatch(m["path"]) or ".." in m["path"].split("/"):
            chk.bad(f"{part}.path", m["path"], "for source path, an absolute folder on the host of letters, digits "
                                               "and '._+@=,-/', without spaces or '..' (e.g. /mnt/models/Qwen3.6-27B)")
    elif source == "controller":
        cp = m["controller_path"]
        if cp is None:
            chk.bad(f"{part}.controller_path", ABSENT, "required for source controller: a model folder on the "
                                                       "controller (absolute or relative to the repository)")
        elif ".." in Path(cp).parts:
            chk.bad(f"{part}.controller_path", cp, "a model folder on the controller without '..' (absolute, or "
                                                   "relative to the repository)")
        else:
            folder = controller_folder(cp)
            if not folder.is_dir():
                chk.bad(f"{part}.controller_path", cp, f"must be an existing folder on the controller ({folder})")
            elif not (folder / "config.json").is_file():
                chk.bad(f"{part}.controller_path", cp, f"the folder {folder} has no config.json: not a model folder")
            elif not MODEL_NAME_RE.fullmatch(folder.name):
                chk.bad(f"{part}.controller_path", cp, "the folder name must be letters, digits, '.', '_' and '-'")
        if m["version"] is not None and not MODEL_NAME_RE.fullmatch(m["version"]):
            chk.bad(f"{part}.version", m["version"], "letters, digits, '.', '_' and '-'")
