"""sgdeploy: the logic Ansible should not hold (configs, rendering, builds, gates, sweeps, reports)."""

# The host-side code (gates, bench, exactness, records, model folders) lives in the sgdeploy.host
# collection's module_utils; this puts the collection on sys.path for the controller's commands.
from sgdeploy import host_code  # noqa: E402,F401
