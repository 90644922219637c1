"""Spec configs: every shipped config validates; bad configs exit 2 naming file, field and value."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from sgdeploy import cli, spec

REPO = Path(__file__).resolve().parents[3]
SHIPPED = spec.available()
REQUIRED_CONFIGS = {"ar", "dflash-b16", "ddtree-b15", "ddtree-b32", "ddtree-b64", "ddtree-b15-nofork",
                    "ddtree-b64-nofork", "kimi-k2.6-ddtree-b64-tp8"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`sgdeploy ARGS` in this process (as fast as a function call): its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return subprocess.CompletedProcess(["sgdeploy", *args], code, out.getvalue(), err.getvalue())


def test_the_real_command_exits_2_without_a_traceback(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("extends: ddtree-b15\nspeculative: {budget: 0}\n")
    result = subprocess.run([sys.executable, "-m", "sgdeploy", "config", str(path)], capture_output=True, text=True,
                            cwd=REPO, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"{path}: speculative.budget: 0: must be between 1 and {spec.MAX_BUDGET}\n"


def test_required_configs_are_shipped():
    assert REQUIRED_CONFIGS <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_is_valid(name):
    config = spec.load(name)
    assert config.name == name
    assert len(config.serving.gpus) * config.serving.nnodes == config.serving.tp_size


def test_features_select_patches():
    assert spec.load("ddtree-b15").patch_features == ("ddtree", "fork", "topk")
    assert spec.load("ddtree-b64-nofork").patch_features == ("ddtree",)
    assert spec.load("kimi-k2.6-ddtree-b64-tp8").patch_features == ("ddtree", "topk")
    assert spec.load("ar").patch_features == ()
    assert spec.load("dflash-b16").patch_features == ()


def test_kimi_is_tp8_over_all_gpus_without_recurrent_layers():
    kimi = spec.load("kimi-k2.6-ddtree-b64-tp8")
    assert kimi.serving.tp_size == 8 and kimi.serving.gpus == tuple(range(8))
    assert kimi.model.recurrent_layers is False and kimi.speculative.budget == 64


@pytest.mark.parametrize("name", SHIPPED)
def test_make_config_output_round_trips(name, tmp_path):
    result = run_cli("config", name)
    assert result.returncode == 0, result.stderr
    path = tmp_path / f"{name}.yml"
    path.write_text(result.stdout)
    reloaded = spec.load(path)
    original = spec.load(name)
    # Same typed content; only the source path differs.
    for part in ("model", "drafter", "speculative", "serving", "gates"):
        assert getattr(reloaded, part) == getattr(original, part), part
    assert yaml.safe_load(result.stdout).get("extends") is None


BASE = """
model: {path: Qwen/Qwen3.6-27B, revision: main, recurrent_layers: true}
drafter: {path: z-lab/Qwen3.6-27B-DFlash, revision: main}
speculative: {algorithm: DDTREE, block_size: 16, budget: 15, topk_cap: 8, state_forking: true}
serving: {gpus: [0], tp_size: 1, port: 30000, attention_backend: triton}
"""


def _patched(base: str, patch: dict) -> dict:
    return spec.deep_merge(yaml.safe_load(base), patch)


# (case name, patch merged into BASE (None = replace whole text), field path expected in the message,
#  a fragment of what is allowed)
BAD = [
    ("unknown-top", {"modle": {"path": "x"}}, "modle", "did you mean 'model'"),
    ("unknown-nested", {"serving": {"prot": 1}}, "serving.prot", "did you mean 'port'"),
    ("wrong-type-port", {"serving": {"port": "http"}}, "serving.port", "whole number"),
    ("wrong-type-bool", {"model": {"recurrent_layers": "yes"}}, "model.recurrent_layers", "true or false"),
    ("budget-zero", {"speculative": {"budget": 0}}, "speculative.budget", "between 1 and"),
    ("budget-too-big", {"speculative": {"budget": 100000}}, "speculative.budget", "between 1 and"),
    ("cap-zero", {"speculative": {"topk_cap": 0}}, "speculative.topk_cap", "between 1 and"),
    ("cap-above-budget", {"speculative": {"budget": 4, "topk_cap": 8}}, "speculative.topk_cap",
     "must not exceed speculative.budget (4)"),
    ("block-size-1", {"speculative": {"block_size": 1}}, "speculative.block_size", "between 2 and 64"),
    ("gpus-repeated", {"serving": {"gpus": [0, 0], "tp_size": 2}}, "serving.gpus", "only once"),
    ("gpus-vs-tp", {"serving": {"gpus": [0, 1, 2]}}, "serving.gpus", "exactly serving.tp_size (1)"),
    ("port-low", {"serving": {"port": 80}}, "serving.port", "between 1024 and 65535"),
    ("port-high", {"serving": {"port": 70000}}, "serving.port", "between 1024 and 65535"),
    ("bind-not-ip", {"serving": {"host": "localhost"}}, "serving.host", "IP address"),
    ("missing-model", {"model": {"path": None}}, "model.path", "required"),
    ("leak-without-opt-in", {"speculative": {"state_forking": False, "budget": 32}}, "speculative.budget",
     "reproduce_state_leak"),
    ("budget-for-dflash", {"speculative": {"algorithm": "DFLASH", "state_forking": None, "topk_cap": None}},
     "speculative.budget", "only for algorithm DDTREE, not DFLASH"),
    ("drafter-for-none", {"speculative": {"algorithm": "NONE", "block_size": None, "budget": None,
                                          "topk_cap": None, "state_forking": None}},
     "drafter", "only for algorithm DFLASH or DDTREE"),
    ("bad-algorithm", {"speculative": {"algorithm": "EAGLE9"}}, "speculative.algorithm", "NONE, DFLASH, DDTREE"),
    ("bad-backend", {"serving": {"attention_backend": "trtllm_mha"}}, "serving.attention_backend",
     "must be one of"),
    ("managed-flag-in-extra", {"serving": {"extra_args": ["--port=1234"]}}, "serving.extra_args[0]",
     "set from the config's own fields"),
    # Every spelling SGLang 0.5.23's parser takes for a managed field (issue 34): aliases, unique
    # prefixes (argparse's abbreviations), --flag=value; secrets never on the command line.
    ("managed-prefix-tp", {"serving": {"extra_args": ["--trust-remote-code", "--tp", "4"]}},
     "serving.extra_args[1]", "--tp (SGLang reads it as --tp-size) is set from the config's own fields"),
    ("managed-prefix-tp-equals", {"serving": {"extra_args": ["--tp=4"]}}, "serving.extra_args[0]",
     "--tp (SGLang reads it as --tp-size)"),
    ("managed-alias-tensor-parallel", {"serving": {"extra_args": ["--tensor-parallel-size", "4"]}},
     "serving.extra_args[0]", "--tensor-parallel-size (SGLang reads it as --tp-size)"),
    ("managed-alias-model", {"serving": {"extra_args": ["--model=/srv/other"]}}, "serving.extra_args[0]",
     "--model (SGLang reads it as --model-path)"),
    ("managed-prefix-mem", {"serving": {"extra_args": ["--mem-frac", "0.5"]}}, "serving.extra_args[0]",
     "SGLang reads it as --mem-fraction-static"),
    ("managed-prefix-port", {"serving": {"extra_args": ["--po", "1"]}}, "serving.extra_args[0]",
     "SGLang reads it as --port"),
    ("managed-prefix-draft", {"serving": {"extra_args": ["--speculative-draft-model", "/x"]}},
     "serving.extra_args[0]", "set from drafter"),
    ("api-key-in-extra", {"serving": {"extra_args": ["--api-key", "s3cret"]}}, "serving.extra_args[0]",
     "a secret never goes on the command line"),
    ("api-key-equals-in-extra", {"serving": {"extra_args": ["--api-key=s3cret"]}}, "serving.extra_args[0]",
     "serving.api_key_secret"),
    ("api-key-prefix-in-extra", {"serving": {"extra_args": ["--api-k", "s3cret"]}}, "serving.extra_args[0]",
     "--api-k (SGLang reads it as --api-key): a secret"),
    ("admin-api-key-in-extra", {"serving": {"extra_args": ["--admin-api-key", "s3cret"]}}, "serving.extra_args[0]",
     "a secret never goes on the command line"),
    ("config-file-in-extra", {"serving": {"extra_args": ["--config", "/tmp/options.yml"]}}, "serving.extra_args[0]",
     "a file of options could set any of the managed ones"),
    # Environment the unit manages, or that changes what code runs, in serving.env.
    ("env-cuda-visible-devices", {"serving": {"env": {"CUDA_VISIBLE_DEVICES": "1"}}},
     "serving.env.CUDA_VISIBLE_DEVICES", "set from serving.gpus"),
    ("env-ld-preload", {"serving": {"env": {"LD_PRELOAD": "/tmp/x.so"}}}, "serving.env.LD_PRELOAD",
     "may not be set in serving.env: the dynamic loader"),
    ("env-ld-library-path", {"serving": {"env": {"LD_LIBRARY_PATH": "/tmp"}}}, "serving.env.LD_LIBRARY_PATH",
     "the dynamic loader"),
    ("env-pythonpath", {"serving": {"env": {"PYTHONPATH": "/tmp"}}}, "serving.env.PYTHONPATH", "the interpreter"),
    ("env-pythonhome", {"serving": {"env": {"PYTHONHOME": "/tmp"}}}, "serving.env.PYTHONHOME", "the interpreter"),
    ("env-hf-hub-offline", {"serving": {"env": {"HF_HUB_OFFLINE": "0"}}}, "serving.env.HF_HUB_OFFLINE",
     "set by the unit"),
    ("env-transformers-offline", {"serving": {"env": {"TRANSFORMERS_OFFLINE": "0"}}},
     "serving.env.TRANSFORMERS_OFFLINE", "never reaches the Hub"),
    ("env-hf-home", {"serving": {"env": {"HF_HOME": "/tmp/hf"}}}, "serving.env.HF_HOME", "set by the unit"),
    ("bind-all-without-api-key", {"serving": {"host": "0.0.0.0"}}, "serving.api_key_secret",
     "required with serving.host 0.0.0.0 (not loopback)"),
    ("api-key-secret-not-a-name", {"serving": {"api_key_secret": "my key"}}, "serving.api_key_secret",
     "a key of the inventory's sglang_secret_env"),
    ("api-key-secret-managed", {"serving": {"api_key_secret": "LD_PRELOAD"}}, "serving.api_key_secret",
     "that the unit does not manage"),
    ("env-hf-token", {"serving": {"env": {"HF_TOKEN": "hf_x"}}}, "serving.env.HF_TOKEN", "sglang_secret_env"),
    ("timeout-zero", {"serving": {"start_timeout_s": 0}}, "serving.start_timeout_s", "never gives up"),
    ("fork-on-pure-attention", {"model": {"recurrent_layers": False}}, "speculative.state_forking",
     "only for models with recurrent layers"),
    ("env-not-mapping", {"serving": {"env": ["A=1"]}}, "serving.env", "mapping"),
    # Model sources (docs/models.md).
    ("source-unknown", {"model": {"source": "s3"}}, "model.source", "must be one of hf, path, controller"),
    ("hf-without-revision", {"drafter": {"revision": None}}, "drafter.revision", "required for source hf"),
    ("hf-repo-not-org-name", {"model": {"path": "/srv/models/x"}}, "model.path", "ORG/NAME"),
    ("hf-revision-with-slash", {"model": {"revision": "refs/pr/1"}}, "model.revision", "commit hash, branch or tag"),
    ("path-relative", {"model": {"source": "path", "revision": None, "path": "models/x"}}, "model.path",
     "absolute folder on the host"),
    ("path-with-revision", {"model": {"source": "path", "path": "/srv/m"}}, "model.revision",
     "only for source hf, not path"),
    ("controller-without-folder", {"model": {"source": "controller", "path": None, "revision": None}},
     "model.controller_path", "required for source controller"),
    ("controller-folder-missing", {"drafter": {"source": "controller", "path": None, "revision": None,
                                               "controller_path": "/nonexistent/tiny"}},
     "drafter.controller_path", "existing folder on the controller"),
    ("controller-with-revision", {"drafter": {"source": "controller", "path": None,
                                              "controller_path": "/nonexistent/tiny"}},
     "drafter.revision", "only for source hf, not controller"),
    # Strings that reach the unit, the env file or a command on the host (issue 20).
    ("description-with-unit-lines", {"description": "x\n[Service]\nExecStartPre=+/bin/touch /root/x"},
     "description", "one line of printable text, without newline"),
    ("description-with-cr", {"description": "x\rExecStartPre=+/bin/touch /root/x"}, "description", "found '\\r'"),
    ("description-too-long", {"description": "d" * 201}, "description", "at most 200 characters"),
    ("extra-arg-with-newline", {"serving": {"extra_args": ["--x\nExecStartPre=+/bin/touch /root/x"]}},
     "serving.extra_args[0]", "one argument of the unit's ExecStart: one line"),
    ("extra-arg-empty", {"serving": {"extra_args": ["--trust-remote-code", ""]}}, "serving.extra_args[1]",
     "must not be empty"),
    ("env-value-with-newline", {"serving": {"env": {"A": "1\nB=2"}}}, "serving.env.A", "one line of printable"),
    ("env-name-with-newline", {"serving": {"env": {"A\nB": "1"}}}, "serving.env.'A\\nB'", "letters, digits and _"),
    ("path-with-dotdot", {"model": {"source": "path", "revision": None, "path": "/srv/models/../../etc"}},
     "model.path", "without spaces or '..'"),
    ("path-with-semicolon", {"model": {"source": "path", "revision": None, "path": "/srv/m;touch /tmp/x"}},
     "model.path", "letters, digits and '._+@=,-/'"),
    ("path-with-newline", {"model": {"source": "path", "revision": None, "path": "/srv/m\n"}}, "model.path",
     "absolute folder on the host"),
    ("hf-repo-with-newline", {"model": {"path": "Qwen/Qwen3.6-27B\n"}}, "model.path", "ORG/NAME"),
    ("revision-with-newline", {"model": {"revision": "main\n"}}, "model.revision", "commit hash, branch or tag"),
    ("controller-path-with-dotdot", {"drafter": {"source": "controller", "path": None, "revision": None,
                                                 "controller_path": "../models/tiny"}},
     "drafter.controller_path", "without '..'"),
    ("allow-pattern-with-dotdot", {"drafter": {"allow_patterns": ["../../etc/*"]}}, "drafter.allow_patterns[0]",
     "without '..'"),
    ("allow-pattern-absolute", {"drafter": {"allow_patterns": ["/etc/*"]}}, "drafter.allow_patterns[0]",
     "not absolute"),
]


@pytest.mark.parametrize("case,patch,field,allowed", BAD, ids=[b[0] for b in BAD])
def test_bad_config_exits_2_naming_field(case, patch, field, allowed, tmp_path):
    path = tmp_path / f"{case}.yml"
    path.write_text(yaml.safe_dump(_patched(BASE, patch)))
    result = run_cli("config", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [ln for ln in result.stderr.splitlines() if f": {field}:" in ln]
    assert lines, result.stderr
    assert str(path) in lines[0]
    assert allowed in lines[0], lines[0]
    assert result.stdout == ""


def test_a_config_name_that_is_not_a_name_is_refused_naming_what_is_allowed():
    result = run_cli("config", "Ddtree-b15")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "config 'Ddtree-b15': not a config name: names are lower-case letters, digits" in result.stderr


def test_every_problem_is_reported_one_line_each(tmp_path):
    path = tmp_path / "many.yml"
    path.write_text(yaml.safe_dump(_patched(BASE, {"serving": {"port": 1, "host": "nowhere"},
                                                   "speculative": {"budget": 0}})))
    result = run_cli("config", str(path))
    assert result.returncode == 2
    fields = {ln.split(": ")[1] for ln in result.stderr.splitlines()}
    assert {"serving.port", "serving.host", "speculative.budget"} <= fields


def test_reproduce_state_leak_opt_in_allows_the_collapse_config():
    config = spec.load("ddtree-b64-nofork")
    assert config.speculative.budget == 64 and not config.speculative.state_forking


def _write(dirpath: Path, name: str, text: str) -> Path:
    p = dirpath / f"{name}.yml"
    p.write_text(textwrap.dedent(text))
    return p


def test_extends_cycle_is_reported(tmp_path):
    _write(tmp_path, "a", "extends: b\n")
    _write(tmp_path, "b", "extends: a\n")
    result = run_cli("config", str(tmp_path / "a.yml"))
    assert result.returncode == 2
    assert "extends: cycle a -> b -> a" in result.stderr


def test_extends_missing_parent_is_reported(tmp_path):
    _write(tmp_path, "child", "extends: nowhere\n")
    result = run_cli("config", str(tmp_path / "child.yml"))
    assert result.returncode == 2
    assert "extends: 'nowhere' not found" in result.stderr


def test_extends_merges_mappings_and_replaces_lists(tmp_path):
    _write(tmp_path, "parent", BASE + "\ngates: {min_tokens_per_s: 50, smoke_prompt: hi}\n")
    _write(tmp_path, "child", """
        extends: parent
        serving: {extra_args: ["--log-level", "info"]}
        gates: {min_tokens_per_s: 80}
    """)
    config = spec.load(tmp_path / "child.yml")
    assert config.gates.min_tokens_per_s == 80 and config.gates.smoke_prompt == "hi"
    assert config.serving.extra_args == ("--log-level", "info")
    assert config.serving.attention_backend == "triton"


def test_invalid_yaml_is_one_line_without_traceback(tmp_path):
    path = tmp_path / "broken.yml"
    path.write_text("model: {path: [unclosed\n")
    result = run_cli("config", str(path))
    assert result.returncode == 2 and "not valid YAML" in result.stderr and "Traceback" not in result.stderr


def test_unknown_config_name_lists_known_ones():
    result = run_cli("config", "ddtree-b16")
    assert result.returncode == 2
    assert "no config of that name" in result.stderr and "ddtree-b15" in result.stderr


# The budget memory rule (sgdeploy.budget, docs/state-forking.md): 21.8 GiB left on a 96 GB card.
FORKING = {"serving": {"forking_memory_gib": 21.8, "max_running_requests": 8}}


def _forking_case(tmp_path, patch: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "forking.yml"
    path.write_text(yaml.safe_dump(_patched(BASE, spec.deep_merge(FORKING, patch))))
    return run_cli("config", str(path))


def test_budget_memory_rule_accepts_what_fits(tmp_path):
    result = _forking_case(tmp_path, {"speculative": {"budget": 15}})
    assert result.returncode == 0, result.stderr


def test_budget_memory_rule_refuses_a_budget_that_does_not_fit(tmp_path):
    result = _forking_case(tmp_path, {"speculative": {"budget": 64}})
    assert result.returncode == 2
    line = next(ln for ln in result.stderr.splitlines() if ": speculative.budget: 64:" in ln)
    assert "at 8 running request(s) need" in line and "the largest budget that fits is 15" in line


def test_budget_memory_rule_fits_more_with_fewer_requests(tmp_path):
    result = _forking_case(tmp_path, {"speculative": {"budget": 64}, "serving": {"max_running_requests": 1}})
    assert result.returncode == 0, result.stderr


def test_budget_memory_rule_needs_the_request_count(tmp_path):
    result = _forking_case(tmp_path, {"serving": {"max_running_requests": None}})
    assert result.returncode == 2 and ": serving.max_running_requests: " in result.stderr


def test_budget_memory_rule_needs_a_known_model_shape(tmp_path):
    result = _forking_case(tmp_path, {"model": {"path": "Example/Unknown-Hybrid"}})
    assert result.returncode == 2 and "not known to sgdeploy.budget" in result.stderr


def test_extra_args_that_set_nothing_managed_pass():
    """Values, negative numbers and flags SGLang reads as other fields stay allowed."""
    cfg = _patched(BASE, {"serving": {"extra_args": ["--chunked-prefill-size", "-1", "--trust-remote-code",
                                                     "--context-length=8192", "--enable-metrics"]}})
    config = spec.validate(cfg, Path("x.yml"), "x")
    assert config.serving.extra_args[:2] == ("--chunked-prefill-size", "-1")


@pytest.mark.parametrize("name,allowed", [
    ("router-31200", "names starting with 'router-' are the routers' (sglang-router-<port>.service)"),
    ("ddtree-b15-r0", "names ending in -r<number> are the replicas'"),
    ("a" * 250, "at most 200 characters (250 given)"),
])
def test_config_names_that_collide_or_do_not_fit_a_unit_name_are_refused(name, allowed, tmp_path):
    path = tmp_path / f"{name}.yml"
    path.write_text(BASE)
    result = run_cli("config", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"{path}: name: {name!r}: {allowed}" + result.stderr.split(allowed, 1)[1]
                                          .splitlines()[0]], result.stderr


def test_the_longest_allowed_name_fits_a_unit_name_with_room_for_temporary_files():
    longest = f"sglang-{'a' * spec.MAX_NAME}-r{spec.MAX_REPLICAS - 1}.service"
    assert len(longest) + len(".ansible_tmp") + 8 <= 255


def test_flag_resolution_follows_sglangs_parser():
    """The committed table (sgdeploy/sglang_flags.json, checked against the wheel by the slow
    test_sglang_flags.py) resolves as argparse does: exact option strings, aliases, unique prefixes."""
    from sgdeploy import sglang_flags

    assert sglang_flags.resolve("--tp-size") == ("--tp-size", {"tp_size"})
    assert sglang_flags.resolve("--tensor-parallel-size=2") == ("--tensor-parallel-size", {"tp_size"})
    assert sglang_flags.resolve("--tp") == ("--tp", {"tp_size"})
    assert sglang_flags.resolve("--model") == ("--model", {"model_path"})
    assert sglang_flags.resolve("--speculative-ddtree-topk-c") == ("--speculative-ddtree-topk-c",
                                                                    {"speculative_ddtree_topk_cap"})
    # an ambiguous prefix names every field it could be (patch 0005 added --speculative-ddtree-budget-schedule)
    assert sglang_flags.resolve("--speculative-ddtree-b")[1] == {"speculative_ddtree_budget",
                                                                "speculative_ddtree_budget_schedule"}
    assert "api_key" in sglang_flags.resolve("--api")[1]
    assert sglang_flags.resolve("--no-such-flag-at-all") == ("--no-such-flag-at-all", set())


def test_a_config_with_an_api_key_round_trips_through_make_config(tmp_path):
    path = tmp_path / "keyed.yml"
    path.write_text("extends: ddtree-b15\nserving: {host: 0.0.0.0, api_key_secret: SGLANG_ENGINE_KEY}\n")
    result = run_cli("config", str(path))
    assert result.returncode == 0, result.stderr
    again = tmp_path / "again.yml"
    again.write_text(result.stdout)
    assert spec.load(again).serving == spec.load(path).serving
    assert spec.load(again).serving.api_key_secret == "SGLANG_ENGINE_KEY"


def test_the_patched_flags_are_the_series_own_fields():
    """sgdeploy.sglang_flags.PATCHED_FLAGS (not in the pristine table) are exactly the DDTree fields the
    patch series adds to ServerArgs (their option strings are the field names with '-')."""
    import re

    from sgdeploy import sglang_flags

    text = "".join(p.read_text() for p in (REPO / "patches" / "sglang").rglob("*") if p.is_file()
                   and p.suffix in (".patch", ".py"))
    fields = set(re.findall(r"^\+?\s+(speculative_ddtree_[a-z_]+): A\[", text, re.M))
    assert fields == set(sglang_flags.PATCHED_FLAGS.values())
    assert all(opt == "--" + dest.replace("_", "-") for opt, dest in sglang_flags.PATCHED_FLAGS.items())
