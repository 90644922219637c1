"""Model placement on the host: the sgdeploy.host collection's modules and module_utils, against the
hub stand-in on 127.0.0.1; and the role's shape (modules, no PYTHONPATH, no token in an environment).

The modules run for real, as Ansible runs them on a host: `python MODULE ARGS.json` with the
collections folder importable, HTTP to a stdlib stand-in of the hub's API (tests/lab/hub_standin.py)
with its token check, Range support, a switch that cuts a download midway and a rate limit.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sgdeploy import models, render, spec

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = "collections/ansible_collections/sgdeploy/host/roles"
ROLES = REPO / ROLES_DIR
COLLECTIONS = REPO / "collections"
COLLECTION = COLLECTIONS / "ansible_collections" / "sgdeploy" / "host"
ROLE = ROLES / "sglang_models"
sys.path.insert(0, str(REPO / "tests" / "lab"))
import hub_standin  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import (  # noqa: E402
    hf_fetch,
    model_folders,
    model_plan,
)

TOKEN = "hf_unit_test_token"
COMMIT = "1" * 40
WANTED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "vocab.json", "merges.txt", "chat_template.jinja", "modeling_tiny.py"}
REPO_ID = "lab-org/Tiny-Qwen3.6"


@pytest.fixture()
def hub():
    with hub_standin.HubStandin(token=TOKEN) as h:
        h.add_repo(REPO_ID, hub_standin.tiny_model_files(), commit=COMMIT, branches=("main",))
        yield h


def run_module(name: str, args: dict, tmp_path: Path, check_mode: bool = False) -> tuple[int, dict]:
    """Run sgdeploy.host.NAME the way Ansible runs a module on a host; (exit code, result)."""
    args_file = tmp_path / f"args-{name}-{time.monotonic_ns()}.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode,
                                                                 _ansible_diff=True)}))
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    proc = subprocess.run([sys.executable, str(COLLECTION / "plugins" / "modules" / f"{name}.py"), str(args_file)],
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    args_file.unlink()
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"{name}: no JSON result: {proc.stdout}\n{proc.stderr}") from None
    return proc.returncode, result


def token_file(tmp_path: Path, token: str = TOKEN) -> str:
    return hf_fetch.write_token_file(token, str(tmp_path / "run"))


HUB_SCRIPT = ROLE / "files" / "hf_download.py"


def fetch_args(hub, dest: Path, tmp_path: Path, token: str | None = TOKEN, **more) -> dict:
    """The fetch's arguments; its hub client is this venv's huggingface_hub (pinned as on the hosts)."""
    args = {"repo": REPO_ID, "revision": "main", "dest": str(dest), "endpoint": hub.url,
            "hf_token_file": token_file(tmp_path, token) if token else "", "hub_python": sys.executable,
            "hub_script": str(HUB_SCRIPT)}
    args.update(more)
    return args


# --------------------------------------------------------------------------------------------------
# The role: modules, not commands; no PYTHONPATH, no token in an environment; tags


def role_tasks() -> list[tuple[str, dict]]:
    """Every task and block of the role, each with the tags of its blocks added (`tags`)."""
    out = []

    def walk(tasks, fname, inherited=()):
        for t in tasks or []:
            t = dict(t, tags=list(inherited) + list(t.get("tags") or []))
            out.append((fname, t))
            for key in ("block", "rescue", "always"):
                walk(t.get(key), fname, t["tags"])

    for f in sorted((ROLE / "tasks").glob("*.yml")):
        walk(yaml.safe_load(f.read_text()), f.name)
    return out


def test_host_steps_are_collection_modules_without_pythonpath_or_environment():
    tasks = role_tasks()
    assert tasks
    for fname, t in tasks:
        t = {k: v for k, v in t.items() if k != "tags"}
        assert "environment" not in t, (fname, t.get("name"))  # the token went through one (issue 19)
        text = json.dumps(t)
        assert "PYTHONPATH" not in text and "tools_dir" not in text, (fname, t.get("name"))
        if "ansible.builtin.command" in t:  # the pack is an action plugin now; only pip fetches the hub's wheels
            argv = t["ansible.builtin.command"]["argv"]
            assert fname == "hub.yml" and argv[1:4] == ["-m", "pip", "download"], (fname, t.get("name"))
            assert "--require-hashes" in argv and t.get("delegate_to") == "localhost", (fname, t.get("name"))
        if "sgdeploy.host.controller_model_pack" in t:  # it packs a controller folder on the controller
            assert t.get("delegate_to") == "localhost", (fname, t.get("name"))
    used = {k for _f, t in tasks for k in t if k.startswith("sgdeploy.host.")}
    assert used == {"sgdeploy.host.sglang_model_plan", "sgdeploy.host.sglang_model_token",
                    "sgdeploy.host.sglang_model_fetch", "sgdeploy.host.sglang_model_fetch_progress",
                    "sgdeploy.host.sglang_model_finish", "sgdeploy.host.sglang_model_prune",
                    "sgdeploy.host.controller_model_pack", "sgdeploy.host.sglang_model_hub_install"}
    for name in used:
        assert (COLLECTION / "plugins" / "modules" / f"{name.split('.')[-1]}.py").is_file()
    assert "collections_path = ./collections" in (REPO / "ansible.cfg").read_text()


def test_every_task_of_the_role_is_tagged_models():
    for fname, t in role_tasks():
        assert "models" in (t.get("tags") or []), (fname, t.get("name"))


def test_every_advertised_variable_has_a_default_and_is_used():
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    tasks_text = "".join(f.read_text() for f in (ROLE / "tasks").glob("*.yml"))
    assert set(specs) == set(defaults)
    for var in specs:
        assert var in tasks_text, f"{var} is advertised but no task uses it"


def test_the_token_is_a_no_log_parameter_of_every_module_that_takes_it():
    for path in (COLLECTION / "plugins" / "modules").glob("sglang_model_*.py"):
        text = path.read_text()
        if '"hf_token"' in text:
            assert '"hf_token": {"type": "str", "no_log": True' in text, path.name


def test_module_utils_need_only_the_standard_library():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from ansible_collections.sgdeploy.host.plugins.module_utils import hf_fetch, model_plan, model_folders")
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(COLLECTIONS)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------------------------------
# File selection, layout


def test_selection_keeps_what_a_model_needs_and_skips_the_rest():
    siblings = [{"rfilename": n} for n in hub_standin.tiny_model_files()]
    chosen = {s["rfilename"] for s in hf_fetch.select_files(siblings)}
    assert chosen == WANTED


def test_bin_weights_only_when_there_are_no_safetensors():
    names = ["config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
             "pytorch_model.bin.index.json", "original/params.json", "tokenizer.model"]
    chosen = {s["rfilename"] for s in hf_fetch.select_files([{"rfilename": n} for n in names])}
    assert chosen == {"config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                      "pytorch_model.bin.index.json", "tokenizer.model"}


def test_allow_patterns_replace_the_default_selection():
    siblings = [{"rfilename": n} for n in ("config.json", "model.safetensors", "README.md", "sub/x.safetensors")]
    chosen = [s["rfilename"] for s in hf_fetch.select_files(siblings, ["*.json", "sub/*"])]
    assert chosen == ["config.json", "sub/x.safetensors"]


def test_local_folders_follow_the_layout():
    assert (models.local_dir("hf", repo="Qwen/Qwen3.6-27B", revision="abc")
            == "/var/lib/sglang/models/Qwen--Qwen3.6-27B/abc")
    assert models.local_dir("path", path="/mnt/m") == "/mnt/m"
    assert models.local_dir("controller", name="tiny", version="v1") == "/var/lib/sglang/models/tiny/v1"
    assert models.local_dir("controller", name="tiny", version="v1", root="/data/m/") == "/data/m/tiny/v1"
    # The controller's names are the host's: one definition.
    assert models.local_dir is model_folders.local_dir and models.MARKER == model_folders.MARKER


# --------------------------------------------------------------------------------------------------
# Fetch, marker, resume (the module)


def test_fetch_places_verified_files_and_a_marker_then_transfers_nothing(hub, tmp_path):
    dest = tmp_path / "models" / "lab-org--Tiny-Qwen3.6" / "main"
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 0, result
    assert list((tmp_path / "run").iterdir()) == []  # the token file was removed once read
    files = hub_standin.tiny_model_files()
    wanted_bytes = sum(len(files[n]) for n in WANTED)
    assert result["changed"] is True and result["bytes_downloaded"] == wanted_bytes == hub.bytes_served
    assert result["commit"] == COMMIT and result["files"] == len(WANTED)
    assert "model.safetensors" in result["diff"]["after"] and "absent" in result["diff"]["before"]
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == WANTED | {models.MARKER}
    for name in WANTED:
        assert (dest / name).read_bytes() == files[name], name
    marker = json.loads((dest / models.MARKER).read_text())
    assert marker["repo"] == REPO_ID and marker["revision"] == "main" and marker["commit"] == COMMIT
    assert {f["name"]: f["size"] for f in marker["files"]} == {n: len(files[n]) for n in WANTED}
    assert not (dest.parent / "main.incomplete").exists()
    # The last progress state says done with every byte and file.
    progress = hf_fetch.read_progress(hf_fetch.progress_path(dest))
    assert progress["state"] == "done" and progress["bytes_done"] == wanted_bytes == progress["bytes_total"]
    assert progress["files_done"] == len(WANTED)
    # Second run: the marker matches the hub's file list, nothing is downloaded.
    hub.reset_counters()
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 0 and result["changed"] is False, result
    assert hub.bytes_served == 0
    assert all("/resolve/" not in path for _m, path, _r in hub.requests)


def test_check_mode_reports_what_would_be_fetched_and_writes_nothing(hub, tmp_path):
    dest = tmp_path / "models" / "m"
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path, check_mode=True)
    assert rc == 0, result
    files = hub_standin.tiny_model_files()
    assert result["changed"] is True and result["bytes_to_transfer"] == sum(len(files[n]) for n in WANTED)
    assert result["bytes_downloaded"] == 0 and hub.bytes_served == 0
    assert "model.safetensors" in result["diff"]["after"]
    assert not (tmp_path / "models").exists()


def test_a_pinned_commit_already_in_place_needs_no_hub(hub, tmp_path):
    dest = tmp_path / "m"
    rc, _ = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path, revision=COMMIT), tmp_path)
    assert rc == 0
    # The hub is gone: a complete folder for a commit hash is enough (offline redeploys).
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path, revision=COMMIT,
                                                             endpoint="http://127.0.0.1:9", timeout=2), tmp_path)
    assert rc == 0 and result["changed"] is False, result
    item = {"role": "model", "source": "hf", "repo": REPO_ID, "revision": COMMIT, "local_dir": str(dest)}
    assert model_plan.plan([item], hf_fetch.Hub("http://127.0.0.1:9", timeout=2))[0]["action"] == "none"
    # A branch name can move: the hub is asked, and an unreachable hub is an error.
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path, endpoint="http://127.0.0.1:9",
                                                             timeout=2), tmp_path)
    assert rc == 1 and "cannot reach" in result["msg"]


def test_a_file_changed_on_disk_is_fetched_again(hub, tmp_path):
    dest = tmp_path / "m"
    assert run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)[0] == 0
    (dest / "model.safetensors").write_bytes(b"truncated")
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 0 and result["changed"] is True
    assert (dest / "model.safetensors").read_bytes() == hub_standin.tiny_model_files()["model.safetensors"]


def test_a_cut_download_resumes_with_a_range_request(hub, tmp_path):
    dest = tmp_path / "m"
    weights = hub_standin.tiny_model_files()["model.safetensors"]
    cut = len(weights) // 2
    hub.cut_after, hub.down_after_cut = cut, True  # cut midway, and the hub stays away (huggingface_hub retries)
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path, retries=0), tmp_path)
    assert rc == 1
    assert "model.safetensors: transfer ended at" in result["msg"] and "run again to resume" in result["msg"], result
    assert len(result["msg"].splitlines()) == 1 and "Traceback" not in json.dumps(result)
    assert not dest.exists()  # nothing half-done is ever in place
    part = tmp_path / "m.incomplete" / "model.safetensors.part"
    assert part.stat().st_size == cut
    assert hf_fetch.read_progress(hf_fetch.progress_path(dest))["state"] == "failed"
    files = hub_standin.tiny_model_files()
    kept = sum(f.stat().st_size for f in (tmp_path / "m.incomplete").rglob("*") if f.is_file())  # cut included
    hub.down = False
    hub.reset_counters()
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 0, result
    ranges = [r for m, path, r in hub.requests if m == "GET" and path.endswith("model.safetensors")]
    assert ranges == [f"bytes={cut}-"]  # the .part of the first run was continued, not started again
    assert (dest / "model.safetensors").read_bytes() == weights
    # Only the rest of the cut file and the files not yet fetched came over the wire.
    assert hub.bytes_served == sum(len(files[n]) for n in WANTED) - kept
    assert result["bytes_downloaded"] == hub.bytes_served


def test_a_cut_is_resumed_within_one_run(hub, tmp_path):
    hub.cut_after = 1000
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, tmp_path / "m", tmp_path), tmp_path)
    assert rc == 0, result
    assert any("resuming" in line for line in result["resumes"]), result["resumes"]
    assert any(r == "bytes=1000-" for _m, _p, r in hub.requests)


def test_a_hub_gone_away_is_resumed_by_the_retries(hub, tmp_path):
    """huggingface_hub's own resumes fail while the hub is away; the fetch's retries resume the rest. The hub is
    away for a number of requests, not for a time, so a slow machine cannot let huggingface_hub's own retries
    outlast the outage: after the cut, its http_get's 5 resumes are refused (huggingface_hub 2.0.0), then the
    fetch's attempt 2, whose metadata request is refused too (6); attempt 3 finds the hub back."""
    hub.cut_after, hub.down_after_cut, hub.down_for_requests = 1000, True, 6
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, tmp_path / "m", tmp_path, retries=3), tmp_path)
    assert rc == 0, result
    assert any("transfer ended at" in line and "resuming (attempt 2 of 4)" in line for line in result["resumes"]), \
        result["resumes"]
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == hub_standin.tiny_model_files()["model.safetensors"]


