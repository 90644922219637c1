"""Budget sweep: deploy a DDTree config at each budget (× top-k cap), benchmark it, find the cliff.

    python -m sgdeploy.sweep --config BASE --budgets "8 15 16 32 64" [--topk-caps "4 8"]
        --inventory INV [--host HOST] [--out reports/sweeps] [--cliff-drop 0.25] [--tie-tolerance 0.03]
        [--requests N] [--max-tokens M] [--bench-timeout S] [--batches "1 4 8 16"] [-e VARS ...] [--json]

One variant at a time on one host: a variant config ``build/sweeps/<id>/configs/<base>-b<B>-k<K>.yml``
(``extends: <base>``), deployed by the normal playbook with ``sglang_deploy_gate_mode=smoke`` (each
deploy drains and stops the previous variant: they share GPU and port), benchmarked from the
controller through an SSH tunnel with the config's bench settings, then drained. Afterwards (also
after a failure, Ctrl-C or SIGTERM) the config that ran on the host before the sweep is deployed again
with the normal gates; when none ran, the sweep's variant units are stopped and disabled.

Exit status: 0 the sweep completed and the host is restored; 1 a variant failed to deploy or be
measured (its row is marked failed), or the restore failed; 2 bad input (nothing was deployed);
130 interrupted (after restoring). Report: ``<out>/<base>-<UTC timestamp>/`` with results.json,
results.md and sweep.png (see docs/sweep.md).

With ``--batches``, each variant is also benchmarked with that many requests in flight at each batch size, and
the report holds the budget schedule (``sgdeploy.schedule.derive``) that maximises tokens/s per batch bucket,
its per-bucket table, and a config that uses it (``<base>-sched.yml``).
"""

from __future__ import annotations

import argparse
import configparser
import copy
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import ansible_runner
import yaml

from sgdeploy import bench, gate, records, report, schedule, serving, spec, tunnel

REPO_ROOT = spec.REPO_ROOT
BUILD_DIR = REPO_ROOT / "build" / "sweeps"
PLAYBOOK = REPO_ROOT / "playbooks" / "deploy.yml"
HOST_GROUP = "gpu_hosts"
# ansible-runner's private data dir (its artifacts: stdout, events) inside build/sweeps/<id>/, removed after each run
RUNNER_DIR = "ansible-runner"
ADHOC_TIMEOUT_S = 300
# --batches: each batch size B is benchmarked with B requests in flight, B * BATCH_WAVES requests in all (all of
# the same length, so each wave runs at B the whole time)
BATCH_WAVES = 2


class UsageError(ValueError):
    """Bad input found before anything was deployed: exit 2, one line per problem."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


# --------------------------------------------------------------------------------------------------
# Plan: parse the lists, write and validate the variant configs (no host is touched)


def parse_numbers(text: str, what: str, option: str) -> list[int]:
    """``"8 15, 32"`` → [8, 15, 32]; a non-number or a repeat is a UsageError naming it."""
    items = [t for t in re.split(r"[\s,]+", text.strip()) if t]
    if not items:
        raise UsageError(f"{option} {text!r}: give at least one {what}, e.g. {option} \"8 15 32\"")
    out: list[int] = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"{option} {text!r}: {item!r} is not a whole number; give {what}s separated "
                             "by spaces") from None
        if value in out:
            raise UsageError(f"{option} {text!r}: {what} {value} is given twice")
        out.append(value)
    return out


@dataclass(frozen=True)
class Variant:
    budget: int
    topk_cap: int
    name: str
    path: Path
    reproduce_state_leak: bool


def variant_name(base: str, budget: int, cap: int) -> str:
    return f"{base}-b{budget}-k{cap}"


def _spec_problems(merged: dict, source: Path, name: str, **speculative: Any) -> set[str]:
    data = copy.deepcopy(merged)
    data.setdefault("speculative", {}).update(speculative)
    try:
        spec.validate(data, source, name)
    except spec.ConfigError as err:
        return set(err.problems)
    return set()


def needs_state_leak(base: spec.Config, budget: int) -> bool:
    """True when the variant at ``budget`` leaks: spec's own rule (``spec.validate``) refuses it without
    ``reproduce_state_leak`` and accepts that problem away with it, which is the case without state forking
    on a model with recurrent layers above block_size - 1. The rule is asked of spec, not restated here:
    the sweep measures the collapse on purpose, and such a variant is never recommended."""
    merged = spec.load_merged(base.source, base.source.parent)
    cap = min(base.speculative.topk_cap or 1, max(budget, 1))
    without = _spec_problems(merged, base.source, base.name, budget=budget, topk_cap=cap,
                             reproduce_state_leak=False)
    opted_in = _spec_problems(merged, base.source, base.name, budget=budget, topk_cap=cap,
                              reproduce_state_leak=True)
    return bool(without - opted_in)


def _base_cap(base: spec.Config, budget: int) -> int:
    """The base's top-k cap, lowered to ``budget`` where the budget is smaller (a cap cannot exceed it)."""
    cap = base.speculative.topk_cap
    if cap is None:
        raise AssertionError(f"{base.name}: a DDTREE config without speculative.topk_cap (spec requires it)")
    return min(cap, budget) if budget >= 1 else cap


def load_base(name_or_path: str) -> spec.Config:
    try:
        base = spec.load(name_or_path)
    except spec.ConfigError as err:
        raise UsageError(err.problems) from None
    if base.speculative.algorithm != "DDTREE":
        raise UsageError(f"--config {name_or_path}: speculative.algorithm is {base.speculative.algorithm}; "
                         "a budget sweep needs a DDTREE config (e.g. ddtree-b15)")
    sv = base.serving
    if sv.router:
        # Refused, not swept: each variant deploy would roll the serving replicas (the router's capacity
        # halves for every variant) and the bench through the router mixes replicas; the budget's effect is
        # a property of one engine, the same on every replica (docs/sweep.md, "Replicas").
        raise UsageError(
            f"--config {name_or_path}: serving.replicas {sv.replicas} behind the router on port {sv.port} is not "
            "swept (a sweep deploys each variant over the serving replicas); sweep one engine instead: a config "
            f"with 'extends: {base.name}' and serving: {{replicas: 1, router: false, gpus: [<{sv.tp_size} free "
            "GPU(s)>], port: <a free port>}, then deploy the best budget to the replicas with make deploy")
    if sv.api_key_secret:
        # Refused, not measured wrong: the sweep's bench runs on the controller through an SSH tunnel, and the
        # engines' API key never leaves the host (docs/router.md, "API keys of the engines"), so every request
        # would get 401.
        raise UsageError(
            f"--config {name_or_path}: serving.api_key_secret {sv.api_key_secret!r}: not swept (the sweep "
            "benchmarks from the controller, and the engines' API key stays on the host); sweep a copy of it "
            "without serving.api_key_secret on a loopback address, then deploy the best budget with make deploy")
    return base


