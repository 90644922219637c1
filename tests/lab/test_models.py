"""Model and drafter weights on the host before the switch (issues 11, 19, 20), end to end in the lab.

Real ansible-playbook over SSH into the lab host, the real sgdeploy.host.sglang_model_* modules on
the host talking HTTP to the hub stand-in (tests/lab/hub_standin.py) that this test process serves on
127.0.0.1 (the lab hosts share this machine's network namespace), real systemd running the rendered
unit with the simulated engine, which reads `<model-path>/config.json` to decide whether the model
is hybrid. Order matters: later tests check that a failed models step leaves the service of an
earlier one running.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible_output import task_statuses

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIGS = HERE / "configs"
FIXTURES = REPO / "build" / "lab-fixtures" / "models"
MODELS = "/var/lib/sglang/models"
ALT_MODELS = "/srv/lab-models-alt/weights"  # a non-default sglang_models_root
TOKEN = "hf_lab_standin_token"
TARGET_COMMIT = "5e1f00000000000000000000000000000000aa01"
DRAFT_COMMIT = "5e1f00000000000000000000000000000000bb01"
HOST = "lab1"
TIMINGS: dict[str, float] = {}

sys.path.insert(0, str(HERE))
import hub_standin  # noqa: E402


@pytest.fixture(scope="module")
def hub():
    with hub_standin.HubStandin("127.0.0.1", 0, token=TOKEN) as h:
        # A target big enough (4 MB of weights) to cut midway, and a drafter.
        h.add_repo("lab-org/Tiny-Qwen3.6", hub_standin.tiny_model_files(weight_floats=1 << 20),
                   commit=TARGET_COMMIT, branches=("main",))
        h.add_repo("lab-org/Tiny-Qwen3.6-DFlash", hub_standin.tiny_model_files(hybrid=False, extras=False),
                   commit=DRAFT_COMMIT, branches=("main",))
        h.add_repo("lab-org/Huge-Model", hub_standin.tiny_model_files(extras=False), branches=("main",),
                   fake_sizes={"model.safetensors": 10**16})
        yield h


@pytest.fixture(scope="module")
def fixtures(lab):
    """The controller's tiny target folder, and the drafter folder already on the host (shared storage)."""
    shutil.rmtree(FIXTURES, ignore_errors=True)
    hub_standin.write_model(FIXTURES / "tiny-qwen3.6", hub_standin.tiny_model_files(extras=False))
    files = hub_standin.tiny_model_files(hybrid=False, weight_floats=1024, extras=False)
    payload = json.dumps({n: base64.b64encode(v).decode() for n, v in files.items()})
    script = ("import json, pathlib, base64, sys; d = pathlib.Path('/srv/lab-models/tiny-dflash'); "
              "d.mkdir(parents=True); "
              "[(d / n).write_bytes(base64.b64decode(v)) for n, v in json.load(sys.stdin).items()]")
    lab.ssh(HOST, f'rm -rf /srv/lab-models && python3 -c "{script}"', input=payload)
    return FIXTURES


def vault_args(folder: Path, secret_vars: dict) -> list[str]:
    """ansible-playbook arguments that pass `secret_vars` the way a user would: an Ansible Vault file.

    The values are never in an argv, an environment or a plain file on the controller (issue 19).
    """
    from ansible.parsing.vault import VaultLib, VaultSecret

    folder.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(16)
    pw_file = folder / "vault-password"
    pw_file.write_text(password)
    pw_file.chmod(0o600)
    vault = VaultLib([("default", VaultSecret(password.encode()))])
    vars_file = folder / "secrets.yml"
    vars_file.write_bytes(vault.encrypt(json.dumps(secret_vars)))
    return ["-e", f"@{vars_file}", "--vault-password-file", str(pw_file)]


SECRETS = Path(os.environ.get("TMPDIR", "/tmp")) / f"sgdeploy-lab-models-{os.getpid()}"


