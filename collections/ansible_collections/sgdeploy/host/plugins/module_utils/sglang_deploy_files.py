# Copyright: sgdeploy contributors. Apache-2.0
"""Files of the deploy state on a host: JSON written crash-safely (write, fsync, rename, fsync the folder).

Standard library only: shipped to the host by Ansible with every module that imports it, and
imported directly by the unit tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile


def sha256_file(path):
    """The sha256 of a file's bytes (hex), read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path):
    """The JSON object in ``path``, or None when the file is missing or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path, data, mode=0o644, owner=None):
    """Replace ``path`` with ``data`` atomically: a temporary file in the same folder, fsync, rename.

    On any error (ENOSPC included) the old file is left as it was and the temporary file removed.
    ``owner`` is (uid, gid) or None.
    """
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if owner is not None:
            os.chown(tmp, owner[0], owner[1])
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(folder)


def write_json(path, data, mode=0o644):
    write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def copy_file(src, dest):
    """Copy ``src`` to ``dest`` atomically, keeping the mode and owner of ``src``."""
    st = os.stat(src)
    with open(src, "rb") as f:
        data = f.read()
    write_bytes(dest, data, mode=st.st_mode & 0o7777, owner=(st.st_uid, st.st_gid))