def check_batches(batches: list[int], caps: list[int] | None, base: spec.Config, text: str) -> None:
    """--batches: sizes of 1 or more, at most serving.max_running_requests, and one top-k cap (a schedule
    varies the budget, not the cap). Raises UsageError."""
    for n in batches:
        if n < 1:
            raise UsageError(f"--batches {text!r}: batch size {n} must be 1 or more")
    most = base.serving.max_running_requests
    if most is not None and max(batches) > most:
        raise UsageError(f"--batches {text!r}: batch size {max(batches)} is above serving.max_running_requests "
                         f"({most}) of {base.name}: the engine never runs that many at once")
    if caps is not None and len(caps) > 1:
        raise UsageError(f"--batches with --topk-caps {' '.join(map(str, caps))}: a budget schedule keeps one top-k "
                         "cap; give one cap")


def plan_variants(base: spec.Config, budgets: list[int], caps: list[int] | None,
                  config_dir: Path) -> list[Variant]:
    """Write one config per budget × cap (in that order) into ``config_dir`` and validate each.

    Without ``caps`` every variant keeps the base's top-k cap, lowered to the budget where the budget
    is smaller (a cap cannot exceed the budget). Raises UsageError with every problem found.
    """
    config_dir.mkdir(parents=True, exist_ok=True)
    parent = base.name
    if base.source.parent.resolve() != spec.CONFIG_DIR.resolve():
        # A base outside configs/: put its merged form beside the variants so that `extends` finds it.
        (config_dir / f"{base.name}.yml").write_text(spec.to_yaml(base))
    variants: list[Variant] = []
    problems: list[str] = []
    for budget in budgets:
        for cap in caps if caps else [_base_cap(base, budget)]:
            name = variant_name(base.name, budget, cap)
            leak = needs_state_leak(base, budget)
            speculative: dict[str, Any] = {"budget": budget, "topk_cap": cap}
            if leak != base.speculative.reproduce_state_leak:
                speculative["reproduce_state_leak"] = leak
            data = {"extends": parent,
                    "description": f"{base.description or base.name}: sweep variant, budget {budget}, top-k cap {cap}",
                    "speculative": speculative}
            path = config_dir / f"{name}.yml"
            header = (f"# Sweep variant of {base.name}: budget {budget}, top-k cap {cap}"
                      + (" (measures the state-leak collapse on purpose)" if leak else "") + "\n")
            path.write_text(header + yaml.safe_dump(data, sort_keys=False))
            try:
                spec.load(path)
            except spec.ConfigError as err:
                problems.extend(f"budget {budget} cap {cap}: {p}" for p in err.problems)
                continue
            variants.append(Variant(budget, cap, name, path.resolve(), leak))
    if problems:
        raise UsageError(problems)
    return variants


# --------------------------------------------------------------------------------------------------
# Inventory


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def read_inventory(inventory: Path) -> dict:
    """``ansible-inventory --list`` of the inventory (groups and ``_meta.hostvars``)."""
    if not inventory.is_file():
        raise UsageError(f"--inventory {inventory}: no such file")
    proc = subprocess.run([_bin("ansible-inventory"), "-i", str(inventory), "--list"], capture_output=True,
                          text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, check=False)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    if proc.returncode != 0 or not isinstance(data, dict):
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"--inventory {inventory}: ansible-inventory could not read it: {why}")
    return data


def group_hosts(data: dict, group: str) -> list[str]:
    out: list[str] = []

    def walk(name: str, seen: set[str]) -> None:
        if name in seen:
            return
        seen.add(name)
        entry = data.get(name) or {}
        for h in entry.get("hosts", []):
            if h not in out:
                out.append(h)
        for child in entry.get("children", []):
            walk(child, seen)

    walk(group, set())
    return out


def pick_host(data: dict, inventory: Path, host: str | None) -> tuple[str, dict]:
    hosts = group_hosts(data, HOST_GROUP)
    if not hosts:
        raise UsageError(f"--inventory {inventory}: group {HOST_GROUP} has no hosts; list the GPU servers there")
    if host is None:
        host = hosts[0]
    elif host not in hosts:
        raise UsageError(f"--host {host}: not in group {HOST_GROUP} of {inventory}; hosts there: {', '.join(hosts)}")
    hostvars = data.get("_meta", {}).get("hostvars", {}).get(host, {})
    try:  # the SSH settings the tunnel cannot honour are refused here, before anything is deployed
        tunnel.Target.from_hostvars(host, hostvars)
    except tunnel.SSHSettingsError as err:
        raise UsageError(f"--inventory {inventory}: {err}") from None
    return host, hostvars


# --------------------------------------------------------------------------------------------------
# Signals: Ctrl-C and SIGTERM stop the sweep, never a deploy or the restore halfway


