"""The config's structure as pydantic v2 models, and its domain rules as their validators.

`sgdeploy.spec` reads a config, merges its `extends` chain and calls `check`; the models here say which
fields there are, their types and defaults (and give the JSON Schema of `docs/config.schema.json`,
`sgdeploy schema`); their validators hold the rules between fields. Every problem is collected, none
raised on its own: `check` raises one `ConfigError` with all of them, one line each,
"file: field: value: what is allowed", in this order: the config's name; each section's unknown fields
and wrong values, field by field; then the rules between fields (`ConfigModel._rules`, in its order).

How the models do it: each leaf's type is annotated with a `Leaf` (its kind and what is allowed); one
wrap validator (`_Section._leaf`) runs pydantic's own check of the type and, when it fails, records
the line and leaves the field None, so that the checks after it still run and report what else is
wrong. A null leaf takes its default (a parent's value can be unset with null); a `required` one is
reported. Each section's before-validator reports its unknown fields (with a close match) and a
section that is not a mapping.
"""

import difflib
import ipaddress
import json
import math
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, get_args

import yaml
from annotated_types import MinLen
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from sgdeploy import gate_schema, multinode

REPO_ROOT = Path(__file__).resolve().parent.parent

Algorithm = Literal["NONE", "DFLASH", "DDTREE"]
AttentionBackend = Literal["triton", "flashinfer", "fa3", "torch_native", "flex_attention"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
ATTENTION_BACKENDS: tuple[str, ...] = get_args(AttentionBackend)
# Largest budget the project accepts in a config. The memory rule (sgdeploy.budget) can lower it
# per model and card; 256 nodes is already far past the measured acceptance plateau.
MAX_BUDGET = 256
MAX_TOPK_CAP = 16
MAX_REPLICAS = 64
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where a model's weights come from (docs/models.md).
ModelSource = Literal["hf", "path", "controller"]
MODEL_SOURCES: tuple[str, ...] = get_args(ModelSource)
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
SPEC_FIELDS_BY_ALGORITHM = {
    "NONE": set(),
    "DFLASH": {"block_size"},
    "DDTREE": {"block_size", "budget", "topk_cap", "state_forking", "fused_topk", "reproduce_state_leak",
               "budget_schedule"},
}

# What extra_args may not set, by SGLang's field (dest), whatever the spelling (alias, unique prefix,
# --flag=value; sgdeploy.sglang_flags resolves them with SGLang 0.5.23's own parser table):
# the fields the config sets, the secrets (never in argv: serving.api_key_secret), and --config (a
# file of options that could set any of them).
MANAGED_DESTS = {
    "model_path": "set from model.*", "tp_size": "set from serving.tp_size", "host": "set from serving.host",
    "port": "set from serving.port", "nccl_port": "set from serving.nccl_port",
    "nnodes": "set from serving.nnodes", "node_rank": "set per host from the engine's hosts (docs/multinode.md)",
    "dist_init_addr": "set from serving.dist_init_port and rank 0's address (docs/multinode.md)",
    "attention_backend": "set from serving.attention_backend",
    "mem_fraction_static": "set from serving.mem_fraction_static",
    "max_running_requests": "set from serving.max_running_requests",
    "revision": "the weights are a local folder placed before the switch (model.revision)",
    "speculative_algorithm": "set from speculative.algorithm",
    "speculative_draft_model_path": "set from drafter.*",
    "speculative_dflash_block_size": "set from speculative.block_size",
    "speculative_ddtree_budget": "set from speculative.budget",
    "speculative_ddtree_budget_schedule": "set from speculative.budget_schedule",
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
MAX_NODES = multinode.MAX_NODES  # hosts one engine may span (serving.nnodes; docs/multinode.md)
# Names another unit of the project takes: the router's (sglang-router-<port>.service, a config named
# router-<port> would write over it) and a replica's (sglang-<config>-r<i>.service, env file and state
# folder <config>-r<i>).
RESERVED_NAME_RES = (
    (re.compile(r"^router(-|$)"), "names starting with 'router-' are the routers' "
                                  "(sglang-router-<port>.service): pick another name"),
    (re.compile(r"-r[0-9]+$"), "names ending in -r<number> are the replicas' (sglang-<config>-r<i>.service, "
                               "/etc/sglang/<config>-r<i>.env): pick another name"),
)


class ConfigError(Exception):
    """One or more problems with a config; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


ABSENT = object()  # a field left out, shown as "missing"


def fmt(value: Any) -> str:
    """A value as a problem line shows it: a string quoted, anything else as YAML flow."""
    if isinstance(value, str):
        return repr(value)
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _key(key: Any) -> str:
    """A mapping key as a field path shows it: as written, or quoted when it is not one plain line."""
    text = str(key)
    return text if text.isprintable() else repr(text)


class Problems:
    """The problems of one config, collected while its models validate (the validation context)."""

    def __init__(self, source: Path, name: str, raw: dict[str, Any]):
        self.source = source
        self.name = name
        self.raw = raw  # the merged mapping as written (some rules name a value even when its type was wrong)
        self.lines: list[str] = []

    def bad(self, path: str, value: Any, allowed: str) -> None:
        shown = "missing" if value is ABSENT else fmt(value)
        self.lines.append(f"{self.source}: {path}: {shown}: {allowed}")


def _problems(info: ValidationInfo) -> Problems:
    context = info.context
    if context is None:
        raise AssertionError("a config model validated without its context: validate with check()")
    problems: Problems = context["problems"]
    return problems


# --------------------------------------------------------------------------------------------------
# Leaves: a type, and what the problem line says when a value is not of it.


class Leaf:
    """Annotation of a leaf field: its kind (str, bool, int, float, ip, list[int], list[str], map[str],
    choice), what is allowed when a value is not of it, and whether it must be given (here or in a parent)."""

    def __init__(self, kind: str, allowed: str, required: bool = False):
        self.kind, self.allowed, self.required = kind, allowed, required


def _ip(value: str) -> str:
    ipaddress.ip_address(value)  # ValueError: not an address
    return value


Str = Annotated[Annotated[str, MinLen(1)] | None, Leaf("str", "must be a non-empty string")]
Bool = Annotated[bool | None, Leaf("bool", "must be true or false")]
Int = Annotated[int | None, Leaf("int", "must be a whole number")]
Float = Annotated[float | None, Leaf("float", "must be a number")]
IntList = Annotated[list[int] | None, Leaf("list[int]", "must be a list of whole numbers")]
StrList = Annotated[list[str] | None, Leaf("list[str]", "must be a list of strings")]
IP = Annotated[Annotated[str, AfterValidator(_ip)] | None,
               Leaf("ip", "must be an IP address (e.g. 127.0.0.1 for loopback only)")]
# serving.env: checked entry by entry (`_Section._env`); values become strings (true/false in lower case).
EnvEntries = Annotated[dict[str, str | int | float | bool], WithJsonSchema({
    "type": "object", "propertyNames": {"pattern": ENV_NAME_RE.pattern},
    "additionalProperties": {"type": ["string", "integer", "number", "boolean"]}})]
EnvMap = Annotated[EnvEntries | None, Leaf("map[str]", "must be a mapping of NAME: value")]
# speculative.budget_schedule: checked entry by entry (`SpeculativeSection.check_schedule`).
ScheduleEntries = Annotated[list[dict[str, Any]], WithJsonSchema({
    "type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["min_batch", "budget"], "additionalProperties": False,
        "properties": {"min_batch": {"type": "integer", "minimum": 1},
                       "budget": {"type": "integer", "minimum": 1, "maximum": MAX_BUDGET}}}})]
ScheduleList = Annotated[ScheduleEntries | None, Leaf("list[map]", "must be a list of {min_batch, budget} mappings, "
                                                                   "e.g. [{min_batch: 1, budget: 64}, "
                                                                   "{min_batch: 8, budget: 15}]")]
Source = Annotated[ModelSource | None, Leaf("choice", f"must be one of {', '.join(MODEL_SOURCES)}")]
AlgorithmChoice = Annotated[Algorithm | None, Leaf("choice", f"must be one of {', '.join(ALGORITHMS)}")]
BackendChoice = Annotated[AttentionBackend | None, Leaf("choice", f"must be one of {', '.join(ATTENTION_BACKENDS)}",
                                                        required=True)]
GATE_TYPES = {"str": Str, "bool": Bool, "int": Int, "float": Float}


def _leaf_of(field: Any) -> Leaf | None:
    return next((m for m in field.metadata if isinstance(m, Leaf)), None)


class _Section(BaseModel):
    """A mapping of the config: its unknown fields and wrong values are problems, collected in order."""

    model_config = ConfigDict(strict=True, extra="forbid", validate_default=False)
    prefix: ClassVar[str] = ""  # the section's field path ("" for the top level)
    sections: ClassVar[tuple[str, ...]] = ()  # sub-sections checked (with their defaults) even when left out

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any, info: ValidationInfo) -> dict[str, Any]:
        """A mapping (null is an empty one); its unknown fields reported and dropped; required leaves and
        sections left out set to null, so that their validators run (and report them) in field order."""
        p = _problems(info)
        cls._first(p)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            p.bad(cls.prefix, data, "must be a mapping")
            data = {}
        fields = cls.model_fields
        for key in data:
            if key not in fields:
                match = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f" (did you mean {match[0]!r}?)" if match else ""
                p.bad(f"{cls.prefix}.{_key(key)}" if cls.prefix else _key(key), data[key],
                      f"unknown field{hint}; allowed: {', '.join(fields)}")
        out = {k: v for k, v in data.items() if k in fields}
        for name, field in fields.items():
            leaf = _leaf_of(field)
            if name not in out and (name in cls.sections or (leaf is not None and leaf.required)):
                out[name] = None
        for name, field in fields.items():  # a section given as null is an empty one (all its defaults)
            if _leaf_of(field) is None and name in out and out[name] is None:
                out[name] = {}
        return out

    @classmethod
    def _first(cls, p: Problems) -> None:
        """What a section reports before its fields (the top level: the config's name)."""

    @field_validator("*", mode="wrap")
    @classmethod
    def _leaf(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        """A leaf's value of its type (pydantic's strict check), its default for null, or None with a
        problem line; a section is validated by its own model."""
        name = info.field_name
        if name is None:
            raise AssertionError("a field validator called without its field's name")
        field = cls.model_fields[name]
        leaf = _leaf_of(field)
        if leaf is None:
            return handler(value)
        p = _problems(info)
        path = f"{cls.prefix}.{name}" if cls.prefix else name
        if value is None:
            if leaf.required:
                p.bad(path, ABSENT, "required")
                return None
            return field.get_default(call_default_factory=True)
        if leaf.kind == "map[str]":
            return cls._env(p, path, value, leaf)
        try:
            return handler(value)
        except ValidationError:
            p.bad(path, value, leaf.allowed)
            return None

    @staticmethod
    def _env(p: Problems, path: str, value: Any, leaf: Leaf) -> dict[str, str] | None:
        """A mapping of environment variable NAME: value, each value a string (true/false in lower case)."""
        if not isinstance(value, dict):
            p.bad(path, value, leaf.allowed)
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not ENV_NAME_RE.fullmatch(k):
                p.bad(f"{path}.{_key(k)}", k, "environment variable names are letters, digits and _")
            elif isinstance(v, dict | list) or v is None:
                p.bad(f"{path}.{k}", v, "must be a string, number or boolean")
            else:
                out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


# --------------------------------------------------------------------------------------------------
# The sections


def controller_folder(controller_path: str) -> Path:
    """A `source: controller` folder: absolute, or relative to the repository root."""
    p = Path(controller_path)
    return p if p.is_absolute() else REPO_ROOT / p


class WeightsSection(_Section):
    """Where a model's weights come from (docs/models.md); the target model and the drafter."""

    source: Source = Field("hf", description="hf (a Hugging Face repository), path (a folder "
                                           "on the host) or controller (a folder copied from the controller)")
    path: Str = Field(None, description="source hf: the repository ORG/NAME; source path: the folder on the host")
    revision: Str = Field(None, description="source hf: a commit hash (or a branch or tag name)")
    controller_path: Str = Field(None, description="source controller: the model folder on the controller "
                                                   "(absolute or relative to the repository)")
    version: Str = Field(None, description="source controller: a version label of the folder's contents")
    allow_patterns: StrList = Field(None, description="source hf: the file patterns to download")

    def check_source(self, p: Problems) -> None:
        """The fields of the weights' source: only its own, each in its form."""
        part, source = self.path_name(), self.source
        if source is None:  # an invalid choice, already reported
            return
        for key in ("path", "revision", "controller_path", "version", "allow_patterns"):
            if getattr(self, key) is not None and key not in SOURCE_FIELDS[source]:
                users = [s for s, keys in SOURCE_FIELDS.items() if key in keys]
                p.bad(f"{part}.{key}", getattr(self, key), f"only for source {' or '.join(users)}, not {source} "
                                                           "(set it to null when a parent config gives it)")
        if source == "hf":
            self._check_hf(p, part)
        elif source == "path":
            if self.path is None:
                p.bad(f"{part}.path", ABSENT, "required for source path: the model folder on the host")
            elif not HOST_PATH_RE.fullmatch(self.path) or ".." in self.path.split("/"):
                p.bad(f"{part}.path", self.path, "for source path, an absolute folder on the host of letters, "
                      "digits and '._+@=,-/', without spaces or '..' (e.g. /mnt/models/Qwen3.6-27B)")
        elif source == "controller":
            self._check_controller(p, part)

    def path_name(self) -> str:
        return type(self).prefix

    def _check_hf(self, p: Problems, part: str) -> None:
        if self.path is None:
            p.bad(f"{part}.path", ABSENT, "required for source hf: a Hugging Face repository ORG/NAME")
        elif not HF_REPO_RE.fullmatch(self.path):
            p.bad(f"{part}.path", self.path, "for source hf, a Hugging Face repository ORG/NAME (letters, digits, "
                                             "'.', '_', '-'); for a folder on the host use source: path")
        if self.revision is None:
            p.bad(f"{part}.revision", ABSENT, "required for source hf: pin a commit hash (or a branch or tag name)")
        elif not REVISION_RE.fullmatch(self.revision):
            p.bad(f"{part}.revision", self.revision, "a commit hash, branch or tag of letters, digits, '.', '_' "
                                                     "and '-'")

    def _check_controller(self, p: Problems, part: str) -> None:
        cp = self.controller_path
        if cp is None:
            p.bad(f"{part}.controller_path", ABSENT, "required for source controller: a model folder on the "
                                                     "controller (absolute or relative to the repository)")
        elif ".." in Path(cp).parts:
            p.bad(f"{part}.controller_path", cp, "a model folder on the controller without '..' (absolute, or "
                                                 "relative to the repository)")
        else:
            folder = controller_folder(cp)
            if not folder.is_dir():
                p.bad(f"{part}.controller_path", cp, f"must be an existing folder on the controller ({folder})")
            elif not (folder / "config.json").is_file():
                p.bad(f"{part}.controller_path", cp, f"the folder {folder} has no config.json: not a model folder")
            elif not MODEL_NAME_RE.fullmatch(folder.name):
                p.bad(f"{part}.controller_path", cp, "the folder name must be letters, digits, '.', '_' and '-'")
        if self.version is not None and not MODEL_NAME_RE.fullmatch(self.version):
            p.bad(f"{part}.version", self.version, "letters, digits, '.', '_' and '-'")

    def check_strings(self, p: Problems) -> None:
        """controller_path (path, revision and version have patterns of their own) and allow_patterns."""
        part = self.path_name()
        _one_line(p, f"{part}.controller_path", self.controller_path, "a model folder on the controller")
        for i, pattern in enumerate(self.allow_patterns or []):
            where = f"{part}.allow_patterns[{i}]"
            if not _one_line(p, where, pattern, "a file pattern of the download"):
                continue
            if not pattern or pattern.startswith("/") or ".." in pattern.split("/"):
                p.bad(where, pattern, "a file pattern relative to the repository (e.g. '*.safetensors'), not empty, "
                                      "not absolute, without '..'")


class ModelSection(WeightsSection):
    """model: the target model."""

    prefix: ClassVar[str] = "model"
    recurrent_layers: Annotated[bool | None, Leaf("bool", "must be true or false", required=True)] = Field(
        None, description="required: whether the model has recurrent (linear-attention) layers")


class DrafterSection(WeightsSection):
    """drafter: the draft model of DFLASH and DDTREE."""

    prefix: ClassVar[str] = "drafter"


class SpeculativeSection(_Section):
    """speculative: the algorithm and its settings."""

    prefix: ClassVar[str] = "speculative"
    algorithm: AlgorithmChoice = "NONE"
    block_size: Int = Field(None, description="DFLASH and DDTREE: the drafter's block size, 2 to 64")
    budget: Int = Field(None, description=f"DDTREE: the tree's node budget, 1 to {MAX_BUDGET}")
    topk_cap: Int = Field(None, description=f"DDTREE: the top-k cap per node, 1 to {MAX_TOPK_CAP}, at most the budget")
    state_forking: Bool = Field(None, description="DDTREE on recurrent models: per-node recurrent state")
    fused_topk: Bool = Field(None, description="DDTREE: the fused top-k kernel")
    reproduce_state_leak: Bool = Field(None, description="DDTREE: allow the shared-state collapse on purpose")
    budget_schedule: ScheduleList = Field(None, description="DDTREE: a budget per running-batch size, "
                                                            "[{min_batch, budget}, ...] from min_batch 1 up; "
                                                            "speculative.budget is its largest budget")

    def check_schedule(self, p: Problems, max_running: Any) -> list[tuple[int, int]] | None:
        """speculative.budget_schedule (docs/ddtree.md, "Budget schedule"): each entry {min_batch, budget}
        in whole numbers, min_batch from 1 and increasing, budgets within the limits, every entry reachable
        under serving.max_running_requests. Sets speculative.budget to the largest scheduled budget when left
        out; given, it must equal it. Returns the schedule, or None (none, or a problem reported)."""
        raw = self.budget_schedule
        if raw is None:
            return None
        from sgdeploy import schedule as sched

        path, ok = "speculative.budget_schedule", True
        entries: list[tuple[int, int]] = []
        if not raw:
            p.bad(path, raw, "must have at least one entry, e.g. [{min_batch: 1, budget: 64}]")
            return None
        for i, entry in enumerate(raw):
            values = [entry.get(k) for k in ("min_batch", "budget")]
            if set(entry) != {"min_batch", "budget"} or not all(type(v) is int for v in values):
                p.bad(f"{path}[{i}]", entry, "must be a mapping of exactly min_batch and budget, whole numbers "
                                             "(e.g. {min_batch: 4, budget: 32})")
                ok = False
            else:
                entries.append((int(entry["min_batch"]), int(entry["budget"])))
        if not ok:
            return None
        for why in sched.problems(entries, MAX_BUDGET):
            p.bad(path, raw, why)
            ok = False
        if isinstance(max_running, int) and entries[-1][0] > max_running:
            p.bad(path, raw, f"min_batch {entries[-1][0]} is never reached: serving.max_running_requests is "
                             f"{max_running}")
            ok = False
        if not ok:
            return None
        largest = max(b for _, b in entries)
        if self.budget is None:
            self.budget = largest  # derived: the buffers are sized for the largest scheduled budget
        elif self.budget != largest:
            p.bad("speculative.budget", self.budget, f"with speculative.budget_schedule, must equal its largest "
                                                     f"budget ({largest}; the buffers are sized for it), or be "
                                                     "left out (null) to take it from the schedule")
            return None
        return entries

    def check_ddtree(self, p: Problems, recurrent: Any, max_running: Any = None) -> None:
        """DDTREE's budget and top-k cap, and its state switches against the model's recurrent layers.
        Sets the switches left out to false."""
        schedule = self.check_schedule(p, max_running)
        budget, cap, bs = self.budget, self.topk_cap, self.block_size
        raw_spec = p.raw.get("speculative")
        schedule_given = isinstance(raw_spec, dict) and raw_spec.get("budget_schedule") is not None
        if budget is None:
            if not schedule_given:  # else the schedule's problem is reported above
                p.bad("speculative.budget", ABSENT, "required for algorithm DDTREE")
        elif budget < 1 or budget > MAX_BUDGET:
            p.bad("speculative.budget", budget, f"must be between 1 and {MAX_BUDGET}")
        if cap is None:
            p.bad("speculative.topk_cap", ABSENT, "required for algorithm DDTREE")
        elif cap < 1 or cap > MAX_TOPK_CAP:
            p.bad("speculative.topk_cap", cap, f"must be between 1 and {MAX_TOPK_CAP}")
        elif budget is not None and 1 <= budget and cap > budget:
            p.bad("speculative.topk_cap", cap, f"must not exceed speculative.budget ({budget})")
        elif schedule and cap > min(b for _, b in schedule):
            p.bad("speculative.topk_cap", cap, f"must not exceed the smallest budget of speculative.budget_schedule "
                                               f"({min(b for _, b in schedule)})")
        for key in ("state_forking", "fused_topk", "reproduce_state_leak"):
            if getattr(self, key) is None:
                setattr(self, key, False)
        # the largest budget without forking (block_size - 1), when the rule applies
        limit = (bs - 1 if recurrent and not self.state_forking and bs is not None and not self.reproduce_state_leak
                 else None)
        if limit is not None and schedule and max(b for _, b in schedule) > limit:
            p.bad("speculative.budget_schedule", self.budget_schedule,
                  f"on a model with recurrent layers and state_forking off, every scheduled budget must be at most "
                  f"block_size - 1 ({limit}): sibling nodes would share the recurrent state and acceptance "
                  "collapses; turn speculative.state_forking on, or set speculative.reproduce_state_leak: true "
                  "to reproduce the collapse on purpose")
        elif limit is not None and budget is not None and budget > limit:
            p.bad("speculative.budget", budget,
                  f"on a model with recurrent layers and state_forking off, must be at most block_size - 1 "
                  f"({limit}): sibling nodes would share the recurrent state and acceptance collapses; "
                  "turn speculative.state_forking on, or set speculative.reproduce_state_leak: true to "
                  "reproduce the collapse on purpose")
        if self.state_forking and recurrent is False:
            p.bad("speculative.state_forking", True,
                  "only for models with recurrent layers (model.recurrent_layers: true)")
        if self.reproduce_state_leak and (self.state_forking or not recurrent):
            p.bad("speculative.reproduce_state_leak", True,
                  "only with state_forking: false on a model with recurrent layers")


class ServingSection(_Section):
    """serving: where and how the engines run."""

    prefix: ClassVar[str] = "serving"
    gpus: IntList = Field([0], description="GPU indices: tp_size of them per replica")
    tp_size: Int = Field(1, description="tensor-parallel size of each engine")
    host: IP = Field("127.0.0.1", description="the address the service binds")
    port: Int = Field(30000, description="the service's port (the router's with replicas)")
    nccl_port: Int = Field(None, description="default serving.port + 1; not with the router")
    attention_backend: BackendChoice = Field(None, description="required")
    mem_fraction_static: Float = Field(0.85, description="0.1 to 0.98")
    max_running_requests: Int = None
    extra_args: StrList = Field([], description="more SGLang arguments (not the ones the config sets)")
    env: EnvMap = Field({}, description="the service's environment, NAME: value")
    start_timeout_s: Int = 1800
    stop_timeout_s: Int = 600
    drain_timeout_s: Int = 300
    forking_memory_gib: Float = Field(None, description="GiB per GPU left for the forking buffers (the budget "
                                                        "memory rule)")
    replicas: Int = Field(1, description=f"engines behind the router, 1 to {MAX_REPLICAS}")
    router: Bool = Field(None, description="default: true with more than one replica")
    api_key_secret: Str = Field(None, description="the key of the inventory's sglang_secret_env holding the "
                                                  "engines' API key; required when host is not loopback")
    nnodes: Int = Field(1, description=f"hosts one engine spans, 1 to {MAX_NODES} (docs/multinode.md)")
    dist_init_port: Int = Field(None, description="rank 0's port the other ranks join on; default serving.port + 2; "
                                                  "only with nnodes > 1")

    def check_replicas(self, p: Problems) -> tuple[int, bool]:
        """serving.replicas and serving.router → (replicas, router); a bad value counts as one replica."""
        replicas = self.replicas
        if not isinstance(replicas, int):
            replicas = 1
        elif not 1 <= replicas <= MAX_REPLICAS:
            p.bad("serving.replicas", replicas,
                  f"must be between 1 and {MAX_REPLICAS} (engines of tp_size GPUs each)")
            replicas = 1
        router = self.router
        if router is None:
            router = replicas > 1
        elif router is False and replicas > 1:
            p.bad("serving.router", router, f"with serving.replicas {replicas} the router must hold serving.port "
                                            "in front of the replicas; leave it out or set it true")
            router = True
        return replicas, router

    def check_gpus(self, p: Problems, replicas: int) -> None:
        """serving.gpus: distinct indices, tp_size of them per replica; serving.tp_size 1 or more."""
        gpus, tp = self.gpus, self.tp_size
        if isinstance(gpus, list):
            if not gpus:
                p.bad("serving.gpus", gpus, "must list at least one GPU index")
            if any(g < 0 for g in gpus):
                p.bad("serving.gpus", gpus, "GPU indices are 0 or more")
            if len(set(gpus)) != len(gpus):
                p.bad("serving.gpus", gpus, "each GPU index may appear only once")
            nodes = self.nnodes if isinstance(self.nnodes, int) and self.nnodes > 1 else 1
            if isinstance(tp, int) and nodes > 1:
                pass  # one engine over several hosts: sgdeploy.multinode checks the GPUs per host
            elif isinstance(tp, int) and replicas == 1 and len(gpus) != tp:
                p.bad("serving.gpus", gpus, f"must list exactly serving.tp_size ({tp}) GPUs")
            elif isinstance(tp, int) and replicas > 1 and len(gpus) != tp * replicas:
                p.bad("serving.gpus", gpus, f"must list serving.replicas x serving.tp_size ({replicas} x {tp} = "
                                            f"{replicas * tp}) GPUs: replica i runs on gpus[i*tp_size:(i+1)*tp_size]")
        if isinstance(tp, int) and tp < 1:
            p.bad("serving.tp_size", tp, "must be 1 or more")

    def check_ports(self, p: Problems, replicas: int, router: bool) -> None:
        """serving.port and serving.nccl_port. Sets the NCCL port left out (serving.port + 1, or + 2 with
        the router)."""
        port = self.port
        top = 65535 - (2 * replicas if router else 0)
        bottom = 1025 if router else 1024
        if isinstance(port, int) and not bottom <= port <= top:
            p.bad("serving.port", port, f"must be between {bottom} and {top}" +
                  (f" (with the router, its metrics take the port below it and its {replicas} replica(s) the "
                   f"{2 * replicas} ports above it)" if router else ""))
            port = None
        nccl = self.nccl_port
        if router and nccl is not None:
            p.bad("serving.nccl_port", nccl, "not with the router: replica i takes port serving.port + 1 + 2i and "
                                             "NCCL port serving.port + 2 + 2i; leave nccl_port out")
        if router and isinstance(port, int):
            self.nccl_port = port + 2
        elif router:
            return
        elif nccl is None and isinstance(port, int):
            self.nccl_port = port + 1 if port < 65535 else port - 1
        elif isinstance(nccl, int) and (not 1024 <= nccl <= 65535 or nccl == port):
            p.bad("serving.nccl_port", nccl, "must be between 1024 and 65535 and differ from serving.port")

    def check_numbers(self, p: Problems) -> None:
        """serving.mem_fraction_static, max_running_requests and the timeouts: within their bounds."""
        mem = self.mem_fraction_static
        if isinstance(mem, float) and not 0.1 <= mem <= 0.98:
            p.bad("serving.mem_fraction_static", mem, "must be between 0.1 and 0.98")
        mrr = self.max_running_requests
        if isinstance(mrr, int) and mrr < 1:
            p.bad("serving.max_running_requests", mrr, "must be 1 or more")
        for key in ("start_timeout_s", "stop_timeout_s", "drain_timeout_s"):
            t = getattr(self, key)
            if isinstance(t, int) and not 1 <= t <= 86400:
                p.bad(f"serving.{key}", t, "must be between 1 and 86400 seconds (a timeout of 0 never gives up)")

    def check_extra_args(self, p: Problems) -> None:
        """No argument may set a managed field, in any spelling SGLang's parser takes (sgdeploy.sglang_flags)."""
        from sgdeploy import sglang_flags

        for i, arg in enumerate(self.extra_args or []):
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
                p.bad(f"serving.extra_args[{i}]", arg, f"{spelled}: {MANAGED_DESTS[dest]}")
            else:
                p.bad(f"serving.extra_args[{i}]", arg, f"{spelled} is set from the config's own fields "
                                                       f"({MANAGED_DESTS[dest]}); set those instead")

    def check_env(self, p: Problems) -> None:
        for key, value in (self.env or {}).items():
            why = MANAGED_ENV.get(key) or next((w for x, w in MANAGED_ENV_PREFIXES.items() if key.startswith(x)), None)
            if why:
                p.bad(f"serving.env.{key}", value, f"{key} may not be set in serving.env: {why}")

    def check_api_key_secret(self, p: Problems) -> None:
        """serving.api_key_secret names the engines' API key in the inventory's sglang_secret_env (Vault);
        required when the service binds an address other hosts reach."""
        name = self.api_key_secret
        if name is None:
            if isinstance(self.host, str) and not is_loopback(self.host):
                p.bad("serving.api_key_secret", ABSENT, f"required with serving.host {self.host} (not loopback): "
                      "name the engines' API key in the inventory's sglang_secret_env; engines and router then "
                      "refuse requests without it")
            return
        if not ENV_NAME_RE.fullmatch(name):
            p.bad("serving.api_key_secret", name, "the name of a key of the inventory's sglang_secret_env: letters, "
                                                  "digits and _")
        elif name in MANAGED_ENV or any(name.startswith(x) for x in MANAGED_ENV_PREFIXES):
            p.bad("serving.api_key_secret", name, "a name of sglang_secret_env that the unit does not manage (not "
                                                  f"{', '.join(MANAGED_ENV_PREFIXES)}*, nor a variable the unit sets)")

    def check_strings(self, p: Problems) -> None:
        for i, arg in enumerate(self.extra_args or []):
            where = f"serving.extra_args[{i}]"
            if _one_line(p, where, arg, "each is one argument of the unit's ExecStart") and arg == "":
                p.bad(where, arg, "an argument of the unit's ExecStart: must not be empty")
        for key, value in (self.env or {}).items():
            _one_line(p, f"serving.env.{key}", value, "a value of the service's environment file")


class _Gates(_Section):
    """gates: the thresholds of the deploy's gates (keys, kinds, defaults and bounds: sgdeploy.gate_schema)."""

    prefix: ClassVar[str] = "gates"

    def check_bounds(self, p: Problems, algo: Any) -> None:
        """Each given gate within its bounds (sgdeploy.gate_schema.check), replaced by the checked value."""
        for key in type(self).model_fields:
            g = getattr(self, key)
            if g is not None:
                try:
                    setattr(self, key, gate_schema.check(key, g))
                except ValueError as exc:
                    p.bad(f"gates.{key}", g, str(exc))
        mal = getattr(self, "min_accept_length", None)
        if isinstance(mal, float) and algo == "NONE" and mal > 1:
            p.bad("gates.min_accept_length", mal,
                  "an autoregressive config accepts exactly 1 token per step; use at most 1 or leave it out")


# The gates section is defined once, in sgdeploy.gate_schema (the gate reads the same definition).
if TYPE_CHECKING:
    GatesSection = _Gates
else:
    GatesSection = create_model(
        "GatesSection", __base__=_Gates, __doc__=_Gates.__doc__,
        **{key: (GATE_TYPES[f.kind], Field(f.default, description=f.allowed)) for key, f in gate_schema.FIELDS.items()})


class WatchSection(_Section):
    """watch: the post-deploy watch (docs/monitoring-watch.md): after the gates passed, the engine's live /metrics
    are read every interval_s for window_s; failure_limit consecutive failed intervals roll the deploy back."""

    prefix: ClassVar[str] = "watch"
    # Off by default: a watch only judges live traffic, which a deploy cannot assume (with none every interval is
    # inconclusive and the deploy waits its window for nothing), and live thresholds are the operator's to choose.
    enabled: Bool = Field(False, description="watch the new engine's live metrics after the gates (the canary's "
                                             "with replicas)")
    window_s: Int = Field(300, description="how long the watch reads, in seconds (1 to 86400)")
    interval_s: Int = Field(30, description="seconds per interval (1 to window_s)")
    failure_limit: Int = Field(3, description="consecutive failed intervals that roll back (1 to the window's "
                                              "intervals)")
    min_requests: Int = Field(10, description="requests finished per interval below which it is inconclusive")
    min_accept_length: Float = Field(None, description="live accept length minimum; default gates.min_accept_length;"
                                                       " 0: none")
    min_tokens_per_s: Float = Field(None, description="generated tokens/s minimum over an interval; default none "
                                                      "(live throughput follows demand)")
    max_error_rate: Float = Field(0.05, description="aborted / finished requests per interval, 0 to 1")

    def check_bounds(self, p: Problems, algo: Any) -> None:
        """Each number within its bounds, and the interval, limit and window consistent with each other."""
        window, interval, limit = self.window_s, self.interval_s, self.failure_limit
        if isinstance(window, int) and not 1 <= window <= 86400:
            p.bad("watch.window_s", window, "must be between 1 and 86400 seconds")
            window = None
        if isinstance(interval, int) and interval < 1:
            p.bad("watch.interval_s", interval, "must be 1 or more seconds")
            interval = None
        elif isinstance(interval, int) and isinstance(window, int) and interval > window:
            p.bad("watch.interval_s", interval, f"must be at most watch.window_s ({window})")
            interval = None
        if isinstance(limit, int) and limit < 1:
            p.bad("watch.failure_limit", limit, "must be 1 or more")
        elif isinstance(limit, int) and isinstance(window, int) and isinstance(interval, int) \
                and limit > window // interval:
            p.bad("watch.failure_limit", limit,
                  f"must be at most the window's {window // interval} intervals (window_s {window} / interval_s "
                  f"{interval}), else the watch never fails")
        if isinstance(self.min_requests, int) and self.min_requests < 1:
            p.bad("watch.min_requests", self.min_requests, "must be 1 or more")
        mal = self.min_accept_length
        if isinstance(mal, float) and not (math.isfinite(mal) and mal >= 0):
            p.bad("watch.min_accept_length", mal, "must be a number of 0 or more (0: no minimum)")
        elif isinstance(mal, float) and algo == "NONE" and mal > 1:
            p.bad("watch.min_accept_length", mal,
                  "an autoregressive config accepts exactly 1 token per step; use at most 1 or leave it out")
        tps = self.min_tokens_per_s
        if isinstance(tps, float) and not (math.isfinite(tps) and tps >= 0):
            p.bad("watch.min_tokens_per_s", tps, "must be a number of 0 or more (0: no minimum)")
        mer = self.max_error_rate
        if isinstance(mer, float) and not (math.isfinite(mer) and 0 <= mer <= 1):
            p.bad("watch.max_error_rate", mer, "must be between 0 and 1 (aborted / finished requests)")


_S = TypeVar("_S", bound=_Section)


def _validated(section: _S | None, name: str) -> _S:
    """A section of a validated config. `ConfigModel._mapping` validates each of its `sections` even when
    left out or null (as an empty mapping, all its defaults), so they are never None once the fields are
    checked; their fields are typed `X | None` only so that the JSON Schema allows null."""
    if section is None:
        raise AssertionError(f"config section {name} not set after validation")
    return section


class ConfigModel(_Section):
    """A config (configs/*.yml) with its `extends` chain merged in."""

    model_config = ConfigDict(title="sgdeploy config", json_schema_extra={
        "description": "A deploy config of sgdeploy (configs/*.yml; docs/design.md). A config may extend "
                       "another (extends: NAME) and then gives only what differs; null unsets a parent's value. "
                       "Generated by `sgdeploy schema` from sgdeploy/config_model.py; `sgdeploy validate` "
                       "checks the rules between fields as well."})
    sections: ClassVar[tuple[str, ...]] = ("model", "speculative", "serving", "gates", "watch")

    extends: Str = Field(None, description="the parent config's name (a file beside this one, or in configs/)")
    description: Str = Field("", description=f"one line, at most {MAX_DESCRIPTION} characters (the unit's header)")
    model: ModelSection | None = None
    drafter: DrafterSection | None = None
    speculative: SpeculativeSection | None = None
    serving: ServingSection | None = None
    gates: GatesSection | None = None
    watch: WatchSection | None = None

    # The sections set by validation (see `_validated`), for the after-validator and `check`'s callers.
    @property
    def checked_model(self) -> ModelSection:
        return _validated(self.model, "model")

    @property
    def checked_speculative(self) -> SpeculativeSection:
        return _validated(self.speculative, "speculative")

    @property
    def checked_serving(self) -> ServingSection:
        return _validated(self.serving, "serving")

    @property
    def checked_gates(self) -> GatesSection:
        return _validated(self.gates, "gates")

    @property
    def checked_watch(self) -> WatchSection:
        return _validated(self.watch, "watch")

    @classmethod
    def _first(cls, p: Problems) -> None:
        """The config's name (its file name): it names the units and the files beside them."""
        name = p.name
        if not NAME_RE.fullmatch(name):
            p.bad("name", name, "config file names are lower-case letters, digits, '.', '_' and '-'")
        elif len(name) > MAX_NAME:
            p.bad("name", name, f"at most {MAX_NAME} characters ({len(name)} given): the unit "
                                f"sglang-<name>-r<i>.service and the files beside it must fit a file name")
        else:
            for reserved, why in RESERVED_NAME_RES:
                if reserved.search(name):
                    p.bad("name", name, why)

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> "ConfigModel":
        """The rules between fields, after every field's own check. Sets what follows from the others:
        serving.replicas and router (resolved), serving.nccl_port, DDTREE's switches, the gates' values."""
        p = _problems(info)
        model, spec, serving = self.checked_model, self.checked_speculative, self.checked_serving
        algo = spec.algorithm
        self._check_algorithm_fields(p)
        if algo == "DDTREE":
            spec.check_ddtree(p, model.recurrent_layers, serving.max_running_requests)
        model.check_source(p)
        if self.drafter is not None and algo != "NONE":
            self.drafter.check_source(p)
        replicas, router = serving.check_replicas(p)
        serving.check_gpus(p, replicas)
        serving.check_ports(p, replicas, router)
        serving.replicas, serving.router = replicas, router
        multinode.check(serving, p)
        serving.check_numbers(p)
        serving.check_extra_args(p)
        serving.check_env(p)
        serving.check_api_key_secret(p)
        self._check_forking_memory(p)
        self._check_strings(p)
        self.checked_gates.check_bounds(p, algo)
        self.checked_watch.check_bounds(p, algo)
        return self

    def _check_algorithm_fields(self, p: Problems) -> None:
        """Algorithm-specific fields: only for the algorithms that take them (named as written, even of the
        wrong type); a drafter and a block size for DFLASH and DDTREE."""
        spec = self.checked_speculative
        algo = spec.algorithm
        raw = p.raw.get("speculative")
        raw_spec: dict[Any, Any] = raw if isinstance(raw, dict) else {}
        allowed = set() if algo is None else SPEC_FIELDS_BY_ALGORITHM.get(algo, set())
        for key in ("block_size", "budget", "topk_cap", "state_forking", "fused_topk", "reproduce_state_leak",
                    "budget_schedule"):
            if key in raw_spec and raw_spec[key] is not None and key not in allowed:
                users = [a for a, keys in SPEC_FIELDS_BY_ALGORITHM.items() if key in keys]
                p.bad(f"speculative.{key}", raw_spec[key], f"only for algorithm {' or '.join(users)}, not {algo}")
        if algo == "NONE" and p.raw.get("drafter") is not None:
            p.bad("drafter", p.raw.get("drafter"), "a drafter is only for algorithm DFLASH or DDTREE, not NONE")
        if algo in ("DFLASH", "DDTREE"):
            if self.drafter is None:
                p.bad("drafter.path", ABSENT, f"required for algorithm {algo}")
            bs = spec.block_size
            if bs is None:
                p.bad("speculative.block_size", ABSENT, f"required for algorithm {algo}")
            elif bs < 2 or bs > 64:
                p.bad("speculative.block_size", bs, "must be between 2 and 64")

    def _check_forking_memory(self, p: Problems) -> None:
        """The budget memory rule (sgdeploy.budget): with state forking on, every tree node of every
        running request holds its own recurrent state, so the budget is bounded by the memory left
        after weights and KV cache. Checked when the config says how much that is."""
        spec, serving, model_path = self.checked_speculative, self.checked_serving, self.checked_model.path
        gib = serving.forking_memory_gib
        if gib is None:
            return
        if gib <= 0:
            p.bad("serving.forking_memory_gib", gib, "must be above 0 (GiB per GPU left for the forking buffers)")
            return
        if spec.algorithm != "DDTREE" or not spec.state_forking or not isinstance(spec.budget, int):
            return
        from sgdeploy import budget as budget_rule

        shape = budget_rule.shape_for_model(str(model_path))
        if shape is None:
            known = ", ".join(budget_rule.KNOWN_SHAPES)
            p.bad("serving.forking_memory_gib", gib, f"the recurrent shape of model {model_path!r} is not "
                  f"known to sgdeploy.budget (known: {known}); add it there or leave this field out")
            return
        requests = serving.max_running_requests
        if not isinstance(requests, int) or requests < 1:
            p.bad("serving.max_running_requests", requests, "required with serving.forking_memory_gib: the forking "
                  "buffers grow with the number of running requests")
            return
        tp = serving.tp_size if isinstance(serving.tp_size, int) else 1
        if not math.isfinite(gib):  # before issue 35: a traceback (inf), or a line that blamed serving.tp_size (nan)
            p.bad("serving.forking_memory_gib", gib, "must be a finite number above 0 (GiB per GPU left for the "
                                                     "forking buffers)")
            return
        try:
            largest = budget_rule.max_ddtree_budget(shape, max_running_requests=requests,
                                                    memory_left_bytes=int(gib * 2**30), tp_size=tp)
            need = budget_rule.forking_buffer_bytes(shape, spec.budget, requests, tp) / 2**30
        except ValueError as exc:
            p.bad("serving.tp_size", tp, str(exc))
            return
        if largest is not None and spec.budget > largest:
            sized = (" (the largest of speculative.budget_schedule: the buffers are sized for it)"
                     if spec.budget_schedule else "")
            p.bad("speculative.budget", spec.budget,
                  f"the forking buffers of {model_path} at {requests} running request(s) need {need:.1f} GiB "
                  f"per GPU, serving.forking_memory_gib allows {gib:g}: the largest budget that fits is {largest}"
                  + sized)

    def _check_strings(self, p: Problems) -> None:
        """Every config string that reaches the unit, the env file or a command on the host: one line
        of printable text, and paths without `..`. The unit template and render quote what remains
        (`%`, `$`, quotes, backslashes, spaces), so a value is always one argument or one comment."""
        desc = self.description
        if _one_line(p, "description", desc, "the description goes into the unit's header comment") and \
                isinstance(desc, str) and len(desc) > MAX_DESCRIPTION:
            p.bad("description", desc, f"at most {MAX_DESCRIPTION} characters (it goes into the unit's header "
                                       "comment)")
        self.checked_serving.check_strings(p)
        for m in (self.model, self.drafter):
            if m is not None:
                m.check_strings(p)


# --------------------------------------------------------------------------------------------------
# Helpers of the rules


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


def _control_characters(text: str) -> list[str]:
    """The characters of `text` that end a line or a shell word, or that a terminal acts on:
    newline, carriage return, NUL, tab, escape, the Unicode line and paragraph separators."""
    return sorted({c for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def _one_line(p: Problems, path: str, value: Any, what: str) -> bool:
    """False (and a problem naming the characters) when a string holds a control character."""
    if not isinstance(value, str):
        return True
    bad = _control_characters(value)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        p.bad(path, value, f"{what}: one line of printable text, without newline, tab or other control "
                           f"characters (found {shown})")
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Entry points


def check(merged: dict[str, Any], source: Path, name: str) -> ConfigModel:
    """The validated model of a merged config, or ConfigError with every problem found."""
    p = Problems(source, name, merged if isinstance(merged, dict) else {})
    model = ConfigModel.model_validate(merged, context={"problems": p})
    if p.lines:
        raise ConfigError(p.lines)
    return model


def schema_table() -> dict[str, Any]:
    """Each section's leaves as (kind, default): {"extends": ("str", None), "model": {...}, ...}."""
    def table(cls: type[_Section]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            leaf = _leaf_of(field)
            out[name] = (leaf.kind, field.get_default(call_default_factory=True)) if leaf else \
                table(_section_class(field.annotation))
        return out
    return table(ConfigModel)


def _section_class(annotation: Any) -> type[_Section]:
    return next(a for a in annotation.__args__ if isinstance(a, type) and issubclass(a, _Section))


SCHEMA_URL = "../docs/config.schema.json"  # as the configs' editor line names it (configs/*.yml)


def json_schema() -> str:
    """The JSON Schema of a config file (docs/config.schema.json), for editors: the fields, their types
    and defaults. The rules between fields are sgdeploy's (`sgdeploy validate`)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              **ConfigModel.model_json_schema(mode="validation")}
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"