def deploy(lab, config: str, hub=None, *args: str, token: str = TOKEN, **extra) -> tuple[object, float]:
    extra_vars = {"config": str(CONFIGS / f"{config}.yml")}
    if hub is not None:
        extra_vars.update(sglang_models_hf_endpoint=hub.url)
        args = (*args, *vault_args(SECRETS / secrets.token_hex(4), {"sglang_models_hf_token": token}))
    extra_vars.update(extra)
    start = time.monotonic()
    proc = lab.ansible_playbook("playbooks/deploy.yml", "--limit", HOST, *args, extra_vars=extra_vars, check=False,
                                timeout=600)
    TIMINGS[config + f"#{len(TIMINGS)}"] = round(time.monotonic() - start, 1)
    return proc, time.monotonic() - start


def role_models(tmp_path, config: str, root: str | None = None) -> list[dict]:
    """The deploy description's models of `config`; with `root`, as rendered for that models root."""
    render = subprocess.run([sys.executable, "-m", "sgdeploy", "render", str(CONFIGS / f"{config}.yml"),
                             "--release", "x", "--no-verify", "--json", "--out", str(tmp_path / "render")],
                            capture_output=True, text=True, cwd=REPO, check=True)
    items = json.loads(render.stdout)["models"]
    if root:
        for m in items:
            if m["source"] in ("hf", "controller"):
                assert m["local_dir"].startswith(MODELS + "/")
                m["local_dir"] = root + m["local_dir"][len(MODELS):]
    return items


def run_role(lab, tmp_path, config: str, *args: str, models: list[dict] | None = None, token: str | None = None,
             play_vars: dict | None = None, **role_vars):
    """Only the sglang_models role, for the models of `config` (as the deploy would pass them)."""
    items = models if models is not None else role_models(tmp_path, config)
    play = [{"name": "models only", "hosts": HOST, "gather_facts": False, "vars": play_vars or {},
             "roles": [{"role": "sgdeploy.host.sglang_models", "sglang_models_list": items, **role_vars}]}]
    playbook = tmp_path / "models-only.yml"
    playbook.write_text(json.dumps(play))
    if token:
        args = (*args, *vault_args(tmp_path / "secrets", {"sglang_models_hf_token": token}))
    return lab.ansible_playbook(playbook, *args, check=False, timeout=300)


def out(proc) -> str:
    return proc.stdout + proc.stderr


def models_task_results(output: str) -> dict[str, list[str]]:
    """For each task of the sglang_models role that ran: its result words (ok, changed, skipping)."""
    results = task_statuses(output, role="sglang_models")
    assert results, f"no sglang_models task in the output:\n{output[-3000:]}"
    return results