class Signals:
    """While ``raising``, SIGINT/SIGTERM raise KeyboardInterrupt; otherwise they are only noted."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.raising = True
        self.received: str | None = None
        self._say = say
        self._old: dict = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        first = self.received is None
        self.received = name
        if self.raising:
            self.raising = False
            raise KeyboardInterrupt(name)
        if first:
            self._say(f"{name}: letting the step in progress finish, then the sweep stops and restores the host")

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# --------------------------------------------------------------------------------------------------
# One sweep


@dataclass
class DeployResult:
    ok: bool
    seconds: float
    message: str
    log: Path


# --------------------------------------------------------------------------------------------------
# Ansible, through ansible-runner: its status, return code and the events of its callback, not stdout


FAILED_EVENTS = ("runner_on_failed", "runner_on_unreachable")


@dataclass
class AnsibleRun:
    """How one ansible-runner run ended: runner's status (successful, failed, timeout, canceled), Ansible's
    return code, the events its callback sent, and its stdout (what Ansible printed, for the log and for an
    error that stops Ansible before any task, which sends no event)."""

    status: str
    rc: int | None
    events: list[dict]
    stdout: str
    command: list[str]

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def results(self, *kinds: str) -> list[tuple[str, dict]]:
        """(event name, event_data) of each host result of these kinds (runner_on_ok, runner_on_failed, ...),
        leaving out failures Ansible was told to ignore."""
        out = []
        for event in self.events:
            data = event.get("event_data") or {}
            if event.get("event") in kinds and not (event.get("event") == "runner_on_failed"
                                                    and data.get("ignore_errors")):
                out.append((event["event"], data))
        return out


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def reason_of(res: dict) -> str:
    """The one-line reason of a failed result: its msg, else stderr, else the first failed loop item's."""
    failed_items = [i for i in res.get("results") or [] if isinstance(i, dict) and i.get("failed")]
    if failed_items:
        return reason_of(failed_items[0])
    for key in ("msg", "stderr", "reason", "stdout"):
        if res.get(key):
            return _one_line(res[key])
    return "failed (no message)"


def failure_message(run: AnsibleRun) -> str:
    """Why a playbook run failed, from runner's events: the deploy role's own verdict (``DEPLOY FAILED``,
    ``DEPLOY REFUSED``, ``GATE FAILED``, the message of its ``fail`` task), else the last task that failed or
    the host that was unreachable; without such an event (Ansible stopped before any task) its error line."""
    failures = []
    for kind, data in run.results(*FAILED_EVENTS):
        reason = reason_of(data.get("res") or {})
        failures.append(reason if kind == "runner_on_failed" else f"{data.get('host')}: unreachable: {reason}")
    for pattern in (r"DEPLOY (?:FAILED|REFUSED)", r"GATE FAILED"):
        found = [f for f in failures if re.match(pattern, f)]
        if found:
            return found[-1]
    if failures:
        return failures[-1][:400]
    if run.status == "timeout":
        return "timed out"
    errors = re.findall(r"((?:ERROR!|\[ERROR\]:)[^\n]*)", run.stdout)
    if errors:
        return errors[-1].strip()[:400]
    tail = [line for line in run.stdout.splitlines() if line.strip()]
    return tail[-1][:400] if tail else f"no output (ansible-runner: {run.status}, exit {run.rc})"


def adhoc_detail(run: AnsibleRun, host: str) -> str:
    """One line of what an ad-hoc run said of the host, in the shape of ``ansible -o``: ``HOST | FAILED | rc=1 |
    (stdout) ...``, ``HOST | FAILED! => msg``, ``HOST | UNREACHABLE!: msg``; else Ansible's error line."""
    for kind, data in run.results(*FAILED_EVENTS):
        res = data.get("res") or {}
        name = data.get("host") or host
        if kind == "runner_on_unreachable":
            return f"{name} | UNREACHABLE!: {reason_of(res)}"[:300]
        if "rc" in res:
            line = f"{name} | FAILED | rc={res['rc']} | (stdout) {_one_line(res.get('stdout') or '')}"
            if res.get("stderr"):
                line += f" (stderr) {_one_line(res['stderr'])}"
            return line[:300]
        return f"{name} | FAILED! => {reason_of(res)}"[:300]
    if run.status == "timeout":
        return f"{host}: no answer in {ADHOC_TIMEOUT_S} s"
    return failure_message(run)[:300]


def _ansible_cfg() -> Path | None:
    """The ansible.cfg Ansible reads when run from the repository (``ANSIBLE_CONFIG`` first)."""
    path = Path(os.environ.get("ANSIBLE_CONFIG") or REPO_ROOT / "ansible.cfg")
    return path if path.is_file() else None


def runner_env(playbook: bool) -> dict[str, str]:
    """What ansible-runner adds to the environment so that Ansible runs as it does from the repository: its
    ansible.cfg (an ad-hoc run's working folder is runner's), the project's stdout callback under runner's
    (``ORIGINAL_STDOUT_CALLBACK``: the deploy logs read as ``make deploy`` prints), and no colour codes
    (runner gives Ansible a terminal); the Ansible beside this Python first, as ``_bin`` picks it."""
    env: dict[str, str] = {}
    here = Path(sys.executable).parent
    if (here / "ansible-playbook").exists():
        env["PATH"] = os.pathsep.join([str(here), os.environ.get("PATH", "")])
    cfg = _ansible_cfg()
    if cfg is not None:
        env["ANSIBLE_CONFIG"] = str(cfg)
    if playbook and not os.environ.get("ANSIBLE_STDOUT_CALLBACK") and cfg is not None:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(cfg)
            callback = parser.get("defaults", "stdout_callback", fallback=None)
        except configparser.Error:
            callback = None
        if callback:
            env["ANSIBLE_STDOUT_CALLBACK"] = callback.strip()
    if not os.environ.get("ANSIBLE_FORCE_COLOR"):
        env.setdefault("ANSIBLE_NOCOLOR", os.environ.get("ANSIBLE_NOCOLOR") or "1")
    return env


