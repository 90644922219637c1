"""sgdeploy: the logic Ansible should not hold (configs, rendering, builds, gates, sweeps, reports)."""

from importlib import metadata as _metadata

# The host-side code (gates, bench, exactness, records, model folders, the HTTP/health helper) lives in
# the sgdeploy.host collection's module_utils; the package ships it as the importable package
# ansible_collections.sgdeploy.host.plugins.module_utils (pyproject.toml), no path hook.

try:  # the installed package's version (pyproject.toml); `sgdeploy --version` prints it
    __version__ = _metadata.version("sgdeploy")
except _metadata.PackageNotFoundError:  # run from a checkout that `make setup` has not installed
    __version__ = "0+unknown"
