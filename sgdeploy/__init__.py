"""sgdeploy: the logic Ansible should not hold (configs, rendering, builds, gates, sweeps, reports)."""
