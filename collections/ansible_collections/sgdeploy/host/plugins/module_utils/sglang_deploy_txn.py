# Copyright: sgdeploy contributors. Apache-2.0
"""The switch as a transaction on the host: a journal written (atomically, fsync'd) before each step.

Layout under the state folder S (one switch at a time per host: the deploy lock says whose):

    S/txn/journal.json      run id, config, new unit, step, and per touched unit: whether its unit
                            and env file existed, whether it was active / enabled, its current.json
    S/txn/files/            copies of those unit and env files, taken before anything changed
    S/<config>/current.json what runs now (written only by a commit or after an undo)
    S/<config>/previous.json what ran before it, with its unit text, its env file's non-secret part
                            (`env_public`) and the names of its secrets, never their values: `make
                            rollback` renders the env file again with the inventory's secrets

Steps: begun (backups taken, nothing changed), stopping (the replaced units may be stopped),
installed (new files in place), started, gating. `undo` works from any step and is idempotent:
it puts the old files back, restarts the old units FIRST and writes the state after, so a full
disk under S still leaves the old service serving. A journal left by a run that is gone (the
lock says so) is undone by the next deploy or rollback before it does anything else.
"""

from __future__ import annotations

import os
import shutil
import time

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import (
    copy_file,
    read_json,
    sha256_file,
    write_bytes,
    write_json,
)

STEPS = ("begun", "stopping", "installed", "started", "gating")


class TxnError(Exception):
    """The switch state is not what the caller expects: one line saying what was found."""


class Paths:
    def __init__(self, state_dir, unit_dir="/etc/systemd/system", env_dir="/etc/sglang"):
        self.state_dir, self.unit_dir, self.env_dir = state_dir, unit_dir, env_dir
        self.txn = os.path.join(state_dir, "txn")
        self.journal = os.path.join(self.txn, "journal.json")
        self.files = os.path.join(self.txn, "files")

    def current(self, config):
        return os.path.join(self.state_dir, config, "current.json")

    def previous(self, config):
        return os.path.join(self.state_dir, config, "previous.json")

    def unit(self, unit):
        return os.path.join(self.unit_dir, unit)

    def env(self, config):
        return units.env_file(self.env_dir, config)


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def pending(paths):
    """The journal of a switch in progress (or left behind), or None. A txn folder without a
    journal is a begin that died before anything changed: reported as {"step": None}."""
    journal = read_json(paths.journal)
    if journal is None and os.path.isdir(paths.txn):
        return {"run_id": None, "step": None, "config": None, "new_unit": None, "units": []}
    return journal


def describe(journal):
    if journal.get("step") is None:
        return "an unfinished switch folder with no journal (its run died before changing anything)"
    return (f"an interrupted switch to {journal['config']} (run {journal['run_id']}, step {journal['step']} "
            f"since {journal.get('step_at', '?')})")


def begin(paths, run_id, deploy, stop_units, disable_units=()):
    """Back up every unit the switch touches, then write the journal (step `begun`)."""
    if pending(paths) is not None:
        raise TxnError(f"found {describe(pending(paths))} in {paths.txn}; undo it first")
    os.makedirs(paths.files)
    new_unit = deploy["unit_name"]
    entries = []
    for unit in sorted(set(stop_units) | set(disable_units) | {new_unit}):
        config = units.config_of(unit)
        entry = {"unit": unit, "config": config, "existed": os.path.exists(paths.unit(unit)),
                 "env_existed": os.path.exists(paths.env(config)), "active": units.is_active(unit),
                 "enabled": units.is_enabled(unit), "replaced": unit in stop_units,
                 "current": read_json(paths.current(config))}
        if entry["existed"]:
            copy_file(paths.unit(unit), os.path.join(paths.files, unit))
        if entry["env_existed"]:
            copy_file(paths.env(config), os.path.join(paths.files, config + ".env"))
        entries.append(entry)
    journal = {"run_id": run_id, "config": deploy["config"], "new_unit": new_unit, "deploy": deploy,
               "units": entries, "step": "begun", "step_at": now_iso(), "began": now_iso()}
    write_json(paths.journal, journal, mode=0o600)
    return journal


