# Copyright: sgdeploy contributors. Apache-2.0
"""The host's deploy lock: owned by one run (run id, controller, start time) and held by a lease.

The run renews the lease at every step (`renew`); a lock whose lease has expired belongs to a run
that is provably gone (it stopped renewing), and the next run takes it over with a message. Every
read-modify-write of the lock happens under flock on a guard file, so two runs never both win.
The lock lives in /run: a reboot clears it (the run that held it died with the controller's SSH
sessions), while the switch journal (sglang_deploy_txn) survives under the state folder.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json, write_json

LOCK = "/run/sglang-deploy.lock"


class LockError(Exception):
    """The lock is held by another live run, or is not ours: one line for people."""


@contextmanager
def _guard(lock):
    os.makedirs(os.path.dirname(lock) or ".", exist_ok=True)
    fd = os.open(lock + ".guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def describe(held, now=None):
    now = time.time() if now is None else now
    left = float(held.get("expires", 0)) - now
    lease = f"expires in {int(left)} s" if left > 0 else f"expired {int(-left)} s ago"
    return (f"run {held.get('run_id', '?')} from {held.get('controller', '?')} ({held.get('operation', 'deploy')}), "
            f"started {held.get('started_iso', '?')}, step {held.get('step', '?')!r}, lease {lease}")


def read(lock=LOCK):
    return read_json(lock)


def acquire(run_id, controller, operation, lease_s, lock=LOCK, now=None, take_over=None, controller_pid=None):
    """Take the lock for ``run_id``. Returns {"lock": ..., "recovered": message or ""}.

    Raises LockError when another run holds it with a live lease. ``take_over`` is the run id of a
    holder the controller proved gone (its ansible-playbook process no longer exists).
    """
    now = time.time() if now is None else now
    with _guard(lock):
        held = read_json(lock)
        recovered = ""
        if held and held.get("run_id") != run_id:
            expired = float(held.get("expires", 0)) <= now
            if not expired and held.get("run_id") != take_over:
                raise LockError(f"another {held.get('operation', 'deploy')} holds the lock {lock} on this host: "
                                f"{describe(held, now)}; wait for it to finish")
            recovered = ("took over the deploy lock of {}: {}".format(
                describe(held, now), "its lease expired (the run stopped renewing it)" if expired
                else "its controller process is gone"))
        if held and held.get("run_id") == run_id:
            payload = dict(held, expires=now + lease_s, renewed=now)
        else:
            payload = {"run_id": run_id, "controller": controller, "controller_pid": controller_pid,
                       "operation": operation,
                       "started": now, "started_iso": _iso(now), "expires": now + lease_s,
                       "renewed": now, "step": "locked"}
        write_json(lock, payload, mode=0o644)
        return {"lock": payload, "recovered": recovered}


def renew(run_id, lease_s, step=None, lock=LOCK, now=None):
    """Extend the lease of our lock (and say which step the run is in). LockError if not ours."""
    now = time.time() if now is None else now
    with _guard(lock):
        held = read_json(lock)
        if not held or held.get("run_id") != run_id:
            holder = describe(held, now) if held else "no lock"
            raise LockError(f"the deploy lock {lock} is no longer held by run {run_id} ({holder}); stopping here")
        held["expires"] = now + lease_s
        held["renewed"] = now
        if step:
            held["step"] = step
        write_json(lock, held, mode=0o644)
        return held


def release(run_id, lock=LOCK):
    """Remove the lock if ``run_id`` holds it. Returns True when it was removed."""
    with _guard(lock):
        held = read_json(lock)
        if held and held.get("run_id") == run_id:
            os.unlink(lock)
            return True
        return False
