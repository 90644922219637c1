"""Model placement on the host (sgdeploy.models), against the hub stand-in on 127.0.0.1.

The fetcher runs for real: HTTP to a stdlib stand-in of the hub's API (tests/lab/hub_standin.py),
with its token check, Range support and a switch that cuts a download midway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgdeploy import models, render, spec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "lab"))
import hub_standin  # noqa: E402

TOKEN = "hf_unit_test_token"
COMMIT = "1" * 40
WANTED = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "vocab.json", "merges.txt", "chat_template.jinja", "modeling_tiny.py"}


@pytest.fixture()
def hub():
    with hub_standin.HubStandin(token=TOKEN) as h:
        h.add_repo("lab-org/Tiny-Qwen3.6", hub_standin.tiny_model_files(), commit=COMMIT, branches=("main",))
        yield h


def run_models(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    if token:
        env["HF_TOKEN"] = token
    env["PYTHONPATH"] = str(REPO)
    # The host's python runs it: standard library only (-S: no site-packages).
    return subprocess.run([sys.executable, "-S", "-m", "sgdeploy.models", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, check=False, timeout=120)


# --------------------------------------------------------------------------------------------------
# File selection


def test_selection_keeps_what_a_model_needs_and_skips_the_rest():
    siblings = [{"rfilename": n} for n in hub_standin.tiny_model_files()]
    chosen = {s["rfilename"] for s in models.select_files(siblings)}
    assert chosen == WANTED


def test_bin_weights_only_when_there_are_no_safetensors():
    names = ["config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
             "pytorch_model.bin.index.json", "original/params.json", "tokenizer.model"]
    chosen = {s["rfilename"] for s in models.select_files([{"rfilename": n} for n in names])}
    assert chosen == {"config.json", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
                      "pytorch_model.bin.index.json", "tokenizer.model"}


def test_allow_patterns_replace_the_default_selection():
    siblings = [{"rfilename": n} for n in ("config.json", "model.safetensors", "README.md", "sub/x.safetensors")]
    chosen = [s["rfilename"] for s in models.select_files(siblings, ["*.json", "sub/*"])]
    assert chosen == ["config.json", "sub/x.safetensors"]


def test_local_folders_follow_the_layout():
    assert (models.local_dir("hf", repo="Qwen/Qwen3.6-27B", revision="abc")
            == "/var/lib/sglang/models/Qwen--Qwen3.6-27B/abc")
    assert models.local_dir("path", path="/mnt/m") == "/mnt/m"
    assert models.local_dir("controller", name="tiny", version="v1") == "/var/lib/sglang/models/tiny/v1"


# --------------------------------------------------------------------------------------------------
# Fetch, marker, resume


def test_fetch_places_verified_files_and_a_marker_then_transfers_nothing(hub, tmp_path):
    dest = tmp_path / "models" / "lab-org--Tiny-Qwen3.6" / "main"
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    files = hub_standin.tiny_model_files()
    wanted_bytes = sum(len(files[n]) for n in WANTED)
    assert result["changed"] is True and result["bytes_downloaded"] == wanted_bytes == hub.bytes_served
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == WANTED | {models.MARKER}
    for name in WANTED:
        assert (dest / name).read_bytes() == files[name], name
    marker = json.loads((dest / models.MARKER).read_text())
    assert marker["repo"] == "lab-org/Tiny-Qwen3.6" and marker["revision"] == "main" and marker["commit"] == COMMIT
    assert {f["name"]: f["size"] for f in marker["files"]} == {n: len(files[n]) for n in WANTED}
    assert not (dest.parent / "main.incomplete").exists()
    # Second run: the marker matches the hub's file list, nothing is downloaded.
    hub.reset_counters()
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["changed"] is False
    assert hub.bytes_served == 0
    assert all("/resolve/" not in path for _m, path, _r in hub.requests)


def test_a_pinned_commit_already_in_place_needs_no_hub(hub, tmp_path):
    dest = tmp_path / "m"
    args = ("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", COMMIT, "--dest", str(dest))
    assert run_models(*args, "--endpoint", hub.url).returncode == 0
    # The hub is gone: a complete folder for a commit hash is enough (offline redeploys).
    proc = run_models(*args, "--endpoint", "http://127.0.0.1:9", "--timeout", "2")
    assert proc.returncode == 0 and json.loads(proc.stdout)["changed"] is False, proc.stderr
    item = {"role": "model", "source": "hf", "repo": "lab-org/Tiny-Qwen3.6", "revision": COMMIT, "local_dir": str(dest)}
    assert models.plan([item], models.Hub("http://127.0.0.1:9", timeout=2))[0]["action"] == "none"
    # A branch name can move: the hub is asked, and an unreachable hub is an error.
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", "http://127.0.0.1:9", "--timeout", "2")
    assert proc.returncode == 1 and "cannot reach" in proc.stderr


def test_a_file_changed_on_disk_is_fetched_again(hub, tmp_path):
    dest = tmp_path / "m"
    assert run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url).returncode == 0
    (dest / "model.safetensors").write_bytes(b"truncated")
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 0 and json.loads(proc.stdout)["changed"] is True
    assert (dest / "model.safetensors").read_bytes() == hub_standin.tiny_model_files()["model.safetensors"]


def test_a_cut_download_resumes_with_a_range_request(hub, tmp_path):
    dest = tmp_path / "m"
    weights = hub_standin.tiny_model_files()["model.safetensors"]
    cut = len(weights) // 2
    hub.cut_after = cut
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url, "--retries", "0")
    assert proc.returncode == 1
    assert "model.safetensors" in proc.stderr and "run again to resume" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not dest.exists()  # nothing half-done is ever in place
    part = tmp_path / "m.incomplete" / "model.safetensors.part"
    assert part.stat().st_size == cut
    hub.reset_counters()
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    ranges = [r for _m, path, r in hub.requests if path.endswith("model.safetensors")]
    assert ranges == [f"bytes={cut}-"]
    assert (dest / "model.safetensors").read_bytes() == weights
    # Only the rest of the cut file and the files not yet fetched came over the wire.
    files = hub_standin.tiny_model_files()
    fetched_before = sum(len(files[n]) for n in WANTED if n < "model.safetensors")  # fetched in sorted order
    assert hub.bytes_served == sum(len(files[n]) for n in WANTED) - fetched_before - cut


def test_a_cut_is_resumed_within_one_run_by_the_retries(hub, tmp_path):
    hub.cut_after = 1000
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest",
                      str(tmp_path / "m"), "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    assert "resuming" in proc.stderr
    assert any(r == "bytes=1000-" for _m, _p, r in hub.requests)


def test_a_corrupt_file_fails_its_checksum_and_is_not_installed(hub, tmp_path):
    dest = tmp_path / "m"
    stage = tmp_path / "m.incomplete"
    stage.mkdir()
    weights = hub_standin.tiny_model_files()["model.safetensors"]
    (stage / "model.safetensors.part").write_bytes(b"X" * 100)  # a bad start, resumed with Range
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 1 and "checksum mismatch" in proc.stderr, proc.stderr
    assert not dest.exists() and not (stage / "model.safetensors.part").exists()
    proc = run_models("fetch", "--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main", "--dest", str(dest),
                      "--endpoint", hub.url)
    assert proc.returncode == 0 and (dest / "model.safetensors").read_bytes() == weights


# --------------------------------------------------------------------------------------------------
# Errors: one line, naming the thing, non-zero exit, no traceback


@pytest.mark.parametrize("args,token,code,fragments", [
    (["--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main"], None, 1,
     ["401", "no token was sent", "sglang_models_hf_token"]),
    (["--repo", "lab-org/Tiny-Qwen3.6", "--revision", "main"], "wrong", 1, ["401", "refused"]),
    (["--repo", "lab-org/Nope", "--revision", "main"], TOKEN, 1, ["lab-org/Nope@main", "RepoNotFound"]),
    (["--repo", "lab-org/Tiny-Qwen3.6", "--revision", "v9"], TOKEN, 1, ["lab-org/Tiny-Qwen3.6@v9", "RevisionNotFound"]),
    (["--repo", "no-slash", "--revision", "main"], TOKEN, 2, ["--repo", "'no-slash'", "ORG/NAME"]),
    (["--repo", "a/b", "--revision", "refs/pr/1"], TOKEN, 2, ["--revision", "commit hash, branch or tag"]),
])
def test_errors_are_one_line(hub, tmp_path, args, token, code, fragments):
    proc = run_models("fetch", *args, "--dest", str(tmp_path / "m"), "--endpoint", hub.url, token=token)
    assert proc.returncode == code, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.incomplete").exists()
    assert TOKEN not in proc.stderr + proc.stdout


def test_unreachable_hub_names_the_endpoint(tmp_path):
    proc = run_models("fetch", "--repo", "a/b", "--revision", "main", "--dest", str(tmp_path / "m"),
                      "--endpoint", "http://127.0.0.1:9", "--timeout", "5")
    assert proc.returncode == 1 and "cannot reach http://127.0.0.1:9" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------------
# Plan: every model checked, disk space first, nothing changed


def test_plan_fails_on_disk_space_naming_model_size_and_space_left(hub, tmp_path):
    hub.add_repo("lab-org/Huge", hub_standin.tiny_model_files(extras=False), branches=("main",),
                 fake_sizes={"model.safetensors": 10**16})
    dest = tmp_path / "models" / "lab-org--Huge" / "main"
    items = [{"role": "model", "source": "hf", "repo": "lab-org/Huge", "revision": "main", "local_dir": str(dest)}]
    proc = run_models("plan", "--models-json", json.dumps(items), "--endpoint", hub.url)
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert "not enough disk for model lab-org/Huge@main (10.0 PB" in line and "free on the filesystem of" in line
    assert "nothing was changed" in line and len(line.splitlines()) == 1
    assert not (tmp_path / "models").exists()
    assert not any("/resolve/" in p for _m, p, _r in hub.requests)


def test_plan_counts_model_and_drafter_together_against_min_free(hub, tmp_path):
    import shutil

    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    items = [{"role": "model", "source": "hf", "repo": "lab-org/Tiny-Qwen3.6", "revision": "main",
              "local_dir": str(tmp_path / "a")}]
    ok = run_models("plan", "--models-json", json.dumps(items), "--endpoint", hub.url, "--min-free-gb", "0")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["models"][0]["action"] == "fetch"
    too_much = run_models("plan", "--models-json", json.dumps(items), "--endpoint", hub.url,
                          "--min-free-gb", f"{free_gb + 1:.1f}")
    assert too_much.returncode == 1 and "keeping" in too_much.stderr


def test_plan_checks_a_path_source(tmp_path):
    good = tmp_path / "shared" / "m"
    good.mkdir(parents=True)
    (good / "config.json").write_text("{}")
    empty = tmp_path / "empty"
    empty.mkdir()
    item = {"role": "drafter", "source": "path", "local_dir": str(good)}
    ok = run_models("plan", "--models-json", json.dumps([item]))
    assert ok.returncode == 0 and json.loads(ok.stdout)["models"][0]["action"] == "none"
    for folder, why in ((tmp_path / "absent", "no such folder"), (empty, "no config.json")):
        proc = run_models("plan", "--models-json",
                          json.dumps([{"role": "drafter", "source": "path", "local_dir": str(folder)}]))
        assert proc.returncode == 1 and f"drafter path {folder}" in proc.stderr and why in proc.stderr


# --------------------------------------------------------------------------------------------------
# Controller copies: digest, pack, finish


def test_controller_copy_digest_pack_finish(tmp_path):
    src = tmp_path / "tiny-qwen3.6"
    hub_standin.write_model(src, hub_standin.tiny_model_files(extras=False))
    sha, total, _files = models.folder_digest(src)
    tar = tmp_path / "cache" / "tiny.tar"
    assert models.pack(src, tar) is True and models.pack(src, tar) is False
    stage = tmp_path / "host" / "tiny-qwen3.6" / (sha[:16] + models.STAGE_SUFFIX)
    stage.mkdir(parents=True)
    import tarfile

    with tarfile.open(tar) as t:
        t.extractall(stage, filter="data")
    dest = tmp_path / "host" / "tiny-qwen3.6" / sha[:16]
    models.finish(stage, dest, sha, "tiny-qwen3.6", owner=None)
    assert models.marker_matches_controller(dest, sha) and not stage.exists()
    assert models.folder_digest(dest)[0] == sha  # the marker is not part of the digest
    # A changed copy is refused, not installed.
    stage.mkdir()
    (stage / "config.json").write_text("{}")
    with pytest.raises(models.ModelError, match="does not match the controller folder"):
        models.finish(stage, tmp_path / "other", sha, "tiny-qwen3.6", owner=None)
    assert not (tmp_path / "other").exists()
    # The plan sees the copy as complete.
    item = {"role": "model", "source": "controller", "name": "tiny-qwen3.6", "sha": sha, "bytes": total,
            "version": sha[:16], "local_dir": str(dest)}
    assert models.plan([item], None)[0]["action"] == "none"
    assert models.plan([dict(item, sha="0" * 64)], None)[0]["action"] == "copy"


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
    keep = models.folders_in_use(state, units) | {str(root / "org--a" / "rev3")}
    removed = models.prune(root, keep)
    assert sorted(removed) == [str(root / "org--a" / "rev1"), str(root / "org--b" / "main.incomplete")]
    for kept in ("org--a/rev2", "org--a/rev3", "tiny/abc"):
        assert (root / kept).is_dir(), kept
    assert not (root / "org--b").exists()
