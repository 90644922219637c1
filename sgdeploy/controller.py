"""What plays ask of the controller's Python, answered in-process (issue 35, "one crossing").

The collection's controller-side action plugin ``sgdeploy.host.controller_config`` calls these
functions inside ``ansible-playbook``'s own interpreter (no ``python -m sgdeploy`` subprocess, no JSON on
stdout); ``sgdeploy render --json`` and ``sgdeploy config`` print the very same dictionaries. A config
error raises ``spec.ConfigError`` whose ``problems`` are the one-line messages
("file: field: value: what is allowed").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sgdeploy import render, spec


class ReplicaError(ValueError):
    """A replica index the config does not have: one line."""


def service_url(config: spec.Config, host: render.HostSettings, port: int | None = None) -> str:
    """The URL the service answers on from the host itself (its bind address; 0.0.0.0 as loopback)."""
    address = render.bind_address(config, host)
    if ":" in address:
        address = f"[{address}]"
    elif address == "0.0.0.0":
        address = "127.0.0.1"
    return f"http://{address}:{port or config.serving.port}"


def replica_layout(config: spec.Config, host: render.HostSettings) -> dict:
    """The config's engines and its router as `render --json` gives them (docs/router.md)."""
    base = service_url(config, host).rsplit(":", 1)[0]
    out: dict = {"replicas": [{"index": r.index, "name": r.name, "unit_name": r.unit_name, "port": r.port,
                               "nccl_port": r.nccl_port, "gpus": list(r.gpus), "url": f"{base}:{r.port}"}
                              for r in config.replicas],
                 "of_config": config.name, "router": None}
    if config.serving.router:
        out["router"] = {"unit_name": config.router_unit_name, "port": config.serving.port,
                         "metrics_port": config.router_metrics_port, "url": service_url(config, host)}
    return out


def absolute_folder(option: str, text: str) -> str:
    """An absolute folder without `..`, spaces or control characters (it reaches the unit); ValueError if not."""
    if not text.startswith("/") or ".." in text.split("/") or any(c.isspace() or ord(c) < 32 for c in text):
        raise ValueError(f"{option} {text!r}: give an absolute folder without '..', spaces or control characters")
    return text.rstrip("/") or "/"


def merged(config: spec.Config) -> dict[str, Any]:
    """The fully merged config as ``sgdeploy config`` prints it (YAML), as a mapping."""
    return yaml.safe_load(spec.to_yaml(config))


def describe(config: spec.Config, host: render.HostSettings, *, replica: int | None = None,
           out_dir: Path | None = None, verify: bool = True, secret_env: dict | None = None) -> dict[str, Any]:
    """Render the unit and env file of ``config`` (or of one ``replica`` behind the router, deployed as
    ``<config>-r<i>``) into ``out_dir`` (default build/render/<config>) and describe the deploy: what
    ``sgdeploy render --json`` prints. Without ``replica`` every replica's files are written.
    Raises ReplicaError for an index the config lacks, render.VerifyError when systemd-analyze refuses."""
    one = None
    if replica is not None:
        if not config.serving.router or not 0 <= replica < config.serving.replicas:
            raise ReplicaError(f"--replica {replica}: config {config.name} has replicas 0 to "
                               f"{config.serving.replicas - 1} behind the router" if config.serving.router else
                               f"--replica {replica}: config {config.name} has no router (serving.replicas 1)")
        one = config.replicas[replica]
    rendered = render.render(config, host, secret_env=secret_env, replica=one)
    out_dir = out_dir or Path("build/render") / config.name
    unit_path, env_path = render.write(rendered, out_dir)
    for other in config.replicas[1:] if one is None else ():
        render.write(render.render(config, host, secret_env=secret_env, replica=other), out_dir)
    if verify:
        try:
            render.verify(unit_path, rendered.argv[0])
        except render.VerifyError as exc:
            raise render.VerifyError(f"{unit_path}: systemd-analyze verify failed:\n{exc}") from None
    r = one or config.replicas[0]
    return {
        "config": r.name if one else config.name, "unit_name": rendered.unit_name, "unit": str(unit_path),
        "env_name": rendered.env_name, "env": str(env_path), "release": host.release_label,
        "argv": list(rendered.argv), "digest": rendered.digest,
        "ports": [r.port, r.nccl_port] if one else list(config.ports),
        "gpus": list(r.gpus) if one else list(config.serving.gpus),
        "bind_address": render.bind_address(config, host), "features": list(config.patch_features),
        "url": service_url(config, host, r.port if one else None),
        "speculative": config.speculative_enabled,
        # One engine over several hosts (docs/multinode.md): rank 0 alone serves HTTP, health and gates.
        "nnodes": config.serving.nnodes, "node_rank": (host.node_rank or 0) if config.serving.nnodes > 1 else 0,
        "gates": config.gates.as_mapping(), "watch": config.watch.resolved(config.gates),
        "start_timeout_s": config.serving.start_timeout_s,
        "stop_timeout_s": config.serving.stop_timeout_s,
        "drain_timeout_s": config.serving.drain_timeout_s,
        "models": render.model_sources(config, host.models_root),
        **replica_layout(config, host),
    }
