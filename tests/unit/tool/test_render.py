"""Rendered units: every shipped config renders and verifies; ExecStart carries exactly the flags."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sgdeploy import cli, render, spec

REPO = Path(__file__).resolve().parents[3]
LABEL = "0123456789ab"
PY = f"/opt/sglang/releases/{LABEL}/venv/bin/python"
MODELS = "/var/lib/sglang/models"
# The unit loads local folders placed by the models role (docs/models.md): no --revision.
COMMON = ["--model-path", f"{MODELS}/Qwen--Qwen3.6-27B/main", "--tp-size", "1", "--host", "127.0.0.1",
          "--port", "30000",
          "--nccl-port", "30001", "--attention-backend", "triton", "--mem-fraction-static", "0.85",
          "--enable-metrics"]
DRAFT = ["--speculative-draft-model-path", f"{MODELS}/z-lab--Qwen3.6-27B-DFlash/main",
         "--speculative-dflash-block-size", "16"]


def ddtree(budget: int, forking: str = "on", topk: str = "fused") -> list[str]:
    return (["--speculative-algorithm", "DDTREE"] + DRAFT +
            ["--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk-cap", "8",
             "--speculative-ddtree-state-forking", forking, "--speculative-ddtree-topk", topk])


EXPECTED = {
    "ar": COMMON,
    "base-qwen3.6-27b": COMMON,
    "dflash-b16": COMMON + ["--speculative-algorithm", "DFLASH"] + DRAFT,
    "ddtree-b15": COMMON + ddtree(15),
    "ddtree-b32": COMMON + ddtree(32),
    "ddtree-b64": COMMON + ddtree(64),
    "ddtree-b15-nofork": COMMON + ddtree(15, "off", "torch"),
    "ddtree-b64-nofork": COMMON + ddtree(64, "off", "torch"),
    "ddtree-sched": COMMON + ddtree(64) + ["--speculative-ddtree-budget-schedule", "1:64,4:32,8:15"],
    "base-kimi-k2.6": ["--model-path", f"{MODELS}/moonshotai--Kimi-K2.6/main", "--tp-size", "8", "--host", "127.0.0.1",
                       "--port", "30000", "--nccl-port", "30001", "--attention-backend", "flashinfer",
                       "--mem-fraction-static", "0.88", "--enable-metrics",
                       "--trust-remote-code"],
}
EXPECTED["kimi-k2.6-ddtree-b64-tp8"] = (
    EXPECTED["base-kimi-k2.6"][:-1]
    + ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", f"{MODELS}/z-lab--Kimi-K2.6-DFlash/main",
       "--speculative-dflash-block-size", "16", "--speculative-ddtree-budget", "64",
       "--speculative-ddtree-topk-cap", "8", "--speculative-ddtree-state-forking", "off",
       "--speculative-ddtree-topk", "fused", "--trust-remote-code"])
# Two hosts, TP 16 (docs/multinode.md): `make render` renders rank 0, which other ranks join at its bind address.
EXPECTED["kimi-k2.6-tp16-2node"] = (
    ["--model-path", f"{MODELS}/moonshotai--Kimi-K2.6/main", "--tp-size", "16", "--host", "127.0.0.1",
     "--port", "30000", "--nccl-port", "30001", "--attention-backend", "flashinfer",
     "--mem-fraction-static", "0.9", "--enable-metrics",
     "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:30002", "--trust-remote-code"])


def render_cli(name: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """`sgdeploy render NAME --json ...` in this process: its exit code and output."""
    args = ["render", name, "--release", LABEL, "--out", str(out), "--json", *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(args)
    return subprocess.CompletedProcess(["sgdeploy", *args], code, stdout.getvalue(), stderr.getvalue())


def exec_start(unit_text: str) -> list[str]:
    line = next(ln for ln in unit_text.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def directives(unit_text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for ln in unit_text.splitlines():
        if "=" in ln and not ln.startswith(("#", "[")):
            k, v = ln.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_every_shipped_config_has_expected_flags():
    assert set(EXPECTED) == set(spec.available())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_render_verifies_and_execstart_is_exact(name, tmp_path):
    result = render_cli(name, tmp_path)  # runs systemd-analyze verify
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    unit_text = Path(info["unit"]).read_text()
    argv = exec_start(unit_text)
    assert argv[0] == PY
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[3:] == EXPECTED[name]


def test_unit_runs_as_dedicated_user_with_gpu_env_and_timeouts(tmp_path):
    info = json.loads(render_cli("kimi-k2.6-ddtree-b64-tp8", tmp_path).stdout)
    d = directives(Path(info["unit"]).read_text())
    assert d["User"] == ["sglang"] and d["Group"] == ["sglang"]
    env = dict(e.split("=", 1) for e in d["Environment"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert env["CUDA_HOME"] == "/usr/local/cuda"
    assert env["PATH"].split(":")[0] == "/usr/local/cuda/bin"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert d["TimeoutStartSec"] == ["3600"] and d["TimeoutStopSec"] == ["900"]
    assert d["KillMode"] == ["mixed"] and d["Restart"] == ["on-failure"]
    assert d["StartLimitBurst"] == ["3"]
    assert d["PrivateDevices"] == ["no"] and d["NoNewPrivileges"] == ["yes"]
    assert d["EnvironmentFile"] == ["/etc/sglang/kimi-k2.6-ddtree-b64-tp8.env"]


def test_env_file_carries_config_env_and_is_private(tmp_path):
    cfg = tmp_path / "withenv.yml"
    cfg.write_text((REPO / "configs" / "ddtree-b15.yml").read_text().replace(
        "extends: dflash-b16", "extends: dflash-b16\nserving: {env: {NCCL_DEBUG: WARN, QUOTE: 'a \"b\" $c'}}"))
    (tmp_path / "dflash-b16.yml").write_text((REPO / "configs" / "dflash-b16.yml").read_text())
    (tmp_path / "base-qwen3.6-27b.yml").write_text((REPO / "configs" / "base-qwen3.6-27b.yml").read_text())
    result = render_cli(str(cfg), tmp_path / "out")
    assert result.returncode == 0, result.stderr
    env_path = Path(json.loads(result.stdout)["env"])
    text = env_path.read_text()
    assert 'NCCL_DEBUG="WARN"' in text and 'QUOTE="a \\"b\\" \\$c"' in text
    assert env_path.stat().st_mode & 0o077 == 0


def test_lab_host_settings_change_only_launcher_and_bind(tmp_path):
    plain = json.loads(render_cli("ddtree-b15", tmp_path / "a").stdout)
    lab = json.loads(render_cli("ddtree-b15", tmp_path / "b", "--bind-address", "127.0.1.2",
                                "--launcher", "/opt/sglang-sim/sglang_sim.py").stdout)
    a, b = plain["argv"], lab["argv"]
    assert b[0] == a[0]
    assert b[1] == "/opt/sglang-sim/sglang_sim.py" and a[1:3] == ["-m", "sglang.launch_server"]
    assert b[2:] == [("127.0.1.2" if x == "127.0.0.1" else x) for x in a[3:]]


def test_forking_and_topk_switch_by_flags_in_one_release(tmp_path):
    """ddtree-b15 and ddtree-b15-nofork run the same release; only their flags differ."""
    on = json.loads(render_cli("ddtree-b15", tmp_path / "on").stdout)["argv"]
    off = json.loads(render_cli("ddtree-b15-nofork", tmp_path / "off").stdout)["argv"]
    assert on[0] == off[0] == PY
    changed = [(a, b) for a, b in zip(on, off, strict=True) if a != b]
    assert changed == [("on", "off"), ("fused", "torch")]
    assert on[on.index("--speculative-ddtree-state-forking") + 1] == "on"
    assert off[off.index("--speculative-ddtree-topk") + 1] == "torch"


def test_flags_the_config_sets_are_refused_in_extra_args(tmp_path):
    cfg = tmp_path / "extra.yml"
    cfg.write_text("extends: ddtree-b15\nserving: {extra_args: ['--speculative-ddtree-state-forking', 'off']}\n")
    r = subprocess.run([sys.executable, "-m", "sgdeploy", "validate", str(cfg)], capture_output=True, text=True,
                       cwd=REPO, check=False)
    assert r.returncode == 2 and "--speculative-ddtree-state-forking is set from the config" in r.stderr, r.stderr


def test_rendering_is_a_pure_function():
    config = spec.load("ddtree-b15")
    host = render.HostSettings(release_label=LABEL)
    assert render.render(config, host) == render.render(config, host)


def test_verify_rejects_a_broken_unit(tmp_path):
    info = json.loads(render_cli("ddtree-b15", tmp_path).stdout)
    unit = Path(info["unit"])
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=sometimes"))
    with pytest.raises(render.VerifyError, match="kill mode"):
        render.verify(unit, PY)


# --- Config strings cannot add a directive to the unit (issue 20) -----------------------------------

INJECTION = "x\n[Service]\nExecStartPre=+/bin/touch /root/x\n"


def systemd_words(line: str) -> list[str]:
    """An ExecStart= value split as systemd reads it: words on spaces, "..." with C escapes, then
    %% -> % (specifiers) and $$ -> $ (variable expansion)."""
    words, i, n = [], 0, len(line)
    escapes = {"n": "\n", "t": "\t", "r": "\r"}
    while i < n:
        if line[i] == " ":
            i += 1
            continue
        word: list[str] = []
        if line[i] == '"':
            i += 1
            while line[i] != '"':
                if line[i] == "\\":
                    i += 1
                    word.append(escapes.get(line[i], line[i]))
                else:
                    word.append(line[i])
                i += 1
            i += 1
        else:
            while i < n and line[i] != " ":
                if line[i] == "\\":
                    i += 1
                word.append(line[i])
                i += 1
        words.append("".join(word).replace("%%", "%").replace("$$", "$"))
    return words


def _unit_of(config: spec.Config, tmp_path: Path) -> tuple[str, Path]:
    rendered = render.render(config, render.HostSettings(release_label=LABEL))
    unit_path, _env = render.write(rendered, tmp_path)
    render.verify(unit_path, rendered.argv[0])  # systemd-analyze verify stays clean
    return rendered.unit_text, unit_path


def _keys(unit_text: str) -> list[str]:
    return [ln.split("=", 1)[0] if "=" in ln else ln for ln in unit_text.splitlines()
            if ln.strip() and not ln.startswith("#")]


def test_a_description_with_unit_lines_is_refused_by_validation(tmp_path):
    path = tmp_path / "evil.yml"
    path.write_text(f"extends: ddtree-b15\ndescription: {json.dumps(INJECTION)}\n")
    result = render_cli(str(path), tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{path}: description: " in result.stderr and "one line of printable text" in result.stderr
    assert not (tmp_path / "out").exists(), "a refused config rendered something"


@pytest.mark.parametrize("field", ["description", "extra_args"])
def test_even_unvalidated_line_breaks_add_no_directive(field, tmp_path):
    """Below validation, the template itself keeps every value on its line: the same directives,
    no ExecStartPre, and systemd-analyze verify clean."""
    config = spec.load("ddtree-b15")
    clean, _ = _unit_of(config, tmp_path / "clean")
    if field == "description":
        evil = dataclasses.replace(config, description=INJECTION)
    else:
        evil = dataclasses.replace(config, serving=dataclasses.replace(config.serving, extra_args=(INJECTION,)))
    text, _ = _unit_of(evil, tmp_path / "evil")
    assert _keys(text) == _keys(clean)
    assert not any(ln.startswith("ExecStartPre") for ln in text.splitlines())


def test_extra_args_are_quoted_one_argument_each(tmp_path):
    """%, $, quotes, backslashes, spaces and a lone ';' (systemd's command separator) reach SGLang
    exactly as written: one argument each, specifiers and variables escaped."""
    odd = ['--json-model-override-args={"rope": "a b"}', "--tag=%h-%n", "--home=$HOME", "--x=${PATH}",
           "back\\slash", ";", "it's", "--pct=100%"]
    config = spec.load("ddtree-b15")
    config = dataclasses.replace(config, serving=dataclasses.replace(config.serving, extra_args=tuple(odd)))
    text, _ = _unit_of(config, tmp_path)
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert systemd_words(line.removeprefix("ExecStart="))[-len(odd):] == odd
    assert "%%h-%%n" in line and "$$HOME" in line and "$${PATH}" in line and '";"' in line


def test_odd_extra_args_pass_validation_and_render(tmp_path):
    """The same arguments in a config file: valid (they are one line each), rendered, verified."""
    path = tmp_path / "odd.yml"
    path.write_text("extends: ddtree-b15\nserving: {extra_args: ['--tag=%h', '--home=$HOME', ';']}\n")
    result = render_cli(str(path), tmp_path / "out")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)["argv"]
    assert argv[-3:] == ["--tag=%h", "--home=$HOME", ";"]


# --------------------------------------------------------------------------------------------------
# The engines' API key (issue 34): serving.api_key_secret names it in the inventory's sglang_secret_env.

SECRET = "sk-test-Zq7$%`\"x"


def _keyed(tmp_path: Path, serving: str = "{api_key_secret: SGLANG_ENGINE_KEY}") -> spec.Config:
    path = tmp_path / "keyed.yml"
    path.write_text(f"extends: ddtree-b15\nserving: {serving}\n")
    return spec.load(path)


def test_the_api_key_reaches_only_the_env_file(tmp_path):
    config = _keyed(tmp_path)
    assert config.serving.api_key_secret == "SGLANG_ENGINE_KEY"
    rendered = render.render(config, render.HostSettings(release_label=LABEL),
                             secret_env={"SGLANG_ENGINE_KEY": SECRET, "HF_TOKEN": "hf_x"})
    unit_path, env_path = render.write(rendered, tmp_path / "out")
    render.verify(unit_path, rendered.argv[0])
    assert SECRET not in rendered.unit_text and all(SECRET not in a for a in rendered.argv)
    assert "--api-key" not in rendered.argv  # (only the launcher code, for a launcher script, says the flag)
    assert "Environment=SGDEPLOY_API_KEY_ENV=SGLANG_ENGINE_KEY" in rendered.unit_text.splitlines()
    assert 'SGLANG_ENGINE_KEY="sk-test-Zq7\\$%\\`\\"x"' in env_path.read_text().splitlines()
    # argv: python -c <launcher code> -m sglang.launch_server <flags>; the code holds no secret.
    assert rendered.argv[1] == "-c" and rendered.argv[3:5] == ("-m", "sglang.launch_server")
    line = next(ln for ln in rendered.unit_text.splitlines() if ln.startswith("ExecStart="))
    assert systemd_words(line.removeprefix("ExecStart=")) == list(rendered.argv)


def test_the_launcher_gives_the_key_inside_the_process_only(tmp_path):
    """The rendered launcher code runs a launcher script with `--api-key KEY` in its sys.argv, while the
    process's command line (/proc/self/cmdline: ps, the journal's _CMDLINE) and environment lose it, and a
    log record holding the key is redacted."""
    config = _keyed(tmp_path)
    code = render.api_key_launcher_code()
    assert render.exec_argv(config, render.HostSettings(release_label=LABEL))[2] == code
    script = tmp_path / "engine.py"
    script.write_text(
        "import json, logging, os, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "logging.getLogger('x').info('server_args=%s', {'api_key': sys.argv[-1]})\n"
        "cmdline = open('/proc/self/cmdline', 'rb').read().decode()\n"
        "print(json.dumps({'argv': sys.argv, 'cmdline': cmdline, 'env': [k for k in os.environ\n"
        "                  if os.environ[k] == sys.argv[-1] or k == 'SGDEPLOY_API_KEY_ENV']}))\n")
    env = {"PATH": "/usr/bin:/bin", "SGDEPLOY_API_KEY_ENV": "SGLANG_ENGINE_KEY", "SGLANG_ENGINE_KEY": SECRET}
    proc = subprocess.run([sys.executable, "-c", code, str(script), "--port", "30000"], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["argv"] == [str(script), "--port", "30000", "--api-key", SECRET]
    assert SECRET not in out["cmdline"] and out["env"] == []
    assert SECRET not in proc.stderr and "<redacted>" in proc.stderr
    # Without the variable the engine does not start (one line, no traceback).
    bad = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SGDEPLOY_API_KEY_ENV": "SGLANG_ENGINE_KEY"}, timeout=60,
                         check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("sgdeploy: SGLANG_ENGINE_KEY is not set in the service's environment "
                                  "(serving.api_key_secret names a key of the inventory's sglang_secret_env)")


def test_a_deploy_without_the_named_secret_is_refused_in_one_line(tmp_path):
    config = _keyed(tmp_path)
    with pytest.raises(spec.ConfigError) as info:
        render.render(config, render.HostSettings(release_label=LABEL), secret_env={"HF_TOKEN": "x"})
    assert info.value.problems == [f"{config.source}: serving.api_key_secret: 'SGLANG_ENGINE_KEY': not a key of the "
                                   "inventory's sglang_secret_env (keys there: HF_TOKEN)"]


def test_a_bind_address_other_hosts_reach_needs_the_api_key(tmp_path):
    config = spec.load("ddtree-b15")
    result = render_cli("ddtree-b15", tmp_path / "out", "--bind-address", "10.0.0.5")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (f"{config.source}: serving.api_key_secret: missing: required when the service binds "
                             "10.0.0.5 (the inventory's sglang_bind_address; not loopback): name the engines' API "
                             "key in the inventory's sglang_secret_env\n")
    keyed = _keyed(tmp_path)
    assert render.render(keyed, render.HostSettings(release_label=LABEL, bind_address="10.0.0.5")).argv