def run_ansible(private_dir: Path, ident: str, *, log: Path | None = None, timeout: float | None = None,
                cancel: Callable[[], bool] | None = None, extra_args: list[str] | None = None,
                **kwargs: Any) -> AnsibleRun:
    """One ``ansible_runner.run`` (a playbook, or an ad-hoc module) with its artifacts in
    ``private_dir/artifacts/<ident>``, removed afterwards. ``log`` gets the command, then Ansible's output as
    it comes (from the events), then all of it. ``cancel``, asked about every 5 s (runner's pexpect_timeout),
    stops the run when it returns True; without it nothing cancels a run. Always a cancel callback: without
    one, runner installs its own SIGINT/SIGTERM handlers, which would take the sweep's."""
    private_dir.mkdir(parents=True, exist_ok=True)
    events: list[dict] = []
    command: list[str] = []
    out = open(log, "w") if log is not None else None  # closed in finally
    if out is not None and log is not None:
        os.chmod(log, report.FILE_MODE)  # the report's files share one mode

    def on_status(data: dict, runner_config: Any = None) -> None:
        if data.get("status") == "starting":
            command[:] = [str(c) for c in data.get("command") or []]
            if out is not None:
                out.write("$ " + shlex.join(command) + "\n")
                out.flush()

    def on_event(event: dict) -> bool:
        events.append(event)
        if out is not None and event.get("stdout"):
            out.write(event["stdout"] + "\n")
            out.flush()
        return True

    playbook = "playbook" in kwargs
    try:
        runner = ansible_runner.run(
            private_data_dir=str(private_dir), ident=ident, project_dir=str(REPO_ROOT), quiet=True,
            envvars=runner_env(playbook), cmdline=shlex.join(extra_args) if extra_args else None,
            event_handler=on_event, status_handler=on_status, cancel_callback=cancel or (lambda: False),
            timeout=timeout, suppress_env_files=True, fact_cache_type="memory", **kwargs)
        try:
            with runner.stdout as f:
                stdout = f.read().replace("\r\n", "\n")  # Ansible wrote to a terminal (runner's pty)
        except Exception:  # no stdout file: Ansible never started
            stdout = ""
        if out is not None and stdout:
            out.seek(0)
            out.truncate()
            out.write("$ " + shlex.join(command) + "\n" + stdout)
        return AnsibleRun(str(runner.status), runner.rc, events, stdout, command)
    finally:
        if out is not None:
            out.close()
        shutil.rmtree(private_dir / "artifacts" / ident, ignore_errors=True)