def set_step(paths, run_id, step, **extra):
    journal = read_json(paths.journal)
    if journal is None or journal["run_id"] != run_id:
        raise TxnError(f"no switch of run {run_id} in progress in {paths.txn}")
    if step not in STEPS:
        raise TxnError("step {!r} is not one of {}".format(step, ", ".join(STEPS)))
    journal.update(extra, step=step, step_at=now_iso())
    journal[step + "_epoch"] = time.time()
    write_json(paths.journal, journal, mode=0o600)
    return journal


def rank_above_0(entry):
    """Whether a journal entry's unit is a rank above 0 of an engine over several hosts (its current.json)."""
    current = entry.get("current") or {}
    try:
        return int(current.get("nnodes") or 1) > 1 and int(current.get("node_rank") or 0) > 0
    except (TypeError, ValueError):
        return False


def stop(paths, run_id, ranks="all", kill_after_s=30, sleep=time.sleep, clock=time.monotonic):
    """Stop the replaced units (step `stopping`), without waiting; returns (journal, stopped units, killed units).

    ranks `all`: every replaced unit, and the idle conflicting units are disabled. `first`: the same but the ranks
    above 0 of an engine over several hosts. `above0`: only those, once their rank 0 has stopped: SGLang 0.5.23
    ignores SIGTERM on such a rank (rank 0's ShutdownReq ends it), so what still runs kill_after_s later is killed
    with SIGKILL (no request needs it with its rank 0 stopped).
    """
    journal = set_step(paths, run_id, "stopping")
    stopping = []
    for e in journal["units"]:
        if e["replaced"]:
            if ranks == "all" or (ranks == "above0") == rank_above_0(e):
                units.systemctl("stop", "--no-block", e["unit"])
                stopping.append(e["unit"])
        elif ranks != "above0" and e["unit"] != journal["new_unit"] and e["enabled"]:
            units.systemctl("disable", e["unit"])
    killed = []
    if ranks == "above0" and stopping:
        deadline = clock() + kill_after_s
        while clock() < deadline and any(units.active_state(u) in units.RUNNING_STATES for u in stopping):
            sleep(0.5)
        for unit in stopping:
            if units.active_state(unit) in units.RUNNING_STATES:
                units.systemctl("kill", "--signal=SIGKILL", unit)
                killed.append(unit)
    return journal, stopping, killed


def install(paths, run_id, unit_text, env_text, env_group_gid):
    """Put the new unit and env file in place (step `installed` is journaled first)."""
    journal = set_step(paths, run_id, "installed")
    config = journal["config"]
    os.makedirs(paths.env_dir, exist_ok=True)
    write_bytes(paths.env(config), env_text.encode(), mode=0o640, owner=(0, env_group_gid))
    write_bytes(paths.unit(journal["new_unit"]), unit_text.encode(), mode=0o644, owner=(0, 0))
    units.systemctl("daemon-reload")
    return journal


def start(paths, run_id):
    """reset-failed, start the new unit (not enabled: only a commit enables it, so a reboot in the
    middle boots the old service), and journal the restart baseline (NRestarts after this start)."""
    journal = read_json(paths.journal)
    unit = journal["new_unit"]
    units.systemctl("reset-failed", unit)
    proc = units.systemctl("start", unit)
    if proc.returncode != 0:
        raise TxnError(f"systemctl start {unit} failed: {(proc.stderr or proc.stdout).strip()}")
    return set_step(paths, run_id, "started", nrestarts_baseline=units.n_restarts(unit))


def _restore_file(backup, dest, existed, notes):
    try:
        if existed:
            copy_file(backup, dest)
        elif os.path.exists(dest):
            os.unlink(dest)
    except OSError as err:
        notes.append(f"could not restore {dest}: {err.strerror or err}")


