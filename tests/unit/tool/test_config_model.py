"""The pydantic models of sgdeploy.config_model against the validator they replaced (issue 35).

`old_spec_validate` is sgdeploy/spec.py's hand-written validator as it was, frozen: for thousands of configs
(the shipped ones and a few more, each field set to every kind of wrong value, left out, unknown fields
beside them, sections of the wrong type, several mistakes at once, names the units refuse) both must give
the same problem lines, in the same order, or the same Config (the same `sgdeploy config` YAML).
And docs/config.schema.json is what `sgdeploy schema` writes, and every shipped config names it.
"""

from __future__ import annotations

import copy
import datetime
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import old_spec_validate as old
import pytest

from sgdeploy import config_model, spec

ROOT = Path(__file__).resolve().parents[3]
SOURCE = Path("configs/case.yml")

# Values of every kind a YAML file gives, wrong for most fields and right for some; strings with the
# characters the unit must never get (newline, tab, escape, NUL, the Unicode line separator).
VALUES: list[Any] = [
    None, "", "x", "two\nlines", "tab\there", "esc\x1b[31m", "nul\x00", "sep\u2028x", "  ", 0, -1, 1, 2, 3, 8, 15,
    16, 17, 63, 64, 65, 256, 257, 1023, 1024, 30000, 65534, 65535, 65536, 86400, 86401, 2**70, 0.0, 0.05, 0.5,
    0.99, 1.0, 1.5, 6.0, 150.0, -0.5, float("nan"), float("inf"), True, False, [], [0], [1], [0, 0], [0, 1], [-1],
    [True], [0.0], ["a"], ["a", 1], ["", "b"], ["x\ny"], ["--port", "1"], ["--api-key", "k"], ["--tp", "2"],
    ["--mem-frac=0.5"], ["--trust-remote-code"], ["-", "-5", "--config"], ["*.safetensors", "/abs", "../up", ""],
    {}, {"A": 1}, {"A": "x\ny"}, {"A": True, "B": 1.5}, {"LD_PRELOAD": "x"}, {"PATH": "/bin"}, {"bad name": 1},
    {"A": None}, {"A": [1]}, {1: "x"}, {"new\nline": "x"}, datetime.date(2024, 1, 1), "../x", "/abs/ok",
    "/abs/../up", "/with space", "relative/dir", "org/name", "org/name/extra", "main", "v1.0", "bad rev",
    "0.0.0.0", "::1", "127.0.0.1", "10.1.2.3", "localhost", "NONE", "DFLASH", "DDTREE", "ddtree", "triton", "fa3",
    "hf", "path", "controller", "API_KEY", "HF_TOKEN", "LD_X", "PYTHONX", "bad-name", "fail", "warn", "maybe",
    "x" * 201, "Qwen/Qwen3.6-27B", "moonshotai/Kimi-K2.6",
]
NAMES = ["case", "a", "Bad", "-x", "x y", "router", "router-30000", "routerx", "x-r0", "x-r12", "x-rx", "a" * 200,
         "a" * 201, "ok.name_1-2", "x\ny"]


def _shipped() -> dict[str, dict[str, Any]]:
    """The shipped configs the old validator knows: not those with speculative.budget_schedule (issue 38, after it;
    their checks: test_schedule.py)."""
    configs = {p.stem: spec.load_merged(p) for p in sorted(spec.CONFIG_DIR.glob("*.yml"))}
    return {k: v for k, v in configs.items() if "budget_schedule" not in (v.get("speculative") or {})}


def _bases(model_folder: str) -> dict[str, dict[str, Any]]:
    """The shipped configs merged, and configs that reach the rules they leave out."""
    qwen = spec.load_merged(spec.CONFIG_DIR / "ddtree-b15.yml")
    extra = {
        "path-dflash": {"model": {"source": "path", "path": "/mnt/models/Target", "recurrent_layers": False},
                        "drafter": {"source": "path", "path": "/mnt/models/Draft"},
                        "speculative": {"algorithm": "DFLASH", "block_size": 16},
                        "serving": {"attention_backend": "fa3", "gpus": [2], "port": 31000}},
        "controller-ar": {"description": "from the controller",
                          "model": {"source": "controller", "controller_path": model_folder, "version": "v1",
                                    "recurrent_layers": False},
                          "serving": {"attention_backend": "triton", "host": "0.0.0.0", "api_key_secret": "API_KEY",
                                      "env": {"NCCL_DEBUG": "INFO", "FLAG": True, "N": 3},
                                      "extra_args": ["--trust-remote-code", "--chunked-prefill-size", "4096"]}},
        "router-ddtree": copy.deepcopy(qwen) | {"serving": {**qwen["serving"], "gpus": [0, 1, 2, 3], "replicas": 2,
                                                             "tp_size": 2, "max_running_requests": 8,
                                                             "forking_memory_gib": 40.0}},
        "hf-patterns": {"model": {"path": "a/b", "revision": "main", "recurrent_layers": True,
                                  "allow_patterns": ["*.json", "*.safetensors"]},
                        "speculative": {"algorithm": "DDTREE", "block_size": 16, "budget": 15, "topk_cap": 4,
                                        "reproduce_state_leak": False, "fused_topk": True},
                        "drafter": {"path": "c/d", "revision": "0123abc"},
                        "serving": {"attention_backend": "flashinfer", "nccl_port": 40000},
                        "gates": {"min_accept_length": 2.5, "exactness_inconclusive": "warn"}},
    }
    # The old validator predates serving.nnodes (issue 37): the configs over several hosts are
    # tests/unit/tool/test_multinode.py's.
    shipped = {k: v for k, v in _shipped().items() if "nnodes" not in (v.get("serving") or {})}
    return {**shipped, **extra}


