"""One engine over several hosts (serving.nnodes; docs/multinode.md): the config's rules and each rank's flags.

SGLang runs one tensor-parallel engine over `nnodes` hosts with the same command line on each but for
`--node-rank`; every rank names rank 0's `--dist-init-addr HOST:PORT`, where rank 0 opens the port the others
join on. Rank 0 alone serves HTTP. Which hosts form an engine and in which order is the inventory's
(`sglang_engine_group`, the inventory's order; the deploy role's tasks/nodes.yml); this module checks the
config and writes the flags of one rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MAX_NODES = 16
# SGLang 0.5.23 with DP attention (--enable-dp-attention) over several hosts: rank 0 binds these ports beside the
# dist-init port (docs/multinode.md, "Ports"): sglang/srt/server_args.py PortArgs.init_new reserves NUM_DERIVED_PORTS
# (6) from port_base = dist_init_port + 1 (dist_init_port - 7 when dist_init_port + 6 passes 65535), and
# sglang/srt/managers/data_parallel_controller.py's handshake takes dist_init_port + DP_ATTENTION_HANDSHAKE_PORT_DELTA.
DP_ATTENTION_FLAG = "--enable-dp-attention"
DERIVED_PORTS = 6
HANDSHAKE_DELTA = 13


def dp_attention(extra_args: Iterable[Any] | None) -> bool:
    """Whether serving.extra_args turns DP attention on (SGLang's flag takes no value)."""
    return any(a == DP_ATTENTION_FLAG for a in extra_args or ())


def derived_ports(nnodes: Any, dist_init_port: Any, extra_args: Iterable[Any] | None) -> tuple[int, ...]:
    """The ports SGLang 0.5.23's rank 0 binds beyond serving.port, serving.nccl_port and the dist-init port: none
    without DP attention (its processes then talk over IPC files), else six next to the dist-init port and the DP
    attention handshake port."""
    if not (isinstance(nnodes, int) and nnodes > 1 and isinstance(dist_init_port, int) and dp_attention(extra_args)):
        return ()
    base = dist_init_port + 1 if dist_init_port + DERIVED_PORTS <= 65535 else dist_init_port - DERIVED_PORTS - 1
    return (*range(base, base + DERIVED_PORTS), dist_init_port + HANDSHAKE_DELTA)


def check(serving: Any, p: Any) -> None:
    """serving.nnodes and serving.dist_init_port (after replicas, GPUs and ports): sets the default port."""
    n, dport = serving.nnodes, serving.dist_init_port
    if not isinstance(n, int):
        return  # its type was reported with the field
    if not 1 <= n <= MAX_NODES:
        p.bad("serving.nnodes", n, f"must be between 1 and {MAX_NODES} (the hosts one engine spans)")
        return
    if n == 1:
        if dport is not None:
            p.bad("serving.dist_init_port", dport, "only with serving.nnodes above 1 (the port rank 0 opens for the "
                                                   "other ranks); leave it out")
        return
    if serving.router:
        p.bad("serving.nnodes", n, "not with replicas behind the router (serving.replicas above 1 or serving.router): "
                                   "an engine over several hosts serves alone on serving.port")
    tp, gpus = serving.tp_size, serving.gpus
    if isinstance(tp, int) and tp >= 1:
        if tp % n:
            p.bad("serving.tp_size", tp, f"must divide evenly over serving.nnodes ({n}) hosts: a multiple of {n}")
        elif isinstance(gpus, list) and len(gpus) != tp // n:
            p.bad("serving.gpus", gpus, f"with serving.nnodes {n} it lists the GPUs of each host: serving.tp_size / "
                                        f"serving.nnodes ({tp} / {n} = {tp // n}) of them")
    port, nccl = serving.port, serving.nccl_port
    if dport is None:
        if isinstance(port, int) and 1024 <= port <= 65535:
            dport = port + 2 if port + 2 <= 65535 else port - 2
            if dport == nccl:
                dport = port + 3 if port + 3 <= 65535 else port - 3
            serving.dist_init_port = dport
        _check_derived(serving, p)
        return
    if isinstance(dport, int) and (not 1024 <= dport <= 65535 or dport in (port, nccl)):
        p.bad("serving.dist_init_port", dport, f"must be between 1024 and 65535 and differ from serving.port ({port}) "
                                               f"and serving.nccl_port ({nccl})")
        return
    _check_derived(serving, p)


def _check_derived(serving: Any, p: Any) -> None:
    """With DP attention, rank 0's derived ports (derived_ports) must exist and miss serving.port and nccl_port."""
    dport = serving.dist_init_port
    extra = serving.extra_args if isinstance(serving.extra_args, list) else []
    ports = derived_ports(serving.nnodes, dport, [a for a in extra if isinstance(a, str)])
    if not ports:
        return
    taken = [f"serving.{k} ({v})" for k, v in (("port", serving.port), ("nccl_port", serving.nccl_port)) if v in ports]
    if ports[-1] > 65535 or taken:
        shown = f"{ports[0]}-{ports[DERIVED_PORTS - 1]} and {ports[-1]}"
        why = ", which takes " + " and ".join(taken) if taken else ", above 65535"
        p.bad("serving.dist_init_port", dport, f"with {DP_ATTENTION_FLAG} in serving.extra_args SGLang's rank 0 also "
                                               f"binds ports {shown}{why}; choose a dist_init_port whose ports "
                                               "miss serving.port and serving.nccl_port (docs/multinode.md)")


def rank_args(nnodes: int, dist_init_port: int | None, node_rank: int | None,
              dist_init_address: str | None) -> list[str]:
    """The flags of one rank: none for an engine on one host."""
    if nnodes <= 1:
        return []
    if node_rank is None or not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank!r}: serving.nnodes is {nnodes}, so a host's rank is 0 to {nnodes - 1} "
                         "(its place among the engine's hosts, docs/multinode.md)")
    if not dist_init_address:
        raise ValueError(f"dist_init_address: missing: serving.nnodes {nnodes} needs rank 0's address "
                         "(its sglang_dist_init_address, else its ansible_host)")
    host = f"[{dist_init_address}]" if ":" in dist_init_address else dist_init_address
    return ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--dist-init-addr", f"{host}:{dist_init_port}"]
