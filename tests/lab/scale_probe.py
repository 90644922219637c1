#!/usr/bin/env python3
"""The controller's own cost per host (issue 37 deliver 4): test equipment, not a CI test.

For each N (default 2, 8, 32, 128) it writes an inventory of N GPU hosts that all point at the lab's
hosts (aliases `scale-001`...: inventory names whose ansible_host and variables are those of lab1,
lab2, ... in turn, each with its own SSH control socket, so each alias opens its own connection as a
real host would), then runs what `make plan CONFIG=... INVENTORY=...` runs on the controller:

    sgdeploy validate CONFIG
    sgdeploy hosts -q --inventory INV
    ansible-playbook -i INV playbooks/deploy.yml --check --diff -e config=CONFIG -e deploy_serial=SERIAL

and records each one's wall time and controller CPU time (user + system of the children, from
resource.getrusage: ansible-playbook, its workers and their ssh clients; not the ssh control
masters, which detach, nor the lab hosts' sshd and modules, which run outside this process tree),
and, per task, the wall and CPU time from the callback tests/lab/scale_callback/scale_timer.py.
Check mode writes nothing on the hosts (the deploy lock is only read, nothing is staged), and each
alias renders into its own controller folder, so aliases of one lab host do not collide.

It fits cost = a + b * N (b: the controller's cost per host), and flags what grows faster than
linearly: the whole run's controller CPU time (its wall time is reported, not judged: it also holds the lab
hosts' own work, which runs on the same machine, and that machine's load), or a task whose CPU time per
host rises from each N to the next, to more than --superlinear-factor times (and --min-task-delta-s more
than) its time per host at the smallest N (a task above --min-task-s at the largest N).

    export LAB_NET=127.0.45 LAB_DIR=build/lab LAB_INVENTORY=build/lab/inventory.yml
    .venv/bin/python tests/lab/lab.py up
    .venv/bin/ansible-playbook -i build/lab/inventory.yml playbooks/deploy.yml -e config=ddtree-b15
    .venv/bin/python tests/lab/scale_probe.py --inventory build/lab/inventory.yml --config ddtree-b32 \
        --hosts 2,8,32,128 --out build/scale-probe.json

`--delegation-check --hosts 2,32,128,256` needs no lab: N local hosts, one task on each and one delegated to
the controller, CPU per host of each (whether Ansible's own per-host cost grows with N).

Exit 0: measured and nothing super-linear; 1: something super-linear (named) or a run failed; 2: bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"
CALLBACKS = Path(__file__).resolve().parent / "scale_callback"


class ProbeError(Exception):
    """Bad input: one line, exit 2."""


# --- the inventory -------------------------------------------------------------------------------

def lab_hosts(inventory: dict) -> list[tuple[str, dict]]:
    """The (name, variables) of the hosts in gpu_hosts of a lab inventory (as tests/lab/lab.py writes it)."""
    try:
        hosts = inventory["all"]["children"]["gpu_hosts"]["hosts"]
    except (KeyError, TypeError):
        raise ProbeError("the inventory has no all.children.gpu_hosts.hosts "
                         "(write it with tests/lab/lab.py up)") from None
    if not isinstance(hosts, dict) or not hosts:
        raise ProbeError("the inventory's gpu_hosts group has no hosts")
    return [(name, dict(hvars or {})) for name, hvars in hosts.items()]


def alias_inventory(lab: list[tuple[str, dict]], n: int, shared_ssh: bool = False) -> dict:
    """N inventory hosts scale-001.. that point at the lab's hosts in turn (their ansible_host and variables).

    Each alias gets its own ControlPath (ansible_control_path), so it opens its own SSH connection as a
    separate host would; shared_ssh=True leaves the default (aliases of one lab host share one master)."""
    if n < 1:
        raise ProbeError(f"host count {n} is not allowed: a whole number from 1")
    width = max(3, len(str(n)))
    hosts: dict[str, dict] = {}
    for i in range(n):
        name = f"scale-{i + 1:0{width}d}"
        origin, hvars = lab[i % len(lab)]
        hvars = dict(hvars)
        hvars["scale_probe_alias_of"] = origin
        if not shared_ssh:
            hvars["ansible_control_path"] = "%(directory)s/" + name
        hosts[name] = hvars
    return {"all": {"children": {"gpu_hosts": {"hosts": hosts}}}}


# --- the fit -------------------------------------------------------------------------------------

def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x; (a, b). One point: a = 0, b = y / x."""
    if not points:
        raise ValueError("no points")
    if len(points) == 1:
        x, y = points[0]
        return 0.0, y / x
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, my / mx
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def growth_exponent(points: list[tuple[float, float]]) -> float | None:
    """The slope of log(y) against log(x) between the smallest and the largest x (1: linear, 2: quadratic)."""
    pts = sorted(p for p in points if p[0] > 0 and p[1] > 0)
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    return math.log(y1 / y0) / math.log(x1 / x0)