@dataclass
class Sweep:
    base: spec.Config
    variants: list[Variant]
    inventory: Path
    host: str
    hostvars: dict
    sweep_id: str
    report_dir: Path
    cliff_drop: float
    tie_tolerance: float
    requests: int
    concurrency: int
    max_tokens: int
    bench_timeout: float
    json_out: bool = False
    extra_vars: list[str] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    deployed: list[Variant] = field(default_factory=list)
    signals: Signals | None = None
    _runs: int = 0

    # ---- output
    def say(self, line: str) -> None:
        print(line, file=sys.stderr if self.json_out else sys.stdout, flush=True)

    @property
    def target(self) -> tunnel.Target:
        return tunnel.Target.from_hostvars(self.host, self.hostvars)

    @property
    def simulated(self) -> bool:
        """The lab's hosts (inventory ``sglang_lab: true``) run the simulated engine (tests/sim)."""
        return bool(self.hostvars.get("sglang_lab"))

    @property
    def state_dir(self) -> str:
        return str(self.hostvars.get("sglang_deploy_state_dir") or "/var/lib/sglang-deploy")

    @property
    def runner_dir(self) -> Path:
        """ansible-runner's private data dir for this sweep (its artifacts); removed when the sweep ends."""
        return BUILD_DIR / self.sweep_id / RUNNER_DIR

    def ansible(self, what: str, *, cancellable: bool = False, log: Path | None = None, timeout: float | None = None,
                **kwargs: Any) -> AnsibleRun:
        """One Ansible run through ansible-runner on this host: the inventory's SSH settings, user and privilege
        escalation (``ansible_become``) apply as in a deploy, and so do the sweep's ``-e`` vars (on the command
        line, before the sweep's own). A signal meanwhile never interrupts Python inside runner (Ansible would
        be left running): it is noted; a ``cancellable`` run (a read-only one) is then stopped and the signal
        raised as KeyboardInterrupt, any other run finishes first (a deploy is a transaction)."""
        self._runs += 1
        protect = self.signals
        was = protect.raising if protect else False
        if protect:
            protect.raising = False

        def cancel() -> bool:
            return bool(cancellable and protect and protect.received)

        extra = [arg for value in self.extra_vars for arg in ("-e", value)]
        try:
            result = run_ansible(self.runner_dir, f"{self._runs:02d}-{what}", log=log, timeout=timeout,
                                 cancel=cancel, extra_args=extra, inventory=str(self.inventory), **kwargs)
        finally:
            if protect:
                protect.raising = was and protect.received is None
        if protect and protect.received and cancellable and was:
            raise KeyboardInterrupt(protect.received)
        return result

    def adhoc(self, module: str, args: dict, cancellable: bool = False) -> AnsibleRun:
        """One ad-hoc module on the host (ansible-runner's module/module_args/host_pattern)."""
        return self.ansible(module.rsplit(".", 1)[-1], cancellable=cancellable, timeout=ADHOC_TIMEOUT_S,
                            module=module, module_args=json.dumps(args), host_pattern=self.host)

    @property
    def bind(self) -> str:
        address = str(self.hostvars.get("sglang_bind_address") or self.base.serving.host)
        return "127.0.0.1" if address == "0.0.0.0" else address

    # ---- host
    def running_before(self) -> list[str]:
        """Configs active on the host now that a variant would replace (same GPU, or same address and port)."""
        # The status module of the deploy (read-only), as an ad-hoc call: nothing of sgdeploy is on the host.
        run = self.adhoc("sgdeploy.host.sglang_deploy_status", {"state_dir": self.state_dir}, cancellable=True)
        found = [data.get("res") or {} for _, data in run.results("runner_on_ok") if data.get("host") == self.host]
        deployed = found[-1].get("deployed") if found and run.ok else None
        if not isinstance(deployed, list):
            raise tunnel.TunnelError(f"{self.host}: reading what runs there (sgdeploy.host.sglang_deploy_status) "
                                     f"exited {run.rc}: {adhoc_detail(run, self.host)}")
        sv = self.base.serving
        clash = []
        for d in deployed:
            if not d.get("active"):
                continue
            same_gpu = set(d.get("gpus", [])) & set(sv.gpus)
            same_port = d.get("bind_address") == self.bind and set(d.get("ports", [])) & {sv.port, sv.nccl_port}
            if same_gpu or same_port:
                clash.append(d["config"])
        return clash

    def deploy(self, config: str | Path, gate_mode: str, log: Path, protect: Signals) -> DeployResult:
        """Run the deploy playbook for one host; a signal waits for it (a deploy is a transaction). Runner runs
        Ansible in its own session (a terminal): Ctrl-C there reaches the sweep, not the deploy halfway through."""
        log.parent.mkdir(parents=True, exist_ok=True)
        self.signals = self.signals or protect
        start = time.monotonic()
        result = self.ansible(f"deploy-{Path(str(config)).stem}", log=log, playbook=str(PLAYBOOK), limit=self.host,
                              extravars={"config": str(config), "sglang_deploy_gate_mode": gate_mode})
        seconds = time.monotonic() - start
        return DeployResult(result.ok, round(seconds, 1), "" if result.ok else failure_message(result), log)

    # ---- measure
    def thresholds(self) -> gate.GateThresholds:
        """The config's gates mapping, with the sweep's bench size (``--requests``, ``--max-tokens``)."""
        return gate.GateThresholds.from_mapping({**self.base.gates.as_mapping(), "bench_requests": self.requests,
                                                 "bench_max_tokens": self.max_tokens})

    def measure(self, variant: Variant) -> tuple[gate.GateReport, list[dict]]:
        """The deploy's gates (``gate.run_all``: smoke, then one bench shared by throughput and acceptance)
        against the variant through an SSH tunnel; the bench is the sweep's measurement. Exactness needs the
        host's references: its verdict is the one the variant's deploy recorded (``exactness_of``). With
        ``--batches`` (and a smoke gate that let a bench run), then one bench per batch size (``measure_batches``)."""
        folder = REPO_ROOT / "reports" / "deploys" / self.host
        baseline = records.last_good(folder, variant.name, self.host) if folder.is_dir() else None
        cells: list[dict] = []
        with tunnel.forward(self.target, remote_port=self.base.serving.port, remote_host=self.bind) as url:
            result = gate.run_all(url, self.thresholds(), True, baseline, prompts=bench.load_prompts(),
                                  bench_timeout=self.bench_timeout)
            if self.batches and result.bench is not None:
                cells = self.measure_batches(url)
            drained = serving.wait_drained(url, timeout=self.base.serving.drain_timeout_s)
        if not drained.ok:
            self.say(f"    note: {variant.name} not drained after the bench ({drained.state}: {drained.detail}); "
                     "the next deploy drains it")
        return result, cells

    def measure_batches(self, url: str) -> list[dict]:
        """One bench per batch size B: B requests in flight (concurrency B), B * BATCH_WAVES requests of
        ``max_tokens`` each. A cell per size: accept length, tokens/s, step time, or why it failed."""
        cells = []
        prompts = bench.load_prompts()
        for n in self.batches:
            try:
                b = bench.run(url, prompts, n * BATCH_WAVES, n, self.max_tokens, self.bench_timeout).to_dict()
            except Exception as exc:  # the bench's own error, or the tunnel's: this cell is not measured
                cell = {"batch": n, "accept_length_mean": None, "tokens_per_s": None, "step_time_ms": None,
                        "requests": n * BATCH_WAVES, "failures": n * BATCH_WAVES, "status": "failed",
                        "error": f"bench failed: {exc}"}
            else:
                ok = b["completed"] > 0 and b["accept_length_mean"] is not None
                cell = {"batch": n, "accept_length_mean": b["accept_length_mean"],
                        "tokens_per_s": b["tokens_per_s"] if ok else None, "step_time_ms": b["step_time_ms_mean"],
                        "requests": b["requests"], "failures": b["failed"], "status": "ok" if ok else "failed",
                        "error": None if ok else (b["errors"][0]["message"] if b["errors"] else
                                                  "no completed request reported speculative metrics")}
            cells.append(cell)
            self.say(f"    batch {n}: {progress_cell(cell)}")
        return cells

    def record_paths(self) -> set[str]:
        """The deploy records fetched to reports/deploys/<host>/ so far (to tell a deploy's own record)."""
        folder = REPO_ROOT / "reports" / "deploys" / self.host
        return {str(path) for path, _ in records.iter_records(folder)} if folder.is_dir() else set()

    def exactness_of(self, variant: Variant, seen: set[str] | None = None) -> dict | None:
        """The exactness verdict of the variant's deploy (the gate module on the host, against the host's
        references; in smoke mode it runs without blocking) from the record it fetched to
        reports/deploys/<host>/, leaving out the records in ``seen`` (those before this deploy); None
        when there is none."""
        folder = REPO_ROOT / "reports" / "deploys" / self.host
        found = [r for path, r in records.iter_records(folder)
                 if r.get("config") == variant.name and str(path) not in (seen or set())] if folder.is_dir() else []
        e = found[-1].get("exactness") if found else None
        return {"verdict": e.get("verdict"), "reason": e.get("reason")} if isinstance(e, dict) else None

    def row_from_gates(self, variant: Variant, gates: gate.GateReport, deploy_s: float,
                       exactness: dict | None) -> dict:
        """The variant's row: the bench the gates ran, each of the four gates' verdict, and the gates that
        would stop a deploy of it (``gates_failed``, by the gate code's own rule)."""
        if gates.bench is not None:
            row = self.row_from_bench(variant, gates.bench.to_dict(), deploy_s)
        else:
            smoke = next((r for r in gates.results if r.gate == "smoke"), None)
            why = f"{smoke.verdict}: {smoke.reason}" if smoke else "no bench ran"
            row = report.variant_row(variant.budget, variant.topk_cap, status="failed",
                                     error=f"not measured: the smoke gate {why}", config=variant.name,
                                     deploy_s=deploy_s, reproduce_state_leak=variant.reproduce_state_leak)
        if exactness is None or exactness.get("verdict") not in (gate.PASS, gate.FAIL, gate.INCONCLUSIVE):
            exactness = {"verdict": gate.INCONCLUSIVE, "reason": "the variant's deploy recorded no exactness verdict"}
        judged = gate.GateReport(gates.url, gates.speculative, gates.thresholds, list(gates.results),
                                 exactness=gate.GateResult("exactness", "prompts_equal", None, None, None,
                                                           exactness["verdict"], exactness.get("reason") or ""),
                                 exactness_enforced=True)
        verdicts: dict[str, dict[str, Any]] = {r.gate: {"verdict": r.verdict, "reason": r.reason}
                                               for r in gates.results}
        verdicts["exactness"] = {"verdict": exactness["verdict"], "reason": exactness.get("reason")}
        row["gates"] = {g: verdicts.get(g) for g in report.GATE_NAMES}
        row["gates_failed"] = judged.failed_gates
        row["exactness"] = verdicts["exactness"]
        row["leaks"] = variant.reproduce_state_leak
        return row

    def row_from_bench(self, variant: Variant, b: dict, deploy_s: float) -> dict:
        ok = b["completed"] > 0 and b["accept_length_mean"] is not None
        error = None
        if not ok:
            error = (b["errors"][0]["message"] if b["errors"]
                     else "no completed request reported speculative metrics")
        return report.variant_row(
            variant.budget, variant.topk_cap, accept_length_mean=b["accept_length_mean"],
            accept_length_sd=b["accept_length_stdev"], tokens_per_s=b["tokens_per_s"] if ok else None,
            step_time_ms=b["step_time_ms_mean"], requests=b["requests"], failures=b["failed"],
            status="ok" if ok else "failed", error=error, config=variant.name, deploy_s=deploy_s,
            completed=b["completed"], bench_wall_s=b["wall_s"], bench_errors=b["errors"][:3],
            reproduce_state_leak=variant.reproduce_state_leak)

    # ---- the budget schedule's config
    def schedule_config(self, derived: dict) -> dict:
        """A config that extends the base with the derived schedule (``config_file``: ``<base>-sched.yml`` in the
        report, ``config_yaml``: its text), validated as a deploy would (``config_problems``: empty when it is
        ready to use). Its top-k cap is the base's, lowered to the smallest scheduled budget where larger."""
        entries = [tuple(e) for e in derived["schedule"]]
        smallest = min(b for _, b in entries)
        speculative: dict[str, Any] = {"budget": max(b for _, b in entries),
                                       "budget_schedule": schedule.as_entries(tuple(entries))}
        cap = self.base.speculative.topk_cap
        if cap is not None and cap > smallest:
            speculative["topk_cap"] = smallest
        if self.base.speculative.reproduce_state_leak:
            speculative["reproduce_state_leak"] = False  # only qualifying (non-leaking) budgets are scheduled
        data = {"extends": self.base.name,
                "description": f"{self.base.name} with the budget schedule {derived['flag']} (sweep {self.sweep_id})",
                "speculative": speculative}
        text = (f"# Budget schedule derived by sweep {self.sweep_id} on {self.host} (docs/sweep.md)"
                + (" -- SIMULATED engine: plumbing, not SGLang's behaviour" if self.simulated else "") + "\n"
                + yaml.safe_dump(data, sort_keys=False, default_flow_style=None))
        try:
            spec.validate(spec.deep_merge(copy.deepcopy(self.base.merged), data), self.base.source,
                          f"{self.base.name}-sched")
            problems: list[str] = []
        except spec.ConfigError as err:
            problems = err.problems
        return {"config_file": f"{self.base.name}-sched.yml", "config_yaml": text, "config_problems": problems}

    # ---- restore
    def restore(self, before: list[str], protect: Signals) -> dict:
        """Put the host back: deploy what ran before (normal gates), or stop and disable the variants."""
        protect.raising = False
        if not self.deployed:
            return {"action": "none", "ok": True, "configs": [], "detail": "no variant was deployed"}
        if before:
            done: list[str] = []
            for name in before:
                path = restore_target(name, self.base)
                if path is None:
                    return {"action": "redeploy", "ok": False, "configs": done,
                            "detail": f"config {name} (ran before the sweep) is not in {spec.CONFIG_DIR} or beside "
                                      f"{self.base.source}; deploy it by hand"}
                self.say(f"restoring {name} on {self.host} (normal gates) ...")
                result = self.deploy(path, "full", self.report_dir / "logs" / f"restore-{name}.log", protect)
                if not result.ok:
                    return {"action": "redeploy", "ok": False, "configs": done,
                            "detail": f"deploying {name} again failed: {result.message} (log: {result.log})"}
                done.append(name)
            self.cleanup_variants(stop=False)
            return {"action": "redeploy", "ok": True, "configs": done,
                    "detail": f"{', '.join(done)} deployed again and passed its gates"}
        self.say(f"nothing ran on {self.host} before the sweep: stopping and disabling the variants ...")
        problem = self.cleanup_variants(stop=True)
        return {"action": "stop", "ok": problem is None, "configs": [],
                "detail": problem or "the sweep's variant units are stopped and disabled"}

    def cleanup_variants(self, stop: bool) -> str | None:
        """Disable every variant unit that was installed (and stop it when ``stop``); forget their current.json.

        Through Ansible (``ansible.builtin.shell`` ad hoc): the inventory's user, SSH settings and privilege
        escalation apply as in the deploy (e.g. ``ansible_user: ubuntu`` with ``ansible_become: true``), and
        the state folder is the host's ``sglang_deploy_state_dir``."""
        units = " ".join(shlex.quote(spec.load(v.path).unit_name) for v in self.deployed)
        folders = " ".join(shlex.quote(f"{self.state_dir.rstrip('/')}/{v.name}") for v in self.deployed)
        script = (f"rc=0; for u in {units}; do if systemctl cat -- \"$u\" >/dev/null 2>&1; then "
                  f"systemctl disable {'--now ' if stop else ''}--quiet -- \"$u\" || rc=1; fi; done; "
                  f"for d in {folders}; do rm -f -- \"$d/current.json\" || rc=1; done; "
                  f"for u in {units}; do if systemctl is-active --quiet -- \"$u\"; then echo \"$u is still active\"; "
                  "rc=1; fi; done; exit $rc")
        run = self.adhoc("ansible.builtin.shell", {"cmd": script})
        if not run.ok:
            return f"stopping the variant units failed (ansible exit {run.rc}): {adhoc_detail(run, self.host)}"
        return None

    # ---- the whole run
    def run(self) -> tuple[int, dict]:
        protect = Signals(self.say)
        protect.install()
        self.signals = protect
        started = report_time()
        interrupted = False
        crashed: str | None = None
        before: list[str] = []
        try:
            try:
                before = self.running_before()
            except tunnel.TunnelError as exc:
                protect.uninstall()
                shutil.rmtree(self.runner_dir, ignore_errors=True)
                self.say(f"sweep: cannot read what runs on {self.host}: {exc}; nothing was deployed")
                return 1, {}
            self.say(f"sweep {self.sweep_id}: {len(self.variants)} variants of {self.base.name} on {self.host}; "
                     f"running before: {', '.join(before) or 'nothing'}; bench {self.requests} requests x "
                     f"{self.max_tokens} tokens, concurrency {self.concurrency}")
            total = len(self.variants)
            for i, v in enumerate(self.variants, 1):
                label = f"[{i}/{total}] budget {v.budget} cap {v.topk_cap}"
                self.say(f"{label}: deploying {v.name} ...")
                self.deployed.append(v)
                seen = self.record_paths()
                result = self.deploy(v.path, "smoke", self.report_dir / "logs" / f"{v.name}.log", protect)
                if protect.received:
                    raise KeyboardInterrupt(protect.received)
                if not result.ok:
                    self.rows.append(report.variant_row(v.budget, v.topk_cap, status="failed",
                                                        error=f"deploy failed: {result.message}", config=v.name,
                                                        deploy_s=result.seconds, leaks=v.reproduce_state_leak,
                                                        reproduce_state_leak=v.reproduce_state_leak))
                    self.say(f"{label}: FAILED to deploy after {result.seconds:.0f} s: {result.message} "
                             f"(log: {result.log})")
                else:
                    try:
                        b, cells = self.measure(v)
                    except Exception as exc:  # tunnel, bench or anything else: this variant is not measured
                        self.rows.append(report.variant_row(v.budget, v.topk_cap, status="failed",
                                                            error=f"bench failed: {exc}", config=v.name,
                                                            deploy_s=result.seconds, leaks=v.reproduce_state_leak,
                                                            reproduce_state_leak=v.reproduce_state_leak))
                        self.say(f"{label}: FAILED to measure: {exc}")
                    else:
                        row = self.row_from_gates(v, b, result.seconds, self.exactness_of(v, seen))
                        if self.batches:
                            row["by_batch"] = cells
                        self.rows.append(row)
                        self.say(f"{label}: {progress(row)}")
                if protect.received:
                    raise KeyboardInterrupt(protect.received)
        except KeyboardInterrupt as exc:
            interrupted = True
            self.say(f"sweep interrupted ({exc.args[0] if exc.args else 'SIGINT'}) after "
                     f"{len(self.rows)} of {len(self.variants)} variants; restoring {self.host}")
        except Exception as exc:  # a bug or a lost controller resource: still put the host back
            crashed = f"{type(exc).__name__}: {exc}"
            self.say(f"sweep stopped by an error ({crashed}); restoring {self.host}")
        restore = self.restore(before, protect)
        interrupted = interrupted or protect.received is not None
        protect.uninstall()
        shutil.rmtree(self.runner_dir, ignore_errors=True)
        results = report.build_results(
            config=self.base.name, host=self.host, started=started, finished=report_time(), variants=self.rows,
            cliff_drop=self.cliff_drop, tie_tolerance=self.tie_tolerance,
            restored=(", ".join(restore["configs"]) or None) if restore["ok"] else None,
            restore=restore, interrupted=interrupted, error=crashed, sweep_id=self.sweep_id,
            simulated=self.simulated,
            bench={"requests": self.requests, "concurrency": self.concurrency, "max_new_tokens": self.max_tokens,
                   "prompts_digest": bench.prompts_digest(bench.load_prompts())},
            batches=self.batches or None, batch_waves=BATCH_WAVES if self.batches else None)
        if results.get("budget_schedule"):
            results["budget_schedule"].update(self.schedule_config(results["budget_schedule"]))
        paths = report.write(results, self.report_dir)
        self.say(summary(results, paths))
        if not restore["ok"]:
            self.say(f"RESTORE FAILED on {self.host}: {restore['detail']}")
            return 1, results
        if interrupted:
            return 130, results
        if crashed or any(r["status"] != "ok" for r in self.rows) or any(
                c["status"] != "ok" for r in self.rows for c in r.get("by_batch") or []):
            return 1, results
        if results["best"] is None:
            return 3, results  # measured, but no variant qualifies (the recommendation says why)
        return 0, results


