"""Spec configs: parse `configs/*.yml` once into typed objects, with `extends`, and validate.

Loading, `extends` and the typed `Config` live here; the config's structure (fields, types, defaults) and
its rules are the pydantic models of `sgdeploy.config_model`, which `validate` calls. Every problem found
is reported, one line each, naming the file, the field path, the bad value and what is allowed. Callers
get a `Config` or a `ConfigError` carrying all problems; the command-line layer prints them and exits 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sgdeploy import config_model, multinode
from sgdeploy.config_model import ALGORITHMS as ALGORITHMS
from sgdeploy.config_model import ATTENTION_BACKENDS as ATTENTION_BACKENDS
from sgdeploy.config_model import MANAGED_DESTS as MANAGED_DESTS
from sgdeploy.config_model import MAX_BUDGET as MAX_BUDGET
from sgdeploy.config_model import MAX_NAME as MAX_NAME
from sgdeploy.config_model import MAX_REPLICAS as MAX_REPLICAS
from sgdeploy.config_model import MAX_TOPK_CAP as MAX_TOPK_CAP
from sgdeploy.config_model import MODEL_SOURCES as MODEL_SOURCES
from sgdeploy.config_model import NAME_RE, SOURCE_FIELDS
from sgdeploy.config_model import ConfigError as ConfigError
from sgdeploy.config_model import controller_folder as controller_folder
from sgdeploy.config_model import fmt as _fmt
from sgdeploy.config_model import is_loopback as is_loopback

REPO_ROOT = config_model.REPO_ROOT
CONFIG_DIR = REPO_ROOT / "configs"
FEATURE_ORDER = ("ddtree", "fork", "topk")
# Each section's leaves as (kind, default), from the models (sgdeploy.gate's tests compare the gates').
SCHEMA: dict[str, Any] = config_model.schema_table()


@dataclass(frozen=True)
class Model:
    path: str | None
    revision: str | None
    recurrent_layers: bool
    source: str = "hf"
    controller_path: str | None = None
    version: str | None = None
    allow_patterns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Drafter:
    path: str | None
    revision: str | None
    source: str = "hf"
    controller_path: str | None = None
    version: str | None = None
    allow_patterns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Speculative:
    algorithm: str
    block_size: int | None = None
    budget: int | None = None
    topk_cap: int | None = None
    state_forking: bool = False
    fused_topk: bool = False
    reproduce_state_leak: bool = False
    budget_schedule: tuple[tuple[int, int], ...] | None = None  # ((min_batch, budget), ...): sgdeploy.schedule


@dataclass(frozen=True)
class Serving:
    gpus: tuple[int, ...]
    tp_size: int
    host: str
    port: int
    nccl_port: int
    attention_backend: str
    mem_fraction_static: float
    max_running_requests: int | None
    extra_args: tuple[str, ...]
    env: dict[str, str]
    start_timeout_s: int
    stop_timeout_s: int
    drain_timeout_s: int
    forking_memory_gib: float | None = None
    replicas: int = 1
    router: bool = False
    api_key_secret: str | None = None
    nnodes: int = 1  # hosts one engine spans (docs/multinode.md)
    dist_init_port: int | None = None  # rank 0's port the other ranks join on (nnodes > 1)


@dataclass(frozen=True)
class Replica:
    """One engine of a config (docs/router.md, "Ports and GPUs"): its own unit, ports and GPUs."""

    index: int
    name: str  # the deploy's name on the host: its state folder, env file and records (docs/router.md)
    unit_name: str
    port: int
    nccl_port: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class _Values:
    """A config section kept as its mapping of field values, each also read as an attribute."""

    values: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["values"][key]
        except KeyError:
            raise AttributeError(key) from None

    def as_mapping(self) -> dict[str, Any]:
        return dict(self.values)


@dataclass(frozen=True)
class Gates(_Values):
    """The config's gates mapping (keys, kinds and defaults: sgdeploy.gate_schema)."""


@dataclass(frozen=True)
class Watch(_Values):
    """The config's post-deploy watch (docs/monitoring-watch.md): its fields as written, with their defaults."""

    def resolved(self, gates: Gates) -> dict[str, Any]:
        """What the host's watch gets: min_accept_length from the gates when the watch leaves it out (0: none)."""
        out = dict(self.values)
        if out.get("min_accept_length") is None:
            out["min_accept_length"] = gates.values.get("min_accept_length")
        for key in ("min_accept_length", "min_tokens_per_s"):
            if out.get(key) is not None and out[key] <= 0:
                out[key] = None
        return out


def _default_watch() -> Watch:
    return Watch({k: default for k, (_kind, default) in SCHEMA["watch"].items()})


