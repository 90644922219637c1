"""Render a config into its systemd unit and environment file.

Rendering is a pure function of the config and a few host settings (the release label, the bind
address the inventory may override, the launcher the lab swaps for its simulator). The flags are
computed here, in Python; the Jinja2 template in templates/systemd/ only lays them out. The same
template serves `make render` and the Ansible deploy (which calls this module).
"""

from __future__ import annotations

import functools
import hashlib
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from sgdeploy import models, multinode, schedule
from sgdeploy.spec import Config, ConfigError, Drafter, Model, Replica, controller_folder, is_loopback

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates" / "systemd"
RELEASE_ROOT = "/opt/sglang/releases"
DEFAULT_LAUNCHER = "-m sglang.launch_server"
SERVICE_USER = "sglang"
STATE_DIR = "/var/lib/sglang"
ENV_DIR = "/etc/sglang"
# The engine's launcher with serving.api_key_secret: the key from the environment, never argv.
API_KEY_LAUNCHER = TEMPLATE_DIR / "sglang_launch.py"
API_KEY_ENV = "SGDEPLOY_API_KEY_ENV"


def api_key_launcher_code() -> str:
    """`python -c` code of templates/systemd/sglang_launch.py (one line: the unit's ExecStart holds it)."""
    return f"exec({API_KEY_LAUNCHER.read_text()!r})"


@dataclass(frozen=True)
class HostSettings:
    """What the inventory may set for one host (docs/design.md, "Inventory variables")."""

    release_label: str
    bind_address: str | None = None
    launcher: str = DEFAULT_LAUNCHER
    release_root: str = RELEASE_ROOT
    cuda_home: str = "/usr/local/cuda"
    service_user: str = SERVICE_USER
    env_dir: str = ENV_DIR
    models_root: str = models.MODELS_ROOT  # hf and controller models live under it (role sglang_models' root)
    # With serving.nnodes > 1 (docs/multinode.md): this host's place among the engine's hosts and rank 0's address.
    node_rank: int | None = None
    dist_init_address: str | None = None