def undo(paths, notes=None):
    """Roll the switch in the journal back to what ran before it; see the module docstring.

    Returns {"found", "restarted": [{"unit", "current"}], "notes"}; raises TxnError when there is
    no journal to undo.
    """
    notes = [] if notes is None else notes
    journal = pending(paths)
    if journal is None:
        raise TxnError(f"no switch to undo in {paths.txn}")
    found = describe(journal)
    if journal["step"] is None:
        shutil.rmtree(paths.txn, ignore_errors=True)
        return {"found": found, "restarted": [], "notes": notes, "step": None}
    new_unit, step = journal["new_unit"], journal["step"]
    was_running = {e["unit"] for e in journal["units"] if e["active"]}
    if new_unit not in was_running:
        units.systemctl("stop", new_unit)
    for e in journal["units"]:
        _restore_file(os.path.join(paths.files, e["unit"]), paths.unit(e["unit"]), e["existed"], notes)
        _restore_file(os.path.join(paths.files, e["config"] + ".env"), paths.env(e["config"]),
                      e["env_existed"], notes)
    units.systemctl("daemon-reload")
    restarted = []
    for e in journal["units"]:
        units.systemctl("enable" if e["enabled"] and e["existed"] else "disable", e["unit"])
        if e["active"]:
            units.systemctl("reset-failed", e["unit"])
            # The new unit of a same-name redeploy ran the new text: restart it. Any other old unit
            # is started (a no-op when it never stopped: a stop timeout is not turned into a restart).
            verb = "restart" if e["unit"] == new_unit and step in ("installed", "started", "gating") else "start"
            proc = units.systemctl(verb, e["unit"])
            if proc.returncode != 0:
                notes.append("systemctl {} {} failed: {}".format(verb, e["unit"], (proc.stderr or "").strip()))
            restarted.append({"unit": e["unit"], "current": e["current"], "since": time.time(),
                              "nrestarts_baseline": units.n_restarts(e["unit"])})
    # State last: the old service already serves when a full disk makes these writes fail.
    for e in journal["units"]:
        try:
            if e["current"] is not None:
                write_json(paths.current(e["config"]), e["current"])
            elif e["unit"] == new_unit and os.path.exists(paths.current(e["config"])):
                os.unlink(paths.current(e["config"]))
        except OSError as err:
            notes.append("could not write {}: {}".format(paths.current(e["config"]), err.strerror or err))
    shutil.rmtree(paths.txn, ignore_errors=True)
    return {"found": found, "restarted": restarted, "notes": notes, "step": step,
            "run_id": journal["run_id"], "config": journal["config"]}


def _sha256(path):
    return sha256_file(path)


def _current_of(deploy, paths):
    current = {k: deploy[k] for k in ("config", "unit_name", "release", "bind_address", "ports", "gpus",
                                      "speculative")}
    current["unit_digest"] = deploy["digest"]
    for key, value in (("env_file", deploy.get("env_name")), ("service_user", deploy.get("service_user")),
                       ("release_dir", deploy.get("release_dir")),
                       ("gates", deploy.get("gates")),  # the gates settings: make rollback's smoke gate
                       # The env file's non-secret part and the secrets' names: a rollback renders it again.
                       ("env_public", deploy.get("env_public")), ("secret_keys", deploy.get("secret_keys")),
                       # An engine over several hosts (docs/multinode.md): a rank above 0 serves no HTTP.
                       ("nnodes", deploy.get("nnodes")), ("node_rank", deploy.get("node_rank")),
                       ("engine_hosts", deploy.get("engine_hosts"))):
        if value is not None and value != "":
            current[key] = value
    # Digests of the files as installed: the next plan finds a hand edit (drift) by them.
    for key, path in (("unit_sha256", paths.unit(deploy["unit_name"])), ("env_sha256", paths.env(deploy["config"]))):
        if os.path.exists(path):
            current[key] = _sha256(path)
    current["deployed"] = now_iso()
    return current


def public_env(text, secret_keys):
    """An env file's text without the assignments of ``secret_keys`` (a state file written before
    ``env_public`` was kept)."""
    secret = set(secret_keys or ())
    lines = [line for line in (text or "").splitlines()
             if "=" not in line or line.strip().startswith("#") or line.split("=", 1)[0].strip() not in secret]
    return "\n".join(lines)


def without_secrets(state, secret_keys):
    """A current/previous record as it may be kept: the env text of an older commit (with the secrets)
    turned into its non-secret part."""
    state = dict(state)
    if "env_text" in state:
        text = state.pop("env_text")
        state.setdefault("env_public", public_env(text, set(secret_keys or ()) | set(state.get("secret_keys") or ())))
    return state