@dataclass(frozen=True)
class Config:
    name: str
    source: Path
    description: str
    model: Model
    drafter: Drafter | None
    speculative: Speculative
    serving: Serving
    gates: Gates
    merged: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    watch: Watch = field(default_factory=_default_watch)

    @property
    def speculative_enabled(self) -> bool:
        return self.speculative.algorithm != "NONE"

    @property
    def needs_patched_series(self) -> bool:
        """True when the config uses a patched feature: it runs the one patched build (the whole
        series; the features are server flags), else the pristine wheel (label `stock`)."""
        return bool(self.patch_features)

    @property
    def patch_features(self) -> tuple[str, ...]:
        """The patched features this config uses, in series order (see docs/design.md). Any of them
        means the patched series; which are on is said by the flags render.launch_args writes."""
        s = self.speculative
        wanted = set()
        if s.algorithm == "DDTREE":
            wanted.add("ddtree")
            if s.state_forking:
                wanted.add("fork")
            if s.fused_topk:
                wanted.add("topk")
        return tuple(f for f in FEATURE_ORDER if f in wanted)

    @property
    def unit_name(self) -> str:
        return f"sglang-{self.name}.service"

    @property
    def router_unit_name(self) -> str:
        """Named by its port, not its config: a switch to another config on that port keeps the router."""
        return f"sglang-router-{self.serving.port}.service"

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The config's engines. Without the router: one, the config's own unit on serving.port and
        nccl_port. With it (serving.router, on by default when serving.replicas > 1) the router holds
        serving.port and replica i (from 0) is unit sglang-<config>-r<i> on port serving.port + 1 + 2i,
        NCCL port serving.port + 2 + 2i, GPUs gpus[i*tp_size:(i+1)*tp_size], deployed on the host as
        <config>-r<i> (its own state folder, env file, records)."""
        sv = self.serving
        if not sv.router:
            return (Replica(0, self.name, self.unit_name, sv.port, sv.nccl_port, sv.gpus),)
        tp = sv.tp_size
        return tuple(Replica(i, f"{self.name}-r{i}", f"sglang-{self.name}-r{i}.service", sv.port + 1 + 2 * i,
                             sv.port + 2 + 2 * i, sv.gpus[i * tp:(i + 1) * tp]) for i in range(sv.replicas))

    @property
    def router_metrics_port(self) -> int | None:
        """The router's Prometheus port: serving.port - 1, whatever the replica count, so that a change of the
        count never moves it (a move restarts the router, which refuses connections meanwhile); None without it."""
        sv = self.serving
        return sv.port - 1 if sv.router else None

    @property
    def ports(self) -> tuple[int, ...]:
        """Every port the config holds on its host: the router's two (serving.port and its metrics) and
        each engine's two."""
        metrics = self.router_metrics_port
        sv = self.serving
        if metrics is None:  # no router; an engine over several hosts also holds its dist-init port (and, with DP
            # attention, the ports SGLang's rank 0 derives from it: sgdeploy.multinode.derived_ports)
            extra = ((sv.dist_init_port, *multinode.derived_ports(sv.nnodes, sv.dist_init_port, sv.extra_args))
                     if sv.nnodes > 1 and sv.dist_init_port is not None else ())
            return (self.serving.port, self.serving.nccl_port, *extra)
        return (self.serving.port, *(p for r in self.replicas for p in (r.port, r.nccl_port)), metrics)


# --------------------------------------------------------------------------------------------------
# Loading and merging

def is_path(name_or_path: str | Path) -> bool:
    """Whether a config argument is the path of a file (ends in .yml/.yaml or holds a '/'), not a name."""
    text = str(name_or_path)
    return text.endswith((".yml", ".yaml")) or "/" in text


def resolve(name_or_path: str | Path, config_dir: Path = CONFIG_DIR) -> Path:
    """A config name (`ddtree-b15`) or a path to a YAML file → the file's path."""
    text = str(name_or_path)
    candidate = Path(text)
    if is_path(text):
        if not candidate.is_file():
            raise ConfigError([f"{text}: no such config file"])
        return candidate.resolve()
    known = ", ".join(available(config_dir)) or "(none)"
    if not NAME_RE.fullmatch(text):
        raise ConfigError([f"config {text!r}: not a config name: names are lower-case letters, digits, '.', '_' and "
                           f"'-' (known configs: {known}), or give the path of a .yml file"])
    for suffix in (".yml", ".yaml"):
        p = config_dir / f"{text}{suffix}"
        if p.is_file():
            return p.resolve()
    raise ConfigError([f"{text}: no config of that name in {config_dir}; known configs: {known}"])