def restore_target(name: str, base: spec.Config) -> Path | None:
    for folder in (spec.CONFIG_DIR, base.source.parent):
        for suffix in (".yml", ".yaml"):
            p = folder / f"{name}{suffix}"
            if p.is_file():
                return p.resolve()
    return None


def report_time() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def progress(row: dict) -> str:
    verdicts = report.gate_verdicts(row)
    if row.get("gates"):
        gates = "; gates: " + ", ".join(f"{g} {verdicts[g] or '-'}" for g in report.GATE_NAMES)
    else:  # a row without the gates' verdicts knows its exactness verdict only
        gates = f", exactness {verdicts['exactness'] or '-'}" if row["status"] == "ok" else ""
    leak = "; LEAKS (no state forking above block_size - 1)" if report.leaks(row) else ""
    if row["status"] != "ok":
        return f"FAILED: {row['error']}{gates}{leak}{why_not_passed(row)}"
    return (f"accept {row['accept_length_mean']:.1f} (sd {row['accept_length_sd']:.1f}), "
            f"{row['tokens_per_s']:.1f} tok/s, step {row['step_time_ms']:.0f} ms, "
            f"{row['requests'] - row['failures']}/{row['requests']} requests{gates}{leak}{why_not_passed(row)}")


WHY_CHARS = 300  # of a gate's reason in the progress lines (results.json and results.md keep it whole)


