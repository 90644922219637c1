"""sgdeploy: the logic Ansible should not hold (configs, rendering, builds, gates, sweeps, reports)."""

from importlib import metadata as _metadata

# The host-side code (gates, bench, exactness, records, model folders) lives in the sgdeploy.host
# collection's module_utils; this puts the collection on sys.path for the controller's commands.
from sgdeploy import host_code  # noqa: E402,F401

try:  # the installed package's version (pyproject.toml); `sgdeploy --version` prints it
    __version__ = _metadata.version("sgdeploy")
except _metadata.PackageNotFoundError:  # run from a checkout that `make setup` has not installed
    __version__ = "0+unknown"
