"""Stand-in for the get-pip.py that ansible-test downloads from ci-files.testing.ansible.com.

`make lint` runs `ansible-test sanity`, which bootstraps pip in each of its virtualenvs with that script; the
machines this project is built and tested on reach the Python package index but not that host. This does what
get-pip.py does with the arguments ansible-test gives it (pip's own install options and `pip==X`): put pip into
the running interpreter with ensurepip, then `pip install` those arguments from the configured index.
The Makefile copies it to where ansible-test caches the downloaded script."""

from __future__ import annotations

import ensurepip
import os
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}  # get-pip.py's own flags; pip install does not know them

if __name__ == "__main__":
    saved = dict(os.environ)
    ensurepip.bootstrap(upgrade=True)  # sets PIP_CONFIG_FILE=/dev/null in os.environ: the pip.conf would be lost
    os.environ.clear()
    os.environ.update(saved)
    args = [a for a in sys.argv[1:] if a not in GET_PIP_ONLY]
    sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