@dataclass(frozen=True)
class Rendered:
    unit_name: str
    unit_text: str
    env_name: str
    env_text: str
    argv: tuple[str, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256((self.unit_text + "\0" + self.env_text).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=32)
def _controller_digest(folder: str, mtime_ns: int) -> tuple[str, int]:
    sha, total, _files = models.folder_digest(Path(folder))
    return sha, total


def model_source(m: Model | Drafter, role: str, models_root: str = models.MODELS_ROOT) -> dict:
    """Where a model comes from and the folder on the host the service loads it from (docs/models.md)."""
    out: dict = {"role": role, "source": m.source}
    if m.source == "hf":
        out.update(repo=m.path, revision=m.revision, allow_patterns=list(m.allow_patterns or []),
                   local_dir=models.local_dir("hf", repo=m.path, revision=m.revision, root=models_root))
    elif m.source == "path":
        out.update(local_dir=m.path)
    else:
        folder = controller_folder(m.controller_path or "").resolve()
        sha, total = _controller_digest(str(folder), folder.stat().st_mtime_ns)
        version = m.version or sha[:16]
        out.update(name=folder.name, controller_path=str(folder), sha=sha, bytes=total, version=version,
                   version_given=m.version is not None,
                   local_dir=models.local_dir("controller", name=folder.name, version=version, root=models_root))
    return out


def model_sources(config: Config, models_root: str = models.MODELS_ROOT) -> list[dict]:
    """The target model and the drafter (when there is one), as the models role needs them."""
    out = [model_source(config.model, "model", models_root)]
    if config.drafter is not None and config.speculative.algorithm != "NONE":
        out.append(model_source(config.drafter, "drafter", models_root))
    return out


def bind_address(config: Config, host: HostSettings) -> str:
    return host.bind_address or config.serving.host


def launch_args(config: Config, host: HostSettings, replica: Replica | None = None) -> list[str]:
    """The SGLang flags the config implies (for one of its replicas; the first by default), in a
    fixed order."""
    sv, sp = config.serving, config.speculative
    r = replica or config.replicas[0]
    args = [
        "--model-path", model_source(config.model, "model", host.models_root)["local_dir"],
        "--tp-size", str(sv.tp_size),
        "--host", bind_address(config, host),
        "--port", str(r.port),
        "--nccl-port", str(r.nccl_port),
        "--attention-backend", sv.attention_backend,
        "--mem-fraction-static", f"{sv.mem_fraction_static:g}",
        "--enable-metrics",
    ]
    # The weights are a local folder (placed by the models role before the switch): no --revision.
    if sv.max_running_requests is not None:
        args += ["--max-running-requests", str(sv.max_running_requests)]
    if sp.algorithm != "NONE":
        assert config.drafter is not None
        drafter_dir = model_source(config.drafter, "drafter", host.models_root)["local_dir"]
        args += ["--speculative-algorithm", sp.algorithm,
                 "--speculative-draft-model-path", drafter_dir,
                 "--speculative-dflash-block-size", str(sp.block_size)]
    if sp.algorithm == "DDTREE":
        # The patched SGLang's switches, always written out so the unit says what runs (both default
        # to on/fused in SGLang; one release serves every DDTree config).
        args += ["--speculative-ddtree-budget", str(sp.budget),
                 "--speculative-ddtree-topk-cap", str(sp.topk_cap),
                 "--speculative-ddtree-state-forking", "on" if sp.state_forking else "off",
                 "--speculative-ddtree-topk", "fused" if sp.fused_topk else "torch"]
        if sp.budget_schedule is not None:  # budget above is the schedule's largest (config_model's rule)
            args += ["--speculative-ddtree-budget-schedule", schedule.flag_value(sp.budget_schedule)]
    # Over several hosts: rank 0, joined at the bind address, unless the deploy names the rank and rank 0's address.
    args += multinode.rank_args(sv.nnodes, sv.dist_init_port, 0 if host.node_rank is None else host.node_rank,
                                host.dist_init_address or bind_address(config, host))
    args += list(sv.extra_args)
    return args


def exec_argv(config: Config, host: HostSettings, replica: Replica | None = None) -> list[str]:
    python = f"{host.release_root}/{host.release_label}/venv/bin/python"
    wrapper = ["-c", api_key_launcher_code()] if config.serving.api_key_secret else []
    return [python, *wrapper, *shlex.split(host.launcher), *launch_args(config, host, replica)]


def check_api_key(config: Config, host: HostSettings, secret_env: dict[str, str] | None) -> None:
    """An address other hosts reach needs the API key; a deploy (secret_env given) needs its value."""
    name, address = config.serving.api_key_secret, bind_address(config, host)
    if name is None and not is_loopback(address):
        raise ConfigError([f"{config.source}: serving.api_key_secret: missing: required when the service binds "
                           f"{address} (the inventory's sglang_bind_address; not loopback): name the engines' API key "
                           "in the inventory's sglang_secret_env"])
    if name is not None and secret_env is not None and not secret_env.get(name):
        raise ConfigError([f"{config.source}: serving.api_key_secret: {name!r}: not a key of the inventory's "
                           f"sglang_secret_env (keys there: {', '.join(sorted(secret_env)) or 'none'})"])


def _systemd_quote(arg: str) -> str:
    """Quote one ExecStart argument for systemd (its rules: C-style escapes in double quotes)."""
    if arg and all(c.isalnum() or c in "-_./:=,+@" for c in arg):
        return arg.replace("%", "%%")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _env_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{escaped}"'


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(config: Config, host: HostSettings, secret_env: dict[str, str] | None = None,
           replica: Replica | None = None) -> Rendered:
    """The unit and env file of one replica of the config (the first by default; with one replica and
    no router that is the config's own unit, sglang-<config>.service)."""
    r = replica or config.replicas[0]
    check_api_key(config, host, secret_env)
    argv = exec_argv(config, host, r)
    release_dir = f"{host.release_root}/{host.release_label}"
    path_dirs = [f"{host.cuda_home}/bin", f"{release_dir}/venv/bin",
                 "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    env_name = f"{host.env_dir}/{r.name}.env"
    env = _environment()
    unit_text = env.get_template("sglang.service.j2").render(
        config=config,
        unit_name=r.unit_name,
        user=host.service_user,
        state_dir=STATE_DIR,
        release_dir=release_dir,
        release_label=host.release_label,
        env_file=env_name,
        cuda_visible_devices=",".join(str(g) for g in r.gpus),
        cuda_home=host.cuda_home,
        path=":".join(path_dirs),
        exec_start=" ".join(_systemd_quote(a) for a in argv),
        api_key_env=config.serving.api_key_secret,
        start_timeout=config.serving.start_timeout_s,
        stop_timeout=config.serving.stop_timeout_s,
    )
    env_vars = dict(config.serving.env)
    env_vars.update(secret_env or {})
    env_text = env.get_template("sglang.env.j2").render(
        config=config,
        variables=[(k, _env_quote(v)) for k, v in sorted(env_vars.items())],
    )
    return Rendered(r.unit_name, unit_text, env_name, env_text, tuple(argv))


def write(rendered: Rendered, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    unit_path = out_dir / rendered.unit_name
    env_path = out_dir / Path(rendered.env_name).name
    unit_path.write_text(rendered.unit_text)
    env_path.write_text(rendered.env_text)
    env_path.chmod(0o600)
    return unit_path, env_path


class VerifyError(Exception):
    pass


def verify(unit_path: Path, executable: str) -> str:
    """`systemd-analyze verify` the unit in a scratch root where its ExecStart binary exists.

    The unit must carry its real name (`*.service`): verify refuses other suffixes. Returns the
    tool's output; raises VerifyError with it when the unit does not verify.
    """
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise VerifyError("systemd-analyze not found: install the 'systemd' package (make setup does)")
    with tempfile.TemporaryDirectory(prefix="sgdeploy-verify-") as tmp:
        root = Path(tmp)
        unit_dir = root / "etc" / "systemd" / "system"
        unit_dir.mkdir(parents=True)
        staged = unit_dir / unit_path.name
        staged.write_text(unit_path.read_text())
        exe = root / executable.lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        proc = subprocess.run(
            [tool, "verify", f"--root={root}", "--man=no", "--recursive-errors=no", str(staged)],
            capture_output=True, text=True, check=False,
        )
    out = (proc.stdout + proc.stderr).strip().replace(str(root), "")
    # verify exits non-zero on unknown keys, unparsable values and missing executables; it also
    # prints "ignoring" for problems it tolerates: both count as a failed verification here.
    if proc.returncode != 0 or "ignoring" in out:
        raise VerifyError(out or f"systemd-analyze verify exited {proc.returncode}")
    return out