def available(config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in config_dir.glob("*.yml"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{path}: not valid YAML{where}: {problem}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping of fields, got {type(data).__name__}"])
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) in `override` replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_merged(path: Path, config_dir: Path | None = None, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The config at `path` with its `extends` chain merged in (parent first)."""
    config_dir = config_dir or path.parent
    if path in _chain:
        cycle = " -> ".join(p.stem for p in (*_chain, path))
        raise ConfigError([f"{_chain[0]}: extends: cycle {cycle}"])
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent:
        raise ConfigError([f"{path}: extends: {_fmt(parent)} is not a config name; give the name of a file in "
                           f"{config_dir} without .yml"])
    # A parent is looked up beside the config first, then among the shipped configs.
    parent_path = None
    search = [config_dir] + ([CONFIG_DIR] if config_dir.resolve() != CONFIG_DIR.resolve() else [])
    for folder in search:
        for suffix in (".yml", ".yaml"):
            p = folder / f"{parent}{suffix}"
            if p.is_file() and parent_path is None:
                parent_path = p.resolve()
    if parent_path is None:
        raise ConfigError([f"{path}: extends: {parent!r} not found in {' or '.join(map(str, search))}; "
                           f"known configs: {', '.join(available(config_dir) or available())}"])
    merged = deep_merge(load_merged(parent_path, config_dir, (*_chain, path)), data)
    merged.pop("extends", None)
    return merged


# --------------------------------------------------------------------------------------------------
# Validation: the models of sgdeploy.config_model


def validate(merged: dict[str, Any], source: Path, name: str) -> Config:
    """Typed config from a merged mapping, or ConfigError with every problem found."""
    v = config_model.check(merged, source, name)

    def weights(m: config_model.WeightsSection) -> dict[str, Any]:
        d = m.model_dump()
        return d | {"allow_patterns": None if d["allow_patterns"] is None else tuple(d["allow_patterns"])}

    sv = v.checked_serving.model_dump()
    spec = v.checked_speculative.model_dump()
    if spec.get("budget_schedule") is not None:
        spec["budget_schedule"] = tuple((e["min_batch"], e["budget"]) for e in spec["budget_schedule"])
    if v.description is None:  # its default is "" (null takes it); a wrong value is a ConfigError above
        raise AssertionError("config description not set after validation")
    return Config(
        name=name, source=source, description=v.description, model=Model(**weights(v.checked_model)),
        drafter=Drafter(**weights(v.drafter)) if v.drafter is not None and spec["algorithm"] != "NONE" else None,
        speculative=Speculative(**{k: val for k, val in spec.items() if val is not None or k == "algorithm"}),
        serving=Serving(**sv | {"gpus": tuple(sv["gpus"]), "extra_args": tuple(sv["extra_args"])}),
        gates=Gates(v.checked_gates.model_dump()), merged=merged, watch=Watch(v.checked_watch.model_dump()))


def load(name_or_path: str | Path, config_dir: Path = CONFIG_DIR) -> Config:
    """Resolve, merge `extends` and validate. Raises ConfigError."""
    path = resolve(name_or_path, config_dir)
    merged = load_merged(path, path.parent)
    return validate(merged, path, path.stem)


def _source_yaml(m: Model | Drafter) -> dict[str, Any]:
    out: dict[str, Any] = {"source": m.source}
    for key in SOURCE_FIELDS[m.source]:
        value = getattr(m, key)
        if value is not None:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def to_yaml(config: Config) -> str:
    """The fully merged config as YAML: itself a valid config (no `extends`)."""
    s = config.speculative
    spec: dict[str, Any] = {"algorithm": s.algorithm}
    if s.algorithm in ("DFLASH", "DDTREE"):
        spec["block_size"] = s.block_size
    if s.algorithm == "DDTREE":
        spec.update(budget=s.budget, topk_cap=s.topk_cap, state_forking=s.state_forking,
                    fused_topk=s.fused_topk, reproduce_state_leak=s.reproduce_state_leak)
        if s.budget_schedule is not None:
            spec["budget_schedule"] = [{"min_batch": m, "budget": b} for m, b in s.budget_schedule]
    sv = config.serving
    out: dict[str, Any] = {
        "description": config.description,
        "model": {**_source_yaml(config.model), "recurrent_layers": config.model.recurrent_layers},
    }
    if config.drafter is not None:
        out["drafter"] = _source_yaml(config.drafter)
    out["speculative"] = spec
    out["serving"] = {
        "gpus": list(sv.gpus), "tp_size": sv.tp_size, "host": sv.host, "port": sv.port,
        "nccl_port": sv.nccl_port, "attention_backend": sv.attention_backend,
        "mem_fraction_static": sv.mem_fraction_static, "max_running_requests": sv.max_running_requests,
        "extra_args": list(sv.extra_args), "env": dict(sv.env), "start_timeout_s": sv.start_timeout_s,
        "stop_timeout_s": sv.stop_timeout_s, "drain_timeout_s": sv.drain_timeout_s,
        "forking_memory_gib": sv.forking_memory_gib,
    }
    if sv.api_key_secret is not None:
        out["serving"]["api_key_secret"] = sv.api_key_secret
    if sv.nnodes > 1:
        out["serving"].update(nnodes=sv.nnodes, dist_init_port=sv.dist_init_port)
    if sv.router:
        out["serving"].pop("nccl_port")
        out["serving"].update(replicas=sv.replicas, router=True)
    out["gates"] = config.gates.as_mapping()
    out["watch"] = config.watch.as_mapping()
    header = f"# {config.name}: fully merged from {config.source}\n"
    return header + yaml.safe_dump(out, sort_keys=False, default_flow_style=False)
