"""One engine over several hosts (serving.nnodes; docs/multinode.md): the config's rules and each rank's flags.

SGLang runs one tensor-parallel engine over `nnodes` hosts with the same command line on each but for
`--node-rank`; every rank names rank 0's `--dist-init-addr HOST:PORT`, where rank 0 opens the port the others
join on. Rank 0 alone serves HTTP. Which hosts form an engine and in which order is the inventory's
(`sglang_engine_group`, the inventory's order; the deploy role's tasks/nodes.yml); this module checks the
config and writes the flags of one rank.
"""

from __future__ import annotations

from typing import Any

MAX_NODES = 16


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
        return
    if isinstance(dport, int) and (not 1024 <= dport <= 65535 or dport in (port, nccl)):
        p.bad("serving.dist_init_port", dport, f"must be between 1024 and 65535 and differ from serving.port ({port}) "
                                               f"and serving.nccl_port ({nccl})")


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