def commit(paths, run_id, swap_previous=False):
    """The new service passed: write current.json and previous.json (with the replaced unit's text and
    its env file's non-secret part; no secret value), enable the new unit, disable the units it
    replaced, drop the journal."""
    journal = read_json(paths.journal)
    if journal is None or journal["run_id"] != run_id:
        raise TxnError(f"no switch of run {run_id} to commit in {paths.txn}")
    deploy, new_unit, config = journal["deploy"], journal["new_unit"], journal["config"]
    secret_keys = deploy.get("secret_keys") or []
    before = [e for e in journal["units"] if e["replaced"] and e["current"]]
    same = next((e for e in before if e["unit"] == new_unit), None)
    prev_entry = same or (before[0] if before else None)
    current = _current_of(deploy, paths)
    previous = None
    if prev_entry is not None and prev_entry["current"].get("unit_digest") != current["unit_digest"]:
        previous = without_secrets(prev_entry["current"], secret_keys)
        backup = os.path.join(paths.files, prev_entry["unit"])
        env_backup = os.path.join(paths.files, prev_entry["config"] + ".env")
        with open(backup, encoding="utf-8") as f:
            previous["unit_text"] = f.read()
        if os.path.exists(env_backup):
            previous["env_sha256"] = _sha256(env_backup)
            if "env_public" not in previous:  # committed before env_public was kept
                with open(env_backup, encoding="utf-8") as f:
                    previous["env_public"] = public_env(f.read(), secret_keys)
    write_json(paths.current(config), current)
    if previous is not None:
        write_json(paths.previous(config), previous, mode=0o600)
    elif swap_previous and os.path.exists(paths.previous(config)):
        os.unlink(paths.previous(config))
    else:
        # A previous.json of an older commit kept the env file's text, secrets included: drop them.
        kept = read_json(paths.previous(config))
        if kept is not None and "env_text" in kept:
            write_json(paths.previous(config), without_secrets(kept, secret_keys), mode=0o600)
    units.systemctl("enable", new_unit)
    for e in journal["units"]:
        if e["unit"] != new_unit and (e["replaced"] or e["enabled"]):
            units.systemctl("disable", e["unit"])
            if e["current"] and e["config"] != config and os.path.exists(paths.current(e["config"])):
                os.unlink(paths.current(e["config"]))
    shutil.rmtree(paths.txn, ignore_errors=True)
    return {"current": {k: v for k, v in current.items() if k != "env_public"},
            "previous": {k: v for k, v in (previous or {}).items() if not k.endswith("_text") and k != "env_public"}}


def retire(paths, run_id):
    """A manual rollback on a rank above 0 of an engine over several hosts whose config had no previous deploy on this
    host (the engine grew from fewer hosts; docs/multinode.md): its stopped unit is disabled and removed with its env
    file, and what ran becomes previous.json (its unit text and the env file's non-secret part: a later rollback brings
    it back); current.json goes. Journaled like a switch: an undo before this step puts the unit back and starts it."""
    journal = read_json(paths.journal)
    if journal is None or journal["run_id"] != run_id:
        raise TxnError(f"no switch of run {run_id} to commit in {paths.txn}")
    unit, config = journal["new_unit"], journal["config"]
    entry = next((e for e in journal["units"] if e["unit"] == unit), None)
    if entry is None or not entry["current"]:
        raise TxnError(f"config {config}: nothing of it runs here to retire")
    previous = without_secrets(entry["current"], entry["current"].get("secret_keys"))
    backup = os.path.join(paths.files, unit)
    if os.path.exists(backup):
        with open(backup, encoding="utf-8") as f:
            previous["unit_text"] = f.read()
    env_backup = os.path.join(paths.files, config + ".env")
    if os.path.exists(env_backup):
        previous["env_sha256"] = _sha256(env_backup)
        if "env_public" not in previous:
            with open(env_backup, encoding="utf-8") as f:
                previous["env_public"] = public_env(f.read(), previous.get("secret_keys"))
    write_json(paths.previous(config), previous, mode=0o600)
    units.systemctl("disable", unit)
    for path in (paths.unit(unit), paths.env(config), paths.current(config)):
        if os.path.exists(path):
            os.unlink(path)
    units.systemctl("daemon-reload")
    units.systemctl("reset-failed", unit)
    shutil.rmtree(paths.txn, ignore_errors=True)
    return {"current": {}, "previous": {k: v for k, v in previous.items()
                                        if not k.endswith("_text") and k != "env_public"}}


def remove_stale_runs(state_dir, run_id):
    """Remove the staging folders (``runs/<id>/``, an env file with its secrets among them) of runs
    other than ``run_id``: the caller holds the lock, so their runs are gone. Returns their ids."""
    runs = os.path.join(state_dir, "runs")
    removed = []
    for name in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        if name != run_id:
            shutil.rmtree(os.path.join(runs, name), ignore_errors=True)
            removed.append(name)
    return removed