def why_not_passed(row: dict) -> str:
    """One indented line per gate of the row that did not pass (fail or inconclusive) with its reason, so that a
    variant left out of the recommendation says why where the user reads it; empty when all passed."""
    gates: dict = row["gates"] if isinstance(row.get("gates"), dict) else {"exactness": row.get("exactness")}
    lines = []
    for name in report.GATE_NAMES:
        g = gates.get(name)
        if not isinstance(g, dict) or g.get("verdict") in (None, "pass") or not g.get("reason"):
            continue
        reason = " ".join(str(g["reason"]).split())
        if len(reason) > WHY_CHARS:
            reason = reason[:WHY_CHARS - 3] + "..."
        lines.append(f"\n      {name} {g['verdict']}: {reason}")
    return "".join(lines)


def progress_cell(cell: dict) -> str:
    if cell["status"] != "ok":
        return f"FAILED: {cell['error']}"
    done = cell["requests"] - cell["failures"]
    return (f"accept {cell['accept_length_mean']:.1f}, {cell['tokens_per_s']:.1f} tok/s, "
            f"step {cell['step_time_ms'] or 0:.0f} ms, {done}/{cell['requests']} requests")


def summary(results: dict, paths: dict[str, Path]) -> str:
    lines = []
    cliff = results["cliff"]
    lines.append(f"cliff: budget {cliff['budget']} cap {cliff['topk_cap']} (accept length -{cliff['drop_pct']:.1f}%)"
                 if cliff else "cliff: none")
    lines.append(f"recommendation: {results['recommendation']}")
    if results.get("simulated"):
        lines.append(f"note: {report.SIMULATED_NOTE}")
    if results["warning"]:
        lines.append(f"warning: {results['warning']}")
    if results.get("batches"):
        sched = results.get("budget_schedule")
        if sched is None:
            lines.append("budget schedule: none (no budget qualifies at any batch size measured)")
        else:
            where = paths.get("schedule_config")
            lines.append(f"budget schedule: {sched['flag']} (config: {where})"
                         + (f"; NOT ready: {'; '.join(sched['config_problems'])}" if sched["config_problems"] else ""))
    r = results["restore"]
    lines.append(f"host: {r['detail']}")
    lines.append(f"report: {paths['md']} ({paths['json'].name}, {paths['png'].name})")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Command line