def test_a_corrupt_file_fails_its_checksum_and_is_not_installed(hub, tmp_path):
    dest = tmp_path / "m"
    stage = tmp_path / "m.incomplete"
    stage.mkdir()
    weights = hub_standin.tiny_model_files()["model.safetensors"]
    (stage / "model.safetensors.part").write_bytes(b"X" * 100)  # a bad start, resumed with Range
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 1 and "checksum mismatch" in result["msg"], result
    assert not dest.exists() and not (stage / "model.safetensors.part").exists()
    rc, _ = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
    assert rc == 0 and (dest / "model.safetensors").read_bytes() == weights


# --------------------------------------------------------------------------------------------------
# Errors: one line, naming the thing, a failed result, no traceback, never the token


@pytest.mark.parametrize("args,token,fragments", [
    ({}, None, ["401", "no token was sent", "sglang_models_hf_token"]),
    ({}, "wrong", ["401", "refused"]),
    ({"repo": "lab-org/Nope"}, TOKEN, ["lab-org/Nope@main", "RepoNotFound"]),
    ({"revision": "v9"}, TOKEN, ["lab-org/Tiny-Qwen3.6@v9", "RevisionNotFound"]),
    ({"repo": "no-slash"}, TOKEN, ["repo", "'no-slash'", "ORG/NAME"]),
    ({"revision": "refs/pr/1"}, TOKEN, ["revision", "commit hash, branch or tag"]),
    ({"retries": -1}, TOKEN, ["retries", "-1", "0 or more"]),
])
def test_errors_are_one_line(hub, tmp_path, args, token, fragments):
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, tmp_path / "m", tmp_path, token, **args),
                            tmp_path)
    assert rc == 1 and result["failed"] is True, result
    assert len(result["msg"].splitlines()) == 1 and "Traceback" not in json.dumps(result), result
    for f in fragments:
        assert f in result["msg"], (f, result["msg"])
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.incomplete").exists()
    assert TOKEN not in json.dumps(result)


