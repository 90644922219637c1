"""One engine over several hosts (serving.nnodes; docs/multinode.md): the config's rules and each rank's unit."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from sgdeploy import cli, render, spec

REPO = Path(__file__).resolve().parents[3]
KIMI = "kimi-k2.6-tp16-2node"


def _run(*args: str) -> subprocess.CompletedProcess:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def _write(tmp_path: Path, name: str, serving: dict) -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"extends": "base-kimi-k2.6", "serving": serving}))
    return path


def _exec_start(unit_path: Path) -> list[str]:
    line = next(ln for ln in unit_path.read_text().splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_the_kimi_two_host_config_validates_with_its_layout():
    config = spec.load(KIMI)
    sv = config.serving
    assert (sv.nnodes, sv.tp_size, sv.gpus, sv.dist_init_port) == (2, 16, tuple(range(8)), 30002)
    assert config.ports == (30000, 30001, 30002)
    merged = yaml.safe_load(spec.to_yaml(config))
    assert merged["serving"]["nnodes"] == 2 and merged["serving"]["dist_init_port"] == 30002


def test_make_render_renders_the_kimi_two_host_config(tmp_path):
    proc = subprocess.run(["make", "-s", "render", f"CONFIG={KIMI}"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    argv = _exec_start(REPO / "build" / "render" / KIMI / f"sglang-{KIMI}.service")
    i = argv.index("--nnodes")
    assert argv[i:i + 6] == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:30002"]


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_gets_its_rank_and_rank_0s_address(rank, tmp_path):
    proc = _run("render", KIMI, "--release", "stock", "--out", str(tmp_path), "--json", "--node-rank", str(rank),
                "--dist-init-address", "10.1.2.3")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert (d["nnodes"], d["node_rank"], d["ports"]) == (2, rank, [30000, 30001, 30002])
    argv = d["argv"]
    assert argv[argv.index("--node-rank") + 1] == str(rank)
    assert argv[argv.index("--dist-init-addr") + 1] == "10.1.2.3:30002"
    # Every rank the same GPUs of its own host, the same ports.
    unit = (tmp_path / f"sglang-{KIMI}.service").read_text()
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in unit


def test_one_host_configs_render_no_multinode_flag(tmp_path):
    proc = _run("render", "base-kimi-k2.6", "--release", "stock", "--out", str(tmp_path), "--json",
                "--node-rank", "1")
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)["argv"]
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(argv)


def test_a_rank_outside_the_engine_is_one_line(tmp_path):
    proc = _run("render", KIMI, "--release", "stock", "--out", str(tmp_path), "--node-rank", "2")
    assert proc.returncode == 2
    assert "node_rank 2: serving.nnodes is 2, so a host's rank is 0 to 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_ipv6_rank_0_is_bracketed():
    config = spec.load(KIMI)
    args = render.launch_args(config, render.HostSettings("stock", node_rank=1, dist_init_address="fd00::1"))
    assert args[args.index("--dist-init-addr") + 1] == "[fd00::1]:30002"


BAD = [
    ("tp-odd", {"nnodes": 2, "tp_size": 15, "gpus": list(range(8))}, "serving.tp_size: 15",
     "must divide evenly over serving.nnodes (2) hosts"),
    ("gpus-total", {"nnodes": 2, "tp_size": 16, "gpus": list(range(16))}, "serving.gpus:",
     "lists the GPUs of each host: serving.tp_size / serving.nnodes (16 / 2 = 8) of them"),
    ("too-many", {"nnodes": 17}, "serving.nnodes: 17", "must be between 1 and 16"),
    ("dist-on-port", {"nnodes": 2, "tp_size": 16, "dist_init_port": 30000}, "serving.dist_init_port: 30000",
     "differ from serving.port (30000) and serving.nccl_port (30001)"),
    ("dist-on-nccl", {"nnodes": 2, "tp_size": 16, "dist_init_port": 30001}, "serving.dist_init_port: 30001",
     "differ from serving.port"),
    ("dist-low", {"nnodes": 2, "tp_size": 16, "dist_init_port": 80}, "serving.dist_init_port: 80",
     "must be between 1024 and 65535"),
    ("dist-one-host", {"dist_init_port": 30005}, "serving.dist_init_port: 30005", "only with serving.nnodes above 1"),
    ("with-router", {"nnodes": 2, "tp_size": 8, "gpus": [0, 1, 2, 3, 4, 5, 6, 7], "replicas": 2},
     "serving.nnodes: 2", "not with replicas behind the router"),
    ("nnodes-type", {"nnodes": "two"}, "serving.nnodes", "must be a whole number"),
]


@pytest.mark.parametrize("case,serving,where,allowed", BAD, ids=[b[0] for b in BAD])
def test_bad_multinode_settings_are_one_line_each(case, serving, where, allowed, tmp_path):
    path = _write(tmp_path, case, serving)
    proc = _run("validate", str(path))
    assert proc.returncode == 2, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if where in ln]
    assert lines and allowed in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_default_dist_init_port_steps_over_an_nccl_port_set_there(tmp_path):
    path = _write(tmp_path, "nccl-2", {"nnodes": 2, "tp_size": 16, "nccl_port": 30002})
    config = spec.load(path)
    assert config.serving.dist_init_port == 30003 and config.ports == (30000, 30002, 30003)


def test_dp_attention_holds_the_ports_sglang_0_5_23_derives_from_the_dist_init_port(tmp_path):
    """SGLang 0.5.23 (PortArgs.init_new; DataParallelController's handshake): with --enable-dp-attention rank 0 binds
    dist_init_port + 1 to + 6 and + 13; without it, none (IPC files)."""
    plain = spec.load(_write(tmp_path, "plain", {"nnodes": 2, "tp_size": 16}))
    assert plain.ports == (30000, 30001, 30002)
    dp = spec.load(_write(tmp_path, "dp", {"nnodes": 2, "tp_size": 16, "extra_args": ["--enable-dp-attention"]}))
    assert dp.ports == (30000, 30001, 30002, 30003, 30004, 30005, 30006, 30007, 30008, 30015)
    # The highest dist-init port whose handshake port (+ 13) exists.
    top = spec.load(_write(tmp_path, "top", {"nnodes": 2, "tp_size": 16, "port": 40000, "dist_init_port": 65522,
                                             "extra_args": ["--enable-dp-attention"]}))
    assert top.ports[2:] == (65522, 65523, 65524, 65525, 65526, 65527, 65528, 65535)


@pytest.mark.parametrize("serving,message", [
    ({"dist_init_port": 29996, "nccl_port": 29999}, "serving.dist_init_port: 29996: with --enable-dp-attention in "
     "serving.extra_args SGLang's rank 0 also binds ports 29997-30002 and 30009, which takes serving.port (30000) and "
     "serving.nccl_port (29999)"),
    ({"dist_init_port": 65525, "port": 40000}, "serving.dist_init_port: 65525: with --enable-dp-attention in "
     "serving.extra_args SGLang's rank 0 also binds ports 65526-65531 and 65538, above 65535"),
    ({"nccl_port": 30005}, "serving.dist_init_port: 30002: with --enable-dp-attention"),
])
def test_a_dist_init_port_whose_dp_attention_ports_collide_is_one_line(serving, message, tmp_path):
    """Before: SGLang's rank 0 failed at start (port in use) after the switch; now the config is refused."""
    path = _write(tmp_path, "dp-bad", {"nnodes": 2, "tp_size": 16, "extra_args": ["--enable-dp-attention"], **serving})
    proc = _run("validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    ok = _write(tmp_path, "dp-none", {"nnodes": 2, "tp_size": 16, **serving})
    assert _run("validate", str(ok)).returncode == 0  # without DP attention those ports are free