def exec_argv(lab, unit: str) -> list[str]:
    text = lab.ssh(HOST, f"cat /etc/systemd/system/{unit}").stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def main_pid(lab, unit: str) -> str:
    return lab.ssh(HOST, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def server_info(lab) -> dict:
    return json.loads(lab.ssh(HOST, f"curl -sf http://{lab.address(HOST)}:30000/get_server_info").stdout)


def generate(lab) -> dict:
    body = json.dumps({"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    return json.loads(lab.ssh(HOST, f"curl -sf -X POST http://{lab.address(HOST)}:30000/generate "
                                    f"-H 'Content-Type: application/json' -d '{body}'").stdout)


def host_path_exists(lab, path: str) -> bool:
    return lab.ssh(HOST, f"test -e {path}", check=False).returncode == 0


def test_controller_copy_and_host_path_deploy_end_to_end(lab, fixtures):
    from sgdeploy import models

    sha = models.folder_digest(fixtures / "tiny-qwen3.6")[0]
    target = f"{MODELS}/tiny-qwen3.6/{sha[:16]}"
    proc, _ = deploy(lab, "lab-models-local")
    assert proc.returncode == 0, out(proc)[-4000:]
    unit = "sglang-lab-models-local.service"
    argv = exec_argv(lab, unit)
    assert flag(argv, "--model-path") == target
    assert flag(argv, "--speculative-draft-model-path") == "/srv/lab-models/tiny-dflash"
    assert "--revision" not in argv
    # The simulator loaded the copied folder's config.json and saw the hybrid layout in it.
    sim = server_info(lab)["simulator"]
    assert sim["hybrid_model"] is True and sim["hybrid_source"] == f"{target}/config.json"
    assert generate(lab)["meta_info"]["spec_verify_ct"] > 0
    # The copy is complete, verified, owned by the service user; nothing half-done is left.
    marker = json.loads(lab.ssh(HOST, f"cat {target}/{models.MARKER}").stdout)
    assert marker["sha"] == sha and {f["name"] for f in marker["files"]} >= {"config.json", "model.safetensors"}
    assert lab.ssh(HOST, f"stat -c %U {target} {target}/model.safetensors").stdout.split() == ["sglang", "sglang"]
    assert not host_path_exists(lab, f"{target}.incomplete")
    # The service can never download at start.
    env = lab.ssh(HOST, f"systemctl show -p Environment {unit}").stdout
    assert "HF_HUB_OFFLINE=1" in env and "HF_HOME=/var/lib/sglang/hf" in env


def test_missing_host_path_fails_naming_the_path(lab, fixtures, tmp_path):
    proc = run_role(lab, tmp_path, "lab-models-missing-path")
    text = out(proc)
    assert proc.returncode != 0
    assert "MODELS NOT READY on lab1: drafter path /srv/lab-models/not-there: no such folder on this host" in text, \
        text[-3000:]


def test_hub_download_resumes_then_a_second_run_transfers_nothing(lab, fixtures, hub):
    before = main_pid(lab, "sglang-lab-models-local.service")
    target = f"{MODELS}/lab-org--Tiny-Qwen3.6/{TARGET_COMMIT}"
    weights = len(hub_standin.tiny_model_files(weight_floats=1 << 20)["model.safetensors"])
    cut = weights // 2
    # Start from nothing on the host (an earlier run of this file leaves the folders; the service
    # now running, lab-models-local, does not use them).
    lab.ssh(HOST, f"rm -rf {MODELS}/lab-org--Tiny-Qwen3.6 {MODELS}/lab-org--Tiny-Qwen3.6-DFlash")
    # 1. The hub breaks the weights' transfer midway and stays away (huggingface_hub's own resumes fail
    #    too), and the deploy may not retry: it fails in the models step, before anything is switched,
    #    and keeps the partial download.
    hub.reset_counters()
    hub.cut_after, hub.down_after_cut = cut, True
    try:
        proc, _ = deploy(lab, "lab-models-hf", hub, sglang_models_fetch_retries=0)
    finally:
        hub.down_after_cut = hub.down = False
    text = out(proc)
    assert proc.returncode != 0
    assert "model.safetensors: transfer ended at" in text and "run again to resume" in text, text[-3000:]
    assert "The previous service was not touched" in text
    assert TOKEN not in text  # the token is never logged
    assert main_pid(lab, "sglang-lab-models-local.service") == before
    assert not host_path_exists(lab, target)
    part = lab.ssh(HOST, f"stat -c %s {target}.incomplete/model.safetensors.part").stdout.strip()
    assert int(part) == cut
    # 2. Again: the download resumes where it stopped (HTTP Range), the deploy goes through.
    hub.reset_counters()
    proc, _ = deploy(lab, "lab-models-hf", hub)
    assert proc.returncode == 0, out(proc)[-4000:]
    weights_path = f"/lab-org/Tiny-Qwen3.6/resolve/{TARGET_COMMIT}/model.safetensors"
    ranges = [r for m, p, r in hub.requests if m == "GET" and p == weights_path]
    assert ranges == [f"bytes={cut}-"]  # the first run's .part continued: only the rest crossed the wire
    assert hub.bytes_served < weights  # the rest of the weights and the drafter: never the whole weights again
    argv = exec_argv(lab, "sglang-lab-models-hf.service")
    assert flag(argv, "--model-path") == target and "--revision" not in argv
    assert flag(argv, "--speculative-draft-model-path") == f"{MODELS}/lab-org--Tiny-Qwen3.6-DFlash/{DRAFT_COMMIT}"
    files = lab.ssh(HOST, f"cd {target} && find . -type f | sort").stdout.split()
    assert "./model.safetensors" in files and "./modeling_tiny.py" in files
    skipped = {"./README.md", "./pytorch_model.bin", "./original/consolidated.00.pth", "./.gitattributes"}
    assert not skipped & set(files)
    want = hashlib.sha256(hub_standin.tiny_model_files(weight_floats=1 << 20)["model.safetensors"]).hexdigest()
    assert lab.ssh(HOST, f"sha256sum {target}/model.safetensors").stdout.split()[0] == want
    sim = server_info(lab)["simulator"]
    assert sim["hybrid_source"] == f"{target}/config.json" and sim["hybrid_model"] is True
    assert generate(lab)["text"]
    # 3. A third run: the markers match, not one file byte crosses the wire, nothing changes.
    hub.reset_counters()
    proc, _ = deploy(lab, "lab-models-hf", hub)
    assert proc.returncode == 0, out(proc)[-4000:]
    assert hub.bytes_served == 0 and not any("/resolve/" in p for _m, p, _r in hub.requests)
    # Not one task of the models role changed anything (the rest of the deploy may: another
    # worker's patch edits change the release label).
    results = models_task_results(proc.stdout)
    assert not any("changed" in r for r in results.values()), results
    # skipped tasks are hidden by the output (callback sgdeploy.host.summary): the fetch shows no result at all
    fetch = "sgdeploy.host.sglang_models : Fetch from the hub (resumable; verified; renamed into place when complete)"
    assert set(results.get(fetch, {"skipping": 0})) == {"skipping"}, results


def test_not_enough_disk_fails_before_any_change(lab, fixtures, hub, tmp_path):
    hub.reset_counters()
    proc = run_role(lab, tmp_path, "lab-models-huge", token=TOKEN, sglang_models_hf_endpoint=hub.url)
    text = out(proc)
    assert proc.returncode != 0
    assert "not enough disk for model lab-org/Huge-Model@main (10.0 PB" in text, text[-3000:]
    assert "free on the filesystem of" in text and "nothing was changed" in text
    assert hub.bytes_served == 0
    assert not host_path_exists(lab, f"{MODELS}/lab-org--Huge-Model")


def test_without_the_token_the_hub_refuses(lab, fixtures, hub, tmp_path):
    proc = run_role(lab, tmp_path, "lab-models-huge", sglang_models_hf_endpoint=hub.url)
    text = out(proc)
    assert proc.returncode != 0
    assert "401 unauthorized" in text and "no token was sent" in text and "sglang_models_hf_token" in text, text[-3000:]


def progress_lines(text: str) -> list[tuple[int, str]]:
    """The progress lines a fetch printed: (bytes done as printed, the line)."""
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    out = []
    pattern = r"fetch (lab-org/\S+): ([\d.]+) (B|KB|MB|GB|TB) of [\d.]+ [KMGT]?B, \d+ of \d+ files, \d+ s elapsed"
    for m in re.finditer(pattern, text):
        out.append((int(float(m.group(2)) * units[m.group(3)]), m.group(0)))
    return out


def test_check_mode_reports_what_would_be_fetched_and_changes_nothing(lab, fixtures, hub, tmp_path):
    lab.ssh(HOST, "rm -rf /srv/lab-models-alt")
    hub.reset_counters()
    proc = run_role(lab, tmp_path, "lab-models-hf", "--check", "--diff", token=TOKEN,
                    models=role_models(tmp_path, "lab-models-hf", ALT_MODELS), sglang_models_root=ALT_MODELS,
                    sglang_models_hf_endpoint=hub.url)
    text = out(proc)
    assert proc.returncode == 0, text[-3000:]
    assert f"model lab-org/Tiny-Qwen3.6@{TARGET_COMMIT} -> {ALT_MODELS}/lab-org--Tiny-Qwen3.6/{TARGET_COMMIT}: " \
           "would fetch 4.2 MB" in text, text[-3000:]
    assert "drafter lab-org/Tiny-Qwen3.6-DFlash@" in text
    # The hub was asked for the file lists only; nothing on the host changed.
    assert hub.bytes_served == 0 and not any("/resolve/" in p for _m, p, _r in hub.requests)
    assert any("/api/models/lab-org/Tiny-Qwen3.6/revision/" in p for _m, p, _r in hub.requests)
    assert not host_path_exists(lab, "/srv/lab-models-alt")


def test_a_slow_fetch_prints_progress_into_a_non_default_models_root(lab, fixtures, hub, tmp_path):
    """sglang_models_root elsewhere: the models land there, owned by the service user; a fetch that
    takes longer than the progress interval prints bytes, files and elapsed time each interval."""
    lab.ssh(HOST, "rm -rf /srv/lab-models-alt")
    items = role_models(tmp_path, "lab-models-hf", ALT_MODELS)
    target = f"{ALT_MODELS}/lab-org--Tiny-Qwen3.6/{TARGET_COMMIT}"
    hub.reset_counters()
    hub.rate = 500_000  # 4.2 MB of weights: about 8 s
    try:
        start = time.monotonic()
        proc = run_role(lab, tmp_path, "lab-models-hf", token=TOKEN, models=items, sglang_models_root=ALT_MODELS,
                        sglang_models_hf_endpoint=hub.url, play_vars={"sglang_models_progress_interval": 2})
        took = time.monotonic() - start
    finally:
        hub.rate = None
    text = out(proc)
    assert proc.returncode == 0, text[-4000:]
    lines = progress_lines(text)
    target_lines = [(b, ln) for b, ln in lines if "Tiny-Qwen3.6@" in ln]
    assert len(target_lines) >= 3, (took, lines)
    done = [b for b, _ln in target_lines]
    assert done == sorted(done) and done[-1] > done[0], target_lines
    assert "of 4.2 MB" in target_lines[0][1]
    # In place under the non-default root, complete, owned by the service user; nothing under the default.
    marker = json.loads(lab.ssh(HOST, f"cat {target}/.sgdeploy-complete.json").stdout)
    assert marker["commit"] == TARGET_COMMIT
    owners = lab.ssh(HOST, f"stat -c %U {ALT_MODELS} {target} {target}/model.safetensors").stdout.split()
    assert owners == ["sglang", "sglang", "sglang"]
    assert not host_path_exists(lab, f"{target}.incomplete") and not host_path_exists(lab, f"{target}.progress.json")
    # Prune works in that root too: a stale folder goes, the deploy's stay, nothing is transferred again.
    lab.ssh(HOST, f"mkdir -p {ALT_MODELS}/org--stale/old")
    hub.reset_counters()
    proc = run_role(lab, tmp_path, "lab-models-hf", token=TOKEN, models=items, sglang_models_root=ALT_MODELS,
                    sglang_models_hf_endpoint=hub.url, sglang_models_prune=True)
    assert proc.returncode == 0, out(proc)[-3000:]
    assert not host_path_exists(lab, f"{ALT_MODELS}/org--stale")
    assert host_path_exists(lab, f"{target}/model.safetensors") and hub.bytes_served == 0


def test_a_models_root_the_deploy_description_does_not_use_is_refused(lab, fixtures, hub, tmp_path):
    """Models rendered for one root and a role told another would split the host's models: refused."""
    proc = run_role(lab, tmp_path, "lab-models-hf", token=TOKEN, models=role_models(tmp_path, "lab-models-hf"),
                    sglang_models_root=ALT_MODELS, sglang_models_hf_endpoint=hub.url)
    text = out(proc)
    assert proc.returncode != 0
    assert (f"MODELS NOT READY on lab1: model folder {MODELS}/lab-org--Tiny-Qwen3.6/{TARGET_COMMIT}: not under the "
            f"models root {ALT_MODELS} (sglang_models_root)") in text, text[-3000:]


class SecretWatch:
    """Scans every process of this machine (the lab hosts' too: they are its children) for a secret in
    /proc/PID/cmdline or /proc/PID/environ, and the controller's Ansible temp folder for files holding
    it, until stopped; remembers where it was seen and whether the fetch ran while it looked."""

    def __init__(self, secret: str):
        self.secret = secret.encode()
        self.seen: list[str] = []
        self.scans = 0
        self.saw_fetch = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        me = str(os.getpid())
        tmp = Path.home() / ".ansible" / "tmp"
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid == me:
                    continue
                for what in ("cmdline", "environ"):
                    try:
                        data = Path(f"/proc/{pid}/{what}").read_bytes()
                    except OSError:
                        continue
                    if what == "cmdline" and (b"sglang_model_fetch.py" in data or b"sgdeploy.models\0fetch" in data):
                        self.saw_fetch = True
                    if self.secret in data:
                        self.seen.append(f"/proc/{pid}/{what}: {data[:200]!r}")
            for dirpath, _dirs, files in os.walk(tmp):
                for fn in files:
                    try:
                        if self.secret in Path(dirpath, fn).read_bytes():
                            self.seen.append(f"controller file {dirpath}/{fn}")
                    except OSError:
                        pass
            self.scans += 1
            self._stop.wait(0.05)


def files_holding(root: Path, secret: bytes, skip: tuple[Path, ...] = ()) -> list[str]:
    found = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(dirpath, d) not in skip]
        for fn in files:
            p = Path(dirpath, fn)
            try:
                if p.is_symlink() or not p.is_file() or p.stat().st_size > 200 << 20:
                    continue
                if secret in p.read_bytes():
                    found.append(str(p))
            except OSError:
                pass
    return found