def test_a_token_file_others_can_read_is_refused(hub, tmp_path):
    path = token_file(tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert Path(path).read_text() == TOKEN
    os.chmod(path, 0o644)
    rc, result = run_module("sglang_model_fetch", fetch_args(hub, tmp_path / "m", tmp_path, None,
                                                             hf_token_file=path), tmp_path)
    assert rc == 1 and "mode 0600" in result["msg"] and hub.bytes_served == 0


def test_the_token_parameter_is_never_in_a_result(hub, tmp_path):
    items = [{"role": "model", "source": "hf", "repo": REPO_ID, "revision": "main",
              "local_dir": str(tmp_path / "a")}]
    rc, result = run_module("sglang_model_plan", {"models": items, "endpoint": hub.url, "hf_token": TOKEN}, tmp_path)
    assert rc == 0, result
    assert TOKEN not in json.dumps(result)
    assert result["invocation"]["module_args"]["hf_token"] != TOKEN
    rc, result = run_module("sglang_model_token", {"hf_token": TOKEN}, tmp_path, check_mode=True)
    assert rc == 0 and result["path"] == "" and TOKEN not in json.dumps(result)


def test_unreachable_hub_names_the_endpoint(tmp_path):
    rc, result = run_module("sglang_model_fetch", {"repo": "a/b", "revision": "main", "dest": str(tmp_path / "m"),
                                                   "endpoint": "http://127.0.0.1:9", "timeout": 5}, tmp_path)
    assert rc == 1 and "cannot reach http://127.0.0.1:9" in result["msg"], result
    assert len(result["msg"].splitlines()) == 1


# --------------------------------------------------------------------------------------------------
# Progress of a long fetch


def test_a_slow_fetch_reports_growing_progress_and_the_wait_is_bounded(hub, tmp_path):
    dest = tmp_path / "m"
    hub.rate = 80_000  # bytes per second: the tiny model takes about 3.5 s
    results = tmp_path / "job.json"
    results.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1"}))
    done = {}

    def job():
        done["rc"], done["result"] = run_module("sglang_model_fetch", fetch_args(hub, dest, tmp_path), tmp_path)
        results.write_text(json.dumps(done["result"]))

    worker = threading.Thread(target=job)
    worker.start()
    seen = []
    try:
        for _ in range(40):
            start = time.monotonic()
            rc, p = run_module("sglang_model_fetch_progress", {"dest": str(dest), "results_file": str(results),
                                                               "wait": 0.5}, tmp_path)
            assert rc == 0 and p["changed"] is False, p
            seen.append(p)
            if p["finished"]:
                break
            assert time.monotonic() - start < 5  # bounded by `wait` (plus the module's start)
    finally:
        worker.join(60)
    assert done["rc"] == 0, done
    assert seen[-1]["finished"] is True
    running = [p["progress"]["bytes_done"] for p in seen if p["progress"].get("state") == "running"]
    assert len(running) >= 2 and running == sorted(running) and running[-1] > running[0], seen
    assert any("s elapsed" in p["msg"] and "of" in p["msg"] and "files" in p["msg"] for p in seen)
    assert not hf_fetch.progress_path(dest).exists()  # removed once the job ended


def test_the_wait_ends_when_the_fetch_died_without_a_result(tmp_path):
    dest = tmp_path / "m"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    hf_fetch.progress_path(dest).write_text(json.dumps({"pid": int(dead), "state": "running", "label": "x",
                                                        "started": time.time(), "bytes_done": 1}))
    results = tmp_path / "job.json"
    results.write_text(json.dumps({"started": True, "finished": False}))
    start = time.monotonic()
    rc, p = run_module("sglang_model_fetch_progress", {"dest": str(dest), "results_file": str(results),
                                                       "wait": 20}, tmp_path)
    assert rc == 0 and p["finished"] is True and time.monotonic() - start < 15


# --------------------------------------------------------------------------------------------------
# Plan: every model checked, disk space first, nothing changed


def test_plan_fails_on_disk_space_naming_model_size_and_space_left(hub, tmp_path):
    hub.add_repo("lab-org/Huge", hub_standin.tiny_model_files(extras=False), branches=("main",),
                 fake_sizes={"model.safetensors": 10**16})
    dest = tmp_path / "models" / "lab-org--Huge" / "main"
    items = [{"role": "model", "source": "hf", "repo": "lab-org/Huge", "revision": "main", "local_dir": str(dest)}]
    rc, result = run_module("sglang_model_plan", {"models": items, "endpoint": hub.url, "hf_token": TOKEN}, tmp_path)
    assert rc == 1
    line = result["msg"]
    assert "not enough disk for model lab-org/Huge@main (10.0 PB" in line and "free on the filesystem of" in line
    assert "nothing was changed" in line and len(line.splitlines()) == 1
    assert not (tmp_path / "models").exists()
    assert not any("/resolve/" in p for _m, p, _r in hub.requests)


def test_plan_counts_model_and_drafter_together_against_min_free(hub, tmp_path):
    import shutil

    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    items = [{"role": "model", "source": "hf", "repo": REPO_ID, "revision": "main",
              "local_dir": str(tmp_path / "a")}]
    rc, ok = run_module("sglang_model_plan", {"models": items, "endpoint": hub.url, "hf_token": TOKEN}, tmp_path)
    assert rc == 0, ok
    assert ok["models"][0]["action"] == "fetch" and ok["changed"] is False
    assert ok["models"][0]["text"].startswith(f"model {REPO_ID}@main -> {tmp_path / 'a'}: fetch ")
    assert ok["bytes_to_transfer"] == ok["models"][0]["missing_bytes"] > 0
    rc, too_much = run_module("sglang_model_plan", {"models": items, "endpoint": hub.url, "hf_token": TOKEN,
                                                    "min_free_gb": free_gb + 1}, tmp_path)
    assert rc == 1 and "keeping" in too_much["msg"]


def test_plan_checks_a_path_source(tmp_path):
    good = tmp_path / "shared" / "m"
    good.mkdir(parents=True)
    (good / "config.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    item = {"role": "drafter", "source": "path", "local_dir": str(good)}
    rc, ok = run_module("sglang_model_plan", {"models": [item]}, tmp_path)
    assert rc == 0 and ok["models"][0]["action"] == "none" and ok["models"][0]["text"].endswith(": in place")
    for folder, why in ((tmp_path / "absent", "no such folder"), (empty, "no config.json")):
        rc, bad = run_module("sglang_model_plan", {"models": [{"role": "drafter", "source": "path",
                                                              "local_dir": str(folder)}]}, tmp_path)
        assert rc == 1 and f"drafter path {folder}" in bad["msg"] and why in bad["msg"]


def test_plan_refuses_a_folder_outside_the_models_root(tmp_path):
    """A non-default sglang_models_root that the deploy description does not use would split the host's
    models between two roots: the plan says so instead of placing them elsewhere."""
    item = {"role": "model", "source": "controller", "name": "tiny", "sha": "0" * 64, "bytes": 1, "version": "v1",
            "local_dir": "/var/lib/sglang/models/tiny/v1"}
    with pytest.raises(model_folders.ModelError, match=r"model folder /var/lib/sglang/models/tiny/v1: not under "
                                                      r"the models root /data/models \(sglang_models_root\)"):
        model_plan.plan([item], None, root="/data/models")
    inside = dict(item, local_dir=str(tmp_path / "models" / "tiny" / "v1"))
    assert model_plan.plan([inside], None, root=str(tmp_path / "models"))[0]["action"] == "copy"


# --------------------------------------------------------------------------------------------------
# Controller copies: digest, pack, finish


def test_controller_copy_digest_pack_finish(tmp_path):
    src = tmp_path / "tiny-qwen3.6"
    hub_standin.write_model(src, hub_standin.tiny_model_files(extras=False))
    sha, total, _files = models.folder_digest(src)
    tar = tmp_path / "cache" / "tiny.tar"
    assert models.pack(src, tar) is True and models.pack(src, tar) is False
    stage = tmp_path / "host" / "tiny-qwen3.6" / (sha[:16] + model_folders.STAGE_SUFFIX)
    stage.mkdir(parents=True)
    import tarfile

    with tarfile.open(tar) as t:
        t.extractall(stage, filter="data")
    dest = tmp_path / "host" / "tiny-qwen3.6" / sha[:16]
    args = {"stage": str(stage), "dest": str(dest), "sha": sha, "name": "tiny-qwen3.6"}
    rc, result = run_module("sglang_model_finish", args, tmp_path, check_mode=True)
    assert rc == 0 and result["changed"] is True and not dest.exists() and stage.is_dir()
    rc, result = run_module("sglang_model_finish", args, tmp_path)
    assert rc == 0 and result["changed"] is True and result["bytes"] == total, result
    assert "absent" in result["diff"]["before"] and "config.json" in result["diff"]["after"]
    assert model_folders.marker_matches_controller(dest, sha) and not stage.exists()
    assert models.folder_digest(dest)[0] == sha  # the marker is not part of the digest
    rc, again = run_module("sglang_model_finish", args, tmp_path)
    assert rc == 0 and again["changed"] is False
    # A changed copy is refused, not installed.
    stage.mkdir()
    (stage / "config.json").write_text("{}")
    rc, bad = run_module("sglang_model_finish", dict(args, dest=str(tmp_path / "other")), tmp_path)
    assert rc == 1 and "does not match the controller folder" in bad["msg"]
    assert not (tmp_path / "other").exists()
    # The plan sees the copy as complete.
    item = {"role": "model", "source": "controller", "name": "tiny-qwen3.6", "sha": sha, "bytes": total,
            "version": sha[:16], "local_dir": str(dest)}
    assert model_plan.plan([item], None)[0]["action"] == "none"
    assert model_plan.plan([dict(item, sha="0" * 64)], None)[0]["action"] == "copy"


def test_pack_command_line(tmp_path):
    src = tmp_path / "src"
    hub_standin.write_model(src, hub_standin.tiny_model_files(extras=False))
    proc = subprocess.run([sys.executable, "-m", "sgdeploy.models", "pack", "--src", str(src), "--out",
                           str(tmp_path / "t.tar")], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"changed": True, "tar": str(tmp_path / "t.tar")}
    proc = subprocess.run([sys.executable, "-m", "sgdeploy.models", "pack", "--src", str(tmp_path / "nope"),
                           "--out", str(tmp_path / "u.tar")], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == f"--src: {tmp_path / 'nope'}: no such folder"


def test_render_points_the_unit_at_local_folders(tmp_path):
    folder = tmp_path / "tiny-qwen3.6"
    hub_standin.write_model(folder, hub_standin.tiny_model_files(extras=False))
    cfg = tmp_path / "local.yml"
    cfg.write_text(f"""
extends: ddtree-b15
model: {{source: controller, path: null, revision: null, controller_path: {folder}, recurrent_layers: true}}
drafter: {{source: path, path: /srv/models/tiny-dflash, revision: null}}
""")
    config = spec.load(cfg)
    argv = render.render(config, render.HostSettings("x")).argv
    sha = models.folder_digest(folder)[0]
    assert argv[argv.index("--model-path") + 1] == f"/var/lib/sglang/models/tiny-qwen3.6/{sha[:16]}"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/srv/models/tiny-dflash"
    assert "--revision" not in argv
    sources = render.model_sources(config)
    assert [s["role"] for s in sources] == ["model", "drafter"]
    assert sources[0]["sha"] == sha and sources[0]["bytes"] == models.folder_digest(folder)[1]
    # The merged config round-trips with its sources.
    again = tmp_path / "again.yml"
    again.write_text(spec.to_yaml(config))
    assert spec.load(again).model == config.model and spec.load(again).drafter == config.drafter


# --------------------------------------------------------------------------------------------------
# Prune: never a folder a unit, a previous unit or this deploy uses


def test_prune_keeps_folders_in_use(tmp_path):
    root = tmp_path / "models"
    for rel in ("org--a/rev1", "org--a/rev2", "org--a/rev3", "tiny/abc", "org--b/main.incomplete"):
        (root / rel).mkdir(parents=True)
    units = tmp_path / "units"
    units.mkdir()
    (units / "sglang-x.service").write_text(f"ExecStart=/py -m s --model-path {root}/org--a/rev2 --port 1\n")
    state = tmp_path / "state"
    (state / "x").mkdir(parents=True)
    (state / "x" / "previous.json").write_text(json.dumps(
        {"unit_text": f"ExecStart=/py --speculative-draft-model-path {root}/tiny/abc\n"}))
    keep = model_folders.folders_in_use(state, units) | {str(root / "org--a" / "rev3")}
    want = [str(root / "org--a" / "rev1"), str(root / "org--b" / "main.incomplete")]
    assert model_folders.prunable(root, keep) == want
    # The module in check mode names them and removes nothing.
    rc, result = run_module("sglang_model_prune", {"root": str(root), "state_dir": str(state),
                                                   "keep": sorted(keep)}, tmp_path, check_mode=True)
    assert rc == 0 and result["changed"] is True and sorted(result["removed"]) == want
    assert all(Path(f).is_dir() for f in want) and str(root / "org--a" / "rev1") in result["diff"]["before"]
    removed = model_folders.prune(root, keep)
    assert sorted(removed) == want
    for kept in ("org--a/rev2", "org--a/rev3", "tiny/abc"):
        assert (root / kept).is_dir(), kept
    assert not (root / "org--b").exists()
