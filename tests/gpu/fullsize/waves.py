"""Which servers of the full-size run start together (pure Python; the plan and the GPU-machine runner use it).

A wave places, in plan order, every remaining server whose predicted memory fits what its GPU has left
(first fit over the GPUs, ``GPU_RESERVE_GIB`` kept free on each); the rest wait for the next wave. With one
H200 and the full-size servers (60-128 GiB each) every wave holds one server; with four GPUs the first four
servers start together.
"""

from __future__ import annotations

GIB = 1 << 30
GPU_RESERVE_GIB = 3.0  # left free on a GPU whatever the servers predict


def waves(servers: list[dict], gpus: int, gpu_bytes: float,
          reserve_bytes: float = GPU_RESERVE_GIB * GIB) -> list[list[tuple[dict, int]]]:
    """Group the servers (in order) into waves that run together: each wave places, in order, every remaining
    server whose predicted memory fits what its GPU has left (first fit over the GPUs); the rest wait for
    the next wave. Returns [[(server, gpu index), ...], ...]."""
    left = list(servers)
    out = []
    while left:
        room = [gpu_bytes - reserve_bytes] * gpus
        wave, rest = [], []
        for s in left:
            need = s["predicted_bytes"]["total"]
            gpu = next((g for g in range(gpus) if room[g] >= need), None)
            if gpu is None:
                rest.append(s)
                continue
            room[gpu] -= need
            wave.append((s, gpu))
        if not wave:
            raise ValueError(f"server {rest[0]['name']}: predicted {rest[0]['predicted_bytes']['total'] / GIB:.1f} "
                             f"GiB does not fit a GPU of {gpu_bytes / GIB:.1f} GiB")
        out.append(wave)
        left = rest
    return out
