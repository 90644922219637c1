"""Rendered units: every shipped config renders and verifies; ExecStart carries exactly the flags."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sgdeploy import render, spec

REPO = Path(__file__).resolve().parents[2]
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


def render_cli(name: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sgdeploy", "render", name, "--release", LABEL,
                           "--out", str(out), "--json", *extra], capture_output=True, text=True, cwd=REPO,
                          check=False)


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