def _leaves(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, sub in schema.items():
        out.extend(_leaves(sub, (*prefix, key)) if isinstance(sub, dict) else [(*prefix, key)])
    return out


LEAVES = _leaves(old.SCHEMA)
SECTIONS = [k for k, v in old.SCHEMA.items() if isinstance(v, dict)]


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


def _drop(config: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    node = out
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)
    return out


def _outcome(validate, merged: dict[str, Any], name: str) -> tuple[str, Any]:
    try:
        config = validate(copy.deepcopy(merged), SOURCE, name)
    except spec.ConfigError as exc:
        # The section watch (issue 36) came after the old validator was frozen: the top level's allowed fields
        # name it too (its own checks: test_watch_section_* below).
        # So did speculative.budget_schedule (issue 38; its own checks: test_schedule.py), and serving.nnodes and
        # serving.dist_init_port (issue 37; test_multinode.py checks them).
        return "problems", [p.replace("serving, gates, watch", "serving, gates")
                            .replace("reproduce_state_leak, budget_schedule", "reproduce_state_leak")
                            .replace(", nnodes, dist_init_port", "")
                            for p in exc.problems]
    except (OverflowError, ValueError) as exc:  # the old validator's one crash (below)
        return "crash", repr(exc)
    return "config", repr(config)  # every field, with its type (1 and 1.0 differ)


# The one difference, a fix: serving.forking_memory_gib .inf crashed the old validator (OverflowError) and
# .nan gave a line that blamed serving.tp_size; now both are one line naming forking_memory_gib.
NAN_LINE = re.compile(rf"{re.escape(str(SOURCE))}: serving\.tp_size: \d+: cannot convert float NaN to integer")
FINITE = "must be a finite number above 0 (GiB per GPU left for the forking buffers)"


def _fixed(want: tuple[str, Any], got: tuple[str, Any]) -> bool:
    """The old outcome was the crash or the NaN line, and the new one names forking_memory_gib instead."""
    if not (want[0] == "crash" or (want[0] == "problems" and any(NAN_LINE.fullmatch(x) for x in want[1]))):
        return False
    if got[0] != "problems" or not any(line.endswith(FINITE) for line in got[1]):
        return False
    rest = [line for line in got[1] if not line.endswith(FINITE)]
    return want[0] == "crash" or rest == [line for line in want[1] if not NAN_LINE.fullmatch(line)]


def _cases(model_folder: str) -> list[tuple[str, dict[str, Any], str]]:
    bases = _bases(model_folder)
    rng = random.Random(35)
    cases: list[tuple[str, dict[str, Any], str]] = []
    names = list(bases)
    # Every value in every field, on the bases in turn (so each rule meets each value on some base).
    for i, leaf in enumerate(LEAVES):
        for j, value in enumerate(VALUES):
            base_name = names[(i + j) % len(names)]
            cases.append((f"{base_name} {'.'.join(leaf)}={value!r}", _set(bases[base_name], leaf, value), "case"))
    for value in (float("inf"), float("nan"), float("-inf")):  # the fix (NAN_LINE), where the rule reaches them
        cases.append((f"forking_memory_gib={value}", _set(bases["router-ddtree"], ("serving", "forking_memory_gib"),
                                                             value), "case"))
    for base_name, base in bases.items():
        cases.append((f"{base_name} as shipped", base, "case"))
        for leaf in LEAVES:
            cases.append((f"{base_name} without {'.'.join(leaf)}", _drop(base, leaf), "case"))
        for section in SECTIONS:
            for value in (None, 5, "x", [], [1], True):
                cases.append((f"{base_name} {section}={value!r}", _set(base, (section,), value), "case"))
            for key in ("typo", "Path", "recurent_layers", "algoritm", "gpu", "min_accept", "a\nb", 7, "budget"):
                cases.append((f"{base_name} {section}.{key!r}", _set(base, (section, key), 1), "case"))
        for key in ("modle", "serving_", "x\ny", 3, "drafters"):
            cases.append((f"{base_name} top-level {key!r}", _set(base, (key,), {"a": 1}), "case"))
        for name in NAMES:
            cases.append((f"{base_name} named {name!r}", base, name))
        for i in range(60):  # several mistakes at once, in different sections
            merged = base
            for leaf in rng.sample(LEAVES, rng.randint(2, 5)):
                merged = _set(merged, leaf, rng.choice(VALUES)) if rng.random() < 0.85 else _drop(merged, leaf)
            cases.append((f"{base_name} mixed {i}", merged, rng.choice(NAMES[:3])))
    return cases


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("controller") / "Tiny-Model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return str(folder)


def test_the_models_give_the_old_validators_lines_and_configs(model_folder):
    cases = _cases(model_folder)
    assert len(cases) > 8000
    kinds = {"problems": 0, "config": 0, "crash": 0, "fixed": 0}
    differ = []
    for what, merged, name in cases:
        want, got = _outcome(old.validate, merged, name), _outcome(spec.validate, merged, name)
        kinds[want[0]] += 1
        if want != got and _fixed(want, got):
            kinds["fixed"] += 1
        elif want != got:
            differ.append(f"{what}:\n  old: {want}\n  new: {got}")
    assert not differ, f"{len(differ)} of {len(cases)} differ; first:\n" + "\n".join(differ[:5])
    # Both kinds of outcome are compared, many of each (a validator that refuses everything fails here).
    assert kinds["config"] > 1000 and kinds["problems"] > 5000 and kinds["fixed"] == 2, kinds


def test_a_wrong_value_in_each_section_and_a_rule_are_all_reported_in_order():
    merged = spec.load_merged(spec.CONFIG_DIR / "ddtree-b15.yml")
    merged = _set(_set(_set(merged, ("model", "recurrent_layers"), "yes"), ("serving", "port"), 80),
                  ("gates", "bench_requests"), 0)
    with pytest.raises(spec.ConfigError) as err:
        spec.validate(_set(merged, ("serving", "tpsize"), 2), SOURCE, "case")
    assert err.value.problems == [
        f"{SOURCE}: model.recurrent_layers: 'yes': must be true or false",
        f"{SOURCE}: serving.tpsize: 2: unknown field (did you mean 'tp_size'?); allowed: "
        + ", ".join(config_model.ServingSection.model_fields),
        f"{SOURCE}: serving.port: 80: must be between 1024 and 65535",
        f"{SOURCE}: gates.bench_requests: 0: give a whole number of 1 or more",
    ]


def test_the_committed_json_schema_is_what_sgdeploy_schema_writes(tmp_path):
    committed = (ROOT / "docs" / "config.schema.json").read_text()
    assert committed == config_model.json_schema(), "docs/config.schema.json is stale: run `sgdeploy schema`"
    out = tmp_path / "schema.json"
    result = subprocess.run([sys.executable, "-m", "sgdeploy", "schema", "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == committed
    schema = json.loads(committed)
    assert schema["additionalProperties"] is False
    assert list(schema["properties"]) == [*old.SCHEMA, "watch"]  # watch: issue 36, after the old validator


def test_every_shipped_config_names_the_schema_on_its_first_line():
    for path in sorted(spec.CONFIG_DIR.glob("*.yml")):
        first = path.read_text().splitlines()[0]
        assert first == f"# yaml-language-server: $schema={config_model.SCHEMA_URL}", path


def test_the_schema_takes_every_shipped_config_and_flags_what_an_editor_should():
    jsonschema = pytest.importorskip("jsonschema")  # ansible-lint's dependency; the editors' own validator
    schema = json.loads((ROOT / "docs" / "config.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted(spec.CONFIG_DIR.glob("*.yml")):  # as written: a child config gives only what differs
        assert not list(validator.iter_errors(spec.load_merged(path) | {"extends": "x"})), path
        assert not list(validator.iter_errors(old.yaml.safe_load(path.read_text()))), path
    for wrong in ({"serving": {"port": "x"}}, {"serving": {"hostt": "127.0.0.1"}}, {"speculative": {"algorithm": "X"}},
                  {"model": {"recurrent_layers": "yes"}}, {"gates": {"bench_requests": 1.5}}, {"modle": {}},
                  {"serving": {"env": {"bad name": "1"}}}, {"drafter": {"allow_patterns": "*.json"}}):
        assert list(validator.iter_errors(wrong)), wrong