def _fraction(text: str) -> float:
    try:
        return report.check_cliff_drop(float(text))
    except (ValueError, report.ReportError):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a fraction above 0 and below 1 (e.g. 0.25)") from None


def _tolerance(text: str) -> float:
    try:
        return report.check_tie_tolerance(float(text))
    except (ValueError, report.ReportError):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a fraction from 0 up to below 0.5 (e.g. 0.03)") from None


def build_parser() -> argparse.ArgumentParser:
    p = serving._Parser(prog="python -m sgdeploy.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a DDTREE config (name in configs/ or a path)")
    p.add_argument("--budgets", required=True, help='budgets, e.g. "8 15 16 32 64"')
    p.add_argument("--topk-caps", help='top-k caps, e.g. "4 8" (default: the config\'s cap)')
    p.add_argument("--inventory", required=True, type=Path, help="Ansible inventory (YAML or INI)")
    p.add_argument("--host", help=f"inventory host (default: the first of group {HOST_GROUP})")
    p.add_argument("--out", type=Path, default=Path("reports/sweeps"), help="report folder (default reports/sweeps)")
    p.add_argument("--cliff-drop", type=_fraction, default=report.DEFAULT_CLIFF_DROP,
                   help="accept-length drop from the best so far that marks the cliff (default 0.25)")
    p.add_argument("--tie-tolerance", type=_tolerance, default=report.DEFAULT_TIE_TOLERANCE,
                   help="tokens/s within this fraction of the fastest count as a tie, and the largest tied budget "
                        "below the cliff is recommended (default 0.03; 0: the fastest alone)")
    p.add_argument("--requests", type=serving._positive(int), help="bench requests (default: gates.bench_requests)")
    p.add_argument("--max-tokens", type=serving._positive(int),
                   help="tokens per bench request (default: gates.bench_max_tokens)")
    p.add_argument("--bench-timeout", type=serving._positive(float), default=600.0,
                   help="seconds for one variant's bench (default 600)")
    p.add_argument("--batches", help='batch sizes, e.g. "1 4 8 16": bench each variant with that many requests in '
                                     "flight and derive a budget schedule (default: none)")
    p.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                   help="passed to every ansible-playbook run (the variants' and the restore's), as its -e")
    p.add_argument("--json", action="store_true", help="print results.json on stdout (progress goes to stderr)")
    return p


def prepare(args: argparse.Namespace) -> Sweep:
    """Everything that can be checked before a host is touched. Raises UsageError."""
    budgets = parse_numbers(args.budgets, "budget", "--budgets")
    caps = parse_numbers(args.topk_caps, "top-k cap", "--topk-caps") if args.topk_caps is not None else None
    base = load_base(args.config)
    batches = parse_numbers(args.batches, "batch size", "--batches") if args.batches is not None else []
    if batches:
        check_batches(batches, caps, base, args.batches)
    inv = read_inventory(args.inventory)
    host, hostvars = pick_host(inv, args.inventory, args.host)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    sweep_id = f"{base.name}-{stamp}"
    n = 1
    while (args.out / sweep_id).exists() or (BUILD_DIR / sweep_id).exists():
        n += 1
        sweep_id = f"{base.name}-{stamp}-{n}"
    variants = plan_variants(base, budgets, caps, BUILD_DIR / sweep_id / "configs")
    g = base.gates
    return Sweep(base=base, variants=variants, inventory=args.inventory.resolve(), host=host, hostvars=hostvars,
                 sweep_id=sweep_id, report_dir=(args.out / sweep_id).resolve(), cliff_drop=args.cliff_drop,
                 tie_tolerance=args.tie_tolerance, requests=args.requests or g.bench_requests,
                 concurrency=g.bench_concurrency,
                 max_tokens=args.max_tokens or g.bench_max_tokens, bench_timeout=args.bench_timeout,
                 json_out=args.json, extra_vars=list(args.extra_vars), batches=sorted(batches))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        sweep = prepare(args)
    except UsageError as err:
        for line in err.problems:
            print(f"{parser.prog}: {line}", file=sys.stderr)
        return 2
    code, results = sweep.run()
    if args.json and results:
        print(json.dumps(results, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