def marginal_costs(points: list[tuple[float, float]]) -> list[float]:
    """(y2 - y1) / (x2 - x1) between consecutive x: the cost of one more host at each size."""
    pts = sorted(points)
    return [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False) if x1 != x0]


def superlinear(points: list[tuple[float, float]], factor: float) -> bool:
    """Whether one more host costs more than `factor` times as much at the largest size as at the smallest."""
    m = marginal_costs(points)
    return len(m) >= 2 and m[0] > 0 and m[-1] > factor * m[0]


def task_flags(runs: list[dict], factor: float, min_task_s: float, min_delta_s: float = 0.05,
               key: str = "cpu_s") -> list[dict]:
    """Tasks whose time per host grows with N: it rises from each N to the next, at the largest N it is more
    than `factor` x its time per host at the smallest N and at least min_delta_s per host more, and the task
    takes at least min_task_s in all at the largest N. (A task's CPU is what the controller spent between its
    start and the next task's start, and workers are reaped late, so a task's share moves by a few
    hundredths of a second per host between neighbours: min_delta_s keeps that noise out.)"""
    runs = sorted((r for r in runs if r.get("tasks")), key=lambda r: r["hosts"])
    if len(runs) < 2:
        return []
    small, large = runs[0], runs[-1]
    flags = []
    for name, big in large["tasks"].items():
        series = [r["tasks"].get(name, {}).get(key) for r in runs]
        if any(v is None for v in series) or big[key] < min_task_s:
            continue
        per_host = [max(v, 1e-3) / r["hosts"] for v, r in zip(series, runs, strict=True)]
        rising = all(b > a for a, b in zip(per_host, per_host[1:], strict=False))
        if rising and per_host[-1] > factor * per_host[0] and per_host[-1] - per_host[0] >= min_delta_s:
            flags.append({"task": name, "per_host_small": round(per_host[0], 4),
                          "per_host_large": round(per_host[-1], 4), "small_hosts": small["hosts"],
                          "large_hosts": large["hosts"], "starts_large": big["starts"]})
    return sorted(flags, key=lambda f: -f["per_host_large"])


# --- the runs ------------------------------------------------------------------------------------

def timed(cmd: list[str], env: dict, log: Path, timeout: float) -> dict:
    """Run cmd, its output to log; wall and CPU seconds of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        try:
            rc = subprocess.run(cmd, env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rc": rc, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "log": str(log)}


def ansible_env(out_json: Path, forks: int | None) -> dict:
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS), "ANSIBLE_CALLBACKS_ENABLED": "scale_timer",
                "SCALE_TIMER_OUT": str(out_json), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    if forks:
        env["ANSIBLE_FORKS"] = str(forks)
    return env


def probe_one(n: int, lab: list[tuple[str, dict]], args: argparse.Namespace, work: Path) -> dict:
    inv = work / f"inventory-{n}.yml"
    inv.write_text("# Written by tests/lab/scale_probe.py: aliases of the lab's hosts.\n"
                   + yaml.safe_dump(alias_inventory(lab, n, args.shared_ssh), sort_keys=False), encoding="utf-8")
    timings = work / f"tasks-{n}.json"
    timings.unlink(missing_ok=True)
    env = ansible_env(timings, args.forks)
    steps = {
        "validate": [str(BIN / "sgdeploy"), "validate", args.config],
        "hosts": [str(BIN / "sgdeploy"), "hosts", "-q", "--inventory", str(inv)],
        "plan": [str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/deploy.yml", "--check", "--diff",
                 "-e", f"config={args.config}", "-e", f"deploy_serial={args.serial}"],
    }
    run: dict = {"hosts": n, "serial": args.serial, "steps": {}}
    for name, cmd in steps.items():
        run["steps"][name] = timed(cmd, env, work / f"{name}-{n}.log", args.timeout)
        print(f"N={n:4d} {name:8s} rc={run['steps'][name]['rc']} wall {run['steps'][name]['wall_s']:8.1f} s"
              f"  cpu {run['steps'][name]['cpu_s']:8.1f} s", flush=True)
    run["tasks"] = json.loads(timings.read_text()) if timings.exists() else {}
    run["ok"] = all(s["rc"] == 0 for s in run["steps"].values())
    return run


DELEGATION_PLAY = """- name: One task on each host, one delegated to the controller (scale_probe --delegation-check)
  hosts: all:!localhost
  gather_facts: false
  tasks:
    - name: on the host
      ansible.builtin.stat:
        path: /etc/hostname
    - name: delegated
      ansible.builtin.stat:
        path: /etc/hostname
      delegate_to: localhost
