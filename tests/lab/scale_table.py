#!/usr/bin/env python3
"""The rollout at scale, on paper (issue 37 deliver 4): wall time and capacity held for 2, 8, 32 and
128 GPU hosts, for today's per-host rolling (`make deploy`, SERIAL hosts at a time, each host's
engines one at a time behind its own router) and for the fleet router's canary + batches of
max_unavailable (a MODEL of a design not built yet). Prints the Markdown table of docs/router.md,
"At scale"; `tests/unit/tool/test_scale_table.py` checks that the docs hold what this prints.

Inputs (docs/router.md, "At scale", says where each comes from):
  engine_lab_s   one engine out of service for its switch in the lab (drain, stop, start, health,
                 warm-up, gates, back into the router; simulated engine)
  sim_start_s    the simulated engine's own start, inside engine_lab_s
  gpu_start_s    the real server's start on an H200 (model init + CUDA graph capture)
  weights_s      reading real weights from disk (not measured: 0 unless given)
  host_s         a host's steps outside its engines' switches (plan, router role), per host

    .venv/bin/python tests/lab/scale_table.py            # the table of docs/router.md
    .venv/bin/python tests/lab/scale_table.py --gpu-start-s 172 --weights-s 30 --engines-per-host 1
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

HOSTS = (2, 8, 32, 128)


@dataclass(frozen=True)
class Inputs:
    engine_lab_s: float = 47.0   # lab, test_router.py run 1 2026-12-01 17:15 UTC: 101 s / 2 and 86 s / 2 replicas
    sim_start_s: float = 2.0     # the simulated engine loads in about 2 s
    gpu_start_s: float = 99.0    # H200, ddtree-b15 server start (random weights), 2026-12-01
    weights_s: float = 0.0       # not measured
    host_s: float = 9.5          # lab, the same run: (206 s - 101 s - 86 s) / 2 hosts
    engines_per_host: int = 8    # Qwen3.6-27B at TP 1 on an 8-GPU host

    @property
    def engine_s(self) -> float:
        """One engine out of service for its switch on a GPU host: the lab's time with the simulator's
        start replaced by the real one."""
        return self.engine_lab_s - self.sim_start_s + self.gpu_start_s + self.weights_s


@dataclass(frozen=True)
class Rollout:
    wall_s: float
    held: tuple[float, ...]   # fraction of engines serving in each kind of phase (in order)

    @property
    def min_held(self) -> float:
        return min(self.held)


def per_host(hosts: int, serial: int, x: Inputs) -> Rollout:
    """Today: ceil(H / S) batches of S hosts; in each, every host rolls its R engines one at a time.
    wall = ceil(H / S) * (host_s + R * engine_s); while a batch switches, S of the H * R engines are out."""
    if hosts < 1 or serial < 1:
        raise ValueError("hosts and serial must be at least 1")
    s = min(serial, hosts)
    engines = hosts * x.engines_per_host
    wall = math.ceil(hosts / s) * (x.host_s + x.engines_per_host * x.engine_s)
    return Rollout(wall, ((engines - s) / engines,))


def fleet(hosts: int, max_unavailable: int, x: Inputs) -> Rollout:
    """The fleet router (model): one canary engine, then batches of M engines of the E = H * R.
    wall = host_s * ceil(H / M) (the hosts' own steps, M at a time) + engine_s (canary)
           + ceil((E - 1) / M) * engine_s;
    held: (E - 1) / E during the canary, (E - M) / E during a full batch."""
    if hosts < 1 or max_unavailable < 1:
        raise ValueError("hosts and max_unavailable must be at least 1")
    engines = hosts * x.engines_per_host
    m = min(max_unavailable, engines - 1) if engines > 1 else 1
    batches = math.ceil((engines - 1) / m)
    wall = x.host_s * math.ceil(hosts / m) + x.engine_s + batches * x.engine_s
    return Rollout(wall, ((engines - 1) / engines, (engines - m) / engines))


def duration(seconds: float) -> str:
    """`42 min`, `3.5 h`, `1.6 d`."""
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def pct(fraction: float) -> str:
    return f"{100 * fraction:.1f} %"


def rows(x: Inputs, hosts: tuple[int, ...] = HOSTS) -> list[list[str]]:
    out = []
    for h in hosts:
        e = h * x.engines_per_host
        quarter = max(1, math.ceil(h * 0.25))
        tenth = max(1, e // 10)
        today1, today25 = per_host(h, 1, x), per_host(h, quarter, x)
        f1, f10 = fleet(h, 1, x), fleet(h, tenth, x)
        out.append([str(h), str(e),
                    f"{duration(today1.wall_s)}, {pct(today1.min_held)}",
                    f"{duration(today25.wall_s)}, {pct(today25.min_held)} (S={quarter})",
                    f"{duration(f1.wall_s)}, {pct(f1.min_held)}",
                    f"{duration(f10.wall_s)}, canary {pct(f10.held[0])}, batches {pct(f10.min_held)} (M={tenth})"])
    return out


def markdown(x: Inputs, hosts: tuple[int, ...] = HOSTS) -> str:
    header = ["GPU hosts", "engines", "today, SERIAL=1: wall, held", "today, SERIAL=25%: wall, held",
              "fleet model, max_unavailable=1: wall, held", "fleet model, max_unavailable=10%: wall, held"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---:"] * 2 + ["---"] * 4) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(x, hosts)]
    return "\n".join(lines)


def document(x: Inputs) -> str:
    """What docs/router.md holds between its markers: the table at x's engines per host, then at one per host."""
    one = Inputs(x.engine_lab_s, x.sim_start_s, x.gpu_start_s, x.weights_s, x.host_s, 1)
    return (f"{x.engines_per_host} engines per host (one engine out for its switch: {x.engine_s:g} s; "
            f"{x.host_s:g} s per host):\n\n{markdown(x)}\n\n"
            f"1 engine per host (TP 8 over the host's GPUs; the same {one.engine_s:g} s per engine):\n\n"
            f"{markdown(one)}")


def main(argv: list[str] | None = None) -> int:
    d = Inputs()
    p = argparse.ArgumentParser(description="The rollout at scale (docs/router.md, \"At scale\").")
    p.add_argument("--engine-lab-s", type=float, default=d.engine_lab_s)
    p.add_argument("--sim-start-s", type=float, default=d.sim_start_s)
    p.add_argument("--gpu-start-s", type=float, default=d.gpu_start_s)
    p.add_argument("--weights-s", type=float, default=d.weights_s)
    p.add_argument("--host-s", type=float, default=d.host_s)
    p.add_argument("--engines-per-host", type=int, default=d.engines_per_host)
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    x = Inputs(a.engine_lab_s, a.sim_start_s, a.gpu_start_s, a.weights_s, a.host_s, a.engines_per_host)
    if x.engines_per_host < 1 or min(x.engine_lab_s, x.sim_start_s, x.gpu_start_s, x.weights_s, x.host_s) < 0 \
            or x.engine_s <= 0:
        print("scale_table: times must be 0 or more (engine time above 0) and engines per host at least 1",
              file=sys.stderr)
        return 2
    print(document(x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