def test_a_canary_token_reaches_the_hub_and_nowhere_else(lab, fixtures, hub):
    """The token is only a no_log module argument and a root-only file during the fetch: not in any
    process's command line or environment during the run, not in the -vvv output, not on the
    controller's disk (build/, reports/, Ansible's temp files), not in the host's journal."""
    canary = "hf_canary_" + secrets.token_hex(12)
    target = f"{MODELS}/lab-org--Tiny-Qwen3.6/{TARGET_COMMIT}"
    lab.ssh(HOST, f"rm -rf {target}")  # so the deploy fetches it (with the token) again
    hub.reset_counters()
    hub.token, hub.rate = canary, 1_000_000  # the hub refuses any other token; the fetch lasts seconds
    try:
        with SecretWatch(canary) as watch:
            proc, _ = deploy(lab, "lab-models-hf", hub, "-vvv", token=canary)
            time.sleep(0.5)
    finally:
        hub.token, hub.rate = TOKEN, None
    text = out(proc)
    assert proc.returncode == 0, text[-4000:]
    # The fetch ran, with the canary (the hub refuses anything else), while the watch looked.
    assert hub.bytes_served > 4_000_000 and host_path_exists(lab, f"{target}/model.safetensors")
    assert watch.saw_fetch and watch.scans > 20, (watch.saw_fetch, watch.scans)
    assert watch.seen == []
    assert canary not in text
    secret = canary.encode()
    for folder in (REPO / "build", REPO / "reports"):
        assert files_holding(folder, secret) == [], folder
    # The export format carries a field with a newline as binary (a length, then raw bytes): searched as bytes
    # on the host, never decoded (a CI run of 2026-12-03 failed decoding it).
    size = lab.ssh(HOST, "journalctl -o export --no-pager | wc -c", timeout=120).stdout.strip()
    hits = lab.ssh(HOST, f"journalctl -o export --no-pager | grep -caF '{canary}'", timeout=120, check=False)
    assert int(size) > 0 and hits.stdout.strip() == "0", (size, hits.stdout, hits.stderr)
    leftovers = lab.ssh(HOST, "find /root/.ansible /root/.ansible_async /run/sgdeploy-models -type f "
                              "-exec cat {} + 2>/dev/null; ls -A /run/sgdeploy-models", check=False).stdout
    assert canary not in leftovers
    assert "hf-token-" not in leftovers  # the token file was removed after the fetch


def test_timings_are_recorded():
    path = REPO / "build" / "lab-models-timings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(TIMINGS, indent=2))
    assert TIMINGS
