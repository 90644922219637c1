"""playbooks/build.yml against the lab: release directories, idempotence, pruning.

    LAB_NET=127.0.4 LAB_DIR=build/lab-h6 LAB_INVENTORY=build/lab-h6/inventory.yml \
        python -m pytest tests/lab/test_release.py
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from sgdeploy import patchset, spec, wheel

pytestmark = pytest.mark.lab

CONFIG = "ddtree-b15-nofork"  # uses ddtree only, but gets the one patched build (the whole series)
SAME_RELEASE = "ddtree-b15"  # forking and fused top-k on: the same release, other flags
ROOT = "/opt/sglang/releases"
STATE = "/var/lib/sglang-deploy"
FAKE = {  # label -> created; all older than anything the play installs
    "ddtree.aaaaaaaa": "2020-01-01T00:00:00Z",
    "ddtree.bbbbbbbb": "2020-01-02T00:00:00Z",
    "ddtree.cccccccc": "2020-01-03T00:00:00Z",
}


def recap(output: str) -> dict[str, dict[str, int]]:
    out = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, re.M):
        out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


@pytest.fixture(scope="module")
def expected() -> dict:
    features = spec.load(CONFIG).patch_features
    try:
        patches = patchset.select(features)
    except patchset.PatchSetError as exc:
        pytest.skip(f"{CONFIG} cannot be built yet: {exc}")
    pins = wheel.load_pins()
    pin = pins.for_python("3.11")
    local = Path("/tmp/whl") / pin.file
    if not (wheel.DEFAULT_DOWNLOADS / pin.file).is_file() and local.is_file():
        wheel.DEFAULT_DOWNLOADS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, wheel.DEFAULT_DOWNLOADS / pin.file)
    label = patchset.release_label(patches)
    return {
        "label": label,
        "version": f"0.5.23+{label}",
        "features": list(patchset.features_of(patches)),
        "patches": [p.name for p in patches],
        "wheel": wheel.DEFAULT_OUT / wheel.wheel_name(pins, pin, label),
    }


@pytest.fixture(scope="module")
def first_run(lab, expected):
    # Start from hosts without this release, so the run below installs it for real.
    for host in lab.hosts:
        lab.ssh(host, f"rm -rf {ROOT}/{expected['label']}")
    run = lab.ansible_playbook("playbooks/build.yml", extra_vars={"config": CONFIG})
    stats = recap(run.stdout)
    for host in lab.hosts:
        assert stats[host]["changed"] >= 1, (host, run.stdout[-3000:])
    return run


def test_every_host_has_the_release(lab, expected, first_run):
    label, version = expected["label"], expected["version"]
    sha = wheel.sha256_file(expected["wheel"])
    for host in lab.hosts:
        release = f"{ROOT}/{label}"
        # What the service user would see: a non-root user reads the installed version.
        probe = "import importlib.metadata as m; print(m.version('sglang'))"
        got = lab.ssh(host, f'runuser -u nobody -- {release}/venv/bin/python -c "{probe}"').stdout.strip()
        assert got == version, host
        doc = json.loads(lab.ssh(host, f"cat {release}/release.json").stdout)
        assert doc["label"] == label and doc["patches"] == expected["patches"]
        assert doc["features"] == expected["features"]
        assert doc["wheel"] == expected["wheel"].name and doc["wheel_sha256"] == sha
        assert doc["python"].startswith("3.11.") and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["created"])
        mode = lab.ssh(host, f"stat -c '%U %a' {ROOT} {release} {release}/venv").stdout.split("\n")
        assert [m.strip() for m in mode if m.strip()] == ["root 755"] * 3, host


def test_second_run_changes_nothing(lab, first_run):
    again = lab.ansible_playbook("playbooks/build.yml", extra_vars={"config": CONFIG})
    stats = recap(again.stdout)
    assert set(lab.hosts) <= set(stats), again.stdout[-2000:]
    for host in lab.hosts:
        assert stats[host]["changed"] == 0 and stats[host]["failed"] == 0, (host, again.stdout[-3000:])


def test_switching_forking_on_reuses_the_installed_release(lab, expected, first_run):
    """ddtree-b15 differs from ddtree-b15-nofork only in server flags: same label, nothing to install."""
    features = spec.load(SAME_RELEASE).patch_features
    assert features != spec.load(CONFIG).patch_features  # the configs do differ in what they use
    assert patchset.release_label(patchset.select(features)) == expected["label"]
    run = lab.ansible_playbook("playbooks/build.yml", extra_vars={"config": SAME_RELEASE})
    stats = recap(run.stdout)
    for host in lab.hosts:
        assert stats[host]["changed"] == 0 and stats[host]["failed"] == 0, (host, run.stdout[-3000:])
        assert lab.ssh(host, f"ls {ROOT}/{expected['label']}/release.json").returncode == 0


def test_prune_keeps_the_newest_and_every_current_or_previous(lab, expected, first_run):
    host = lab.hosts[0]
    setup = [f"mkdir -p {STATE}/lab-prune"]
    for label, created in FAKE.items():
        setup.append(f"mkdir -p {ROOT}/{label}/venv")
        setup.append(f"echo '{json.dumps({'label': label, 'created': created})}' > {ROOT}/{label}/release.json")
    setup.append(f"echo '{json.dumps({'release': 'ddtree.aaaaaaaa'})}' > {STATE}/lab-prune/current.json")
    setup.append(f"echo '{json.dumps({'release': 'ddtree.bbbbbbbb'})}' > {STATE}/lab-prune/previous.json")
    lab.ssh(host, " && ".join(setup))
    try:
        keep_one = {"config": CONFIG, "sglang_releases_keep": 1}
        check = lab.ansible_playbook("playbooks/build.yml", "--check", "--limit", host, extra_vars=keep_one)
        assert recap(check.stdout)[host]["changed"] == 1, check.stdout[-3000:]
        listing = lab.ssh(host, f"ls {ROOT}").stdout.split()
        assert "ddtree.cccccccc" in listing, "check mode removed a release"

        # Releases that configs deployed by other tests run now or ran before stay as well.
        in_use = set()
        for line in lab.ssh(host, f"cat {STATE}/*/current.json {STATE}/*/previous.json 2>/dev/null || true"
                            ).stdout.replace("}{", "}\n{").splitlines():
            in_use |= set(re.findall(r'"release": "([^"]+)"', line))
        lab.ansible_playbook("playbooks/build.yml", "--limit", host, extra_vars=keep_one)
        listing = sorted(lab.ssh(host, f"ls {ROOT}").stdout.split())
        # Newest (the one just installed), current (oldest of all) and previous stay; the rest go.
        assert listing == sorted({expected["label"], "ddtree.aaaaaaaa", "ddtree.bbbbbbbb"} | in_use)
        assert "ddtree.cccccccc" not in listing
    finally:
        lab.ssh(host, f"rm -rf {STATE}/lab-prune " + " ".join(f"{ROOT}/{label}" for label in FAKE))