"""


def delegation_check(counts: list[int], work: Path, forks: int | None, timeout: float) -> list[dict]:
    """Whether Ansible's own per-host cost of a task, and of one delegated to the controller, grows with
    the hosts: N local hosts (ansible_connection local), no lab needed. CPU per host of each task."""
    play = work / "delegation.yml"
    play.write_text(DELEGATION_PLAY, encoding="utf-8")
    out = []
    for n in counts:
        local = f"      ansible_connection: local\n      ansible_python_interpreter: {sys.executable}\n"
        inv = work / f"delegation-{n}.yml"
        inv.write_text("all:\n  hosts:\n" + "".join(f"    h{i:04d}:\n{local}" for i in range(n))
                       + f"    localhost:\n{local}", encoding="utf-8")
        timings = work / f"delegation-tasks-{n}.json"
        step = timed([str(BIN / "ansible-playbook"), "-i", str(inv), str(play)], ansible_env(timings, forks),
                     work / f"delegation-{n}.log", timeout)
        tasks = json.loads(timings.read_text()) if timings.exists() else {}
        per_host = {k: round(v["cpu_s"] / n, 4) for k, v in tasks.items() if not k.startswith("(")}
        out.append({"hosts": n, **step, "cpu_per_host_s": per_host})
        print(f"N={n:4d} rc={step['rc']} wall {step['wall_s']:7.1f} s cpu {step['cpu_s']:7.1f} s per host {per_host}",
              flush=True)
    return out


def summarize(runs: list[dict], factor: float, min_task_s: float, min_delta_s: float = 0.05) -> dict:
    ok = [r for r in runs if r["ok"]]
    summary: dict = {"fits": {}, "superlinear": [], "task_flags": []}
    for step in ("validate", "hosts", "plan"):
        for key in ("wall_s", "cpu_s"):
            pts = [(r["hosts"], r["steps"][step][key]) for r in ok]
            if not pts:
                continue
            a, b = linear_fit(pts)
            fit = {"fixed_s": round(a, 3), "per_host_s": round(b, 4), "exponent": growth_exponent(pts),
                   "marginal_per_host_s": [round(m, 4) for m in marginal_costs(pts)]}
            summary["fits"][f"{step}.{key}"] = fit
            # The verdict is the controller's CPU: the wall time also holds the lab hosts' own work, which
            # runs on the same (shared) machine, and that machine's load.
            if key == "cpu_s" and superlinear(pts, factor):
                summary["superlinear"].append(f"{step} {key}: one more host costs {fit['marginal_per_host_s']}")
    summary["task_flags"] = task_flags(ok, factor, min_task_s, min_delta_s)
    return summary


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inventory", default=os.environ.get("LAB_INVENTORY", "inventory/lab.yml"))
    p.add_argument("--config", default="ddtree-b32")
    p.add_argument("--hosts", default="2,8,32,128", help="comma-separated host counts")
    p.add_argument("--serial", default="1", help="deploy_serial (SERIAL=): 1 as make plan, or N, or P%%")
    p.add_argument("--forks", type=int, default=None, help="ANSIBLE_FORKS (default: ansible.cfg's)")
    p.add_argument("--shared-ssh", action="store_true", help="aliases of one lab host share its SSH master")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per step")
    p.add_argument("--superlinear-factor", type=float, default=1.5)
    p.add_argument("--min-task-s", type=float, default=1.0, help="a flagged task takes at least this at the largest N")
    p.add_argument("--min-task-delta-s", type=float, default=0.05,
                   help="a flagged task's time per host grows by at least this")
    p.add_argument("--work", default="build/scale-probe")
    p.add_argument("--delegation-check", action="store_true",
                   help="no lab: time a task and a delegated one over --hosts local hosts, then stop")
    p.add_argument("--summarize", metavar="JSON", nargs="+",
                   help="no runs: summarize the runs of these earlier outputs (one serial each) again")
    p.add_argument("--out", default="build/scale-probe.json")
    args = p.parse_args(argv)
    try:
        args.host_counts = sorted({int(x) for x in args.hosts.split(",") if x.strip()})
    except ValueError:
        raise ProbeError(f"--hosts {args.hosts!r} is not allowed: comma-separated whole numbers, e.g. 2,8,32") from None
    if not args.host_counts or args.host_counts[0] < 1:
        raise ProbeError(f"--hosts {args.hosts!r} is not allowed: whole numbers from 1")
    return args


def report(result: dict, out: Path) -> int:
    """Write the result, print the fits and what grows faster than linearly; the exit status."""
    summary = result["summary"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    for key, fit in summary["fits"].items():
        exponent = "-" if fit["exponent"] is None else f"{fit['exponent']:.2f}"
        print(f"{key:16s} fixed {fit['fixed_s']:8.2f} s  per host {fit['per_host_s']:7.3f} s  exponent {exponent}  "
              f"one more host: {fit['marginal_per_host_s']}")
    for line in summary["superlinear"]:
        print(f"SUPER-LINEAR: {line}")
    for flag in summary["task_flags"]:
        print(f"SUPER-LINEAR task: {flag['task']}: {flag['per_host_small']} s per host at {flag['small_hosts']} hosts, "
              f"{flag['per_host_large']} s at {flag['large_hosts']}")
    failed = [f"N={r['hosts']}" for r in result["runs"] if not r["ok"]]
    if failed:
        print(f"FAILED runs: {', '.join(failed)}")
    print(f"written {out}")
    return 1 if failed or summary["superlinear"] or summary["task_flags"] else 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.summarize:
            earlier = [json.loads(Path(f).read_text(encoding="utf-8")) for f in args.summarize]
            result = dict(earlier[0], runs=[r for e in earlier for r in e["runs"]])
            result["summary"] = summarize(result["runs"], args.superlinear_factor, args.min_task_s,
                                          args.min_task_delta_s)
            return report(result, REPO / args.out)
        if args.delegation_check:
            work = REPO / args.work
            work.mkdir(parents=True, exist_ok=True)
            runs = delegation_check(args.host_counts, work, args.forks, args.timeout)
            (REPO / args.out).write_text(json.dumps({"delegation_check": runs}, indent=1), encoding="utf-8")
            return 0 if all(r["rc"] == 0 for r in runs) else 1
        inv_path = Path(args.inventory)
        if not inv_path.is_file():
            raise ProbeError(f"inventory {inv_path} does not exist (bring the lab up: tests/lab/lab.py up)")
        lab = lab_hosts(yaml.safe_load(inv_path.read_text(encoding="utf-8")))
    except (ProbeError, OSError, ValueError, KeyError) as exc:
        print(f"scale_probe: {exc}", file=sys.stderr)
        return 2
    work = REPO / args.work
    work.mkdir(parents=True, exist_ok=True)
    runs = [probe_one(n, lab, args, work) for n in args.host_counts]
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "config": args.config,
              "serial": args.serial, "forks": args.forks, "cpus": os.cpu_count(), "lab_hosts": [h for h, _ in lab],
              "shared_ssh": args.shared_ssh, "runs": runs,
              "summary": summarize(runs, args.superlinear_factor, args.min_task_s, args.min_task_delta_s)}
    return report(result, REPO / args.out)


if __name__ == "__main__":
    sys.exit(main())
