"""The patched wheel build, against the real pristine SGLang 0.5.23 wheel.

The pristine wheel lands in build/downloads once per session (copied from /tmp/whl when a copy is
there, else downloaded and checked against patches/sglang/upstream.yml). The series here is a small
synthetic one written against files of that wheel (two diffs and a src/ file); the real series is
checked to apply in order, to keep its diffs small and to add its new files from src/.
"""

from __future__ import annotations

import ast
import base64
import csv
import difflib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from sgdeploy import patchset, wheel

REPO = Path(__file__).resolve().parents[3]
PINS = wheel.load_pins()
PIN = PINS.for_python("3.11")
README = "sglang/README.md"
PROBE = "sglang/srt/sgdeploy_probe.py"


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def downloads() -> Path:
    d = wheel.DEFAULT_DOWNLOADS
    target = d / PIN.file
    local = Path("/tmp/whl") / PIN.file
    if not target.is_file() and local.is_file():
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)
    wheel.fetch_upstream(PINS, PIN, d, log=quiet)
    return d


@pytest.fixture(scope="session")
def pristine_readme(downloads) -> str:
    with zipfile.ZipFile(downloads / PIN.file) as zf:
        return zf.read(README).decode()


def udiff(path: str, old: str, new: str) -> bytes:
    if not old:
        body = "".join(f"+{ln}" for ln in new.splitlines(True))
        return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(new.splitlines())} @@\n{body}".encode()
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")).encode()


def write_synthetic(d: Path, readme: str) -> Path:
    """0001 (ddtree) adds a README line; 0002 (fork) edits that line (so order matters); src/ adds a file."""
    d.mkdir(parents=True, exist_ok=True)
    lines = readme.splitlines(True)
    one = "".join([lines[0], "DDTREE PATCHED\n", *lines[1:]])
    two = one.replace("DDTREE PATCHED\n", "DDTREE PATCHED + FORK\n")
    (d / "0001-ddtree.patch").write_bytes(b"Header: what, why.\n\n" + udiff(README, readme, one))
    (d / "0002-fork.patch").write_bytes(udiff(README, one, two))
    (d / "src" / PROBE).parent.mkdir(parents=True)
    (d / "src" / PROBE).write_text("FORK = True\n")
    (d / "series").write_text("# synthetic\n0001-ddtree.patch ddtree\n0002-fork.patch fork\n")
    return d


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, pristine_readme) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("patches"), pristine_readme)


@pytest.fixture(scope="module")
def built(tmp_path_factory, synthetic, downloads) -> wheel.BuildResult:
    out = tmp_path_factory.mktemp("wheels")
    return wheel.build(patchset.select(["ddtree", "fork"], synthetic), "3.11", out, downloads, pins=PINS, log=quiet)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sgdeploy.wheel", *args],
        cwd=REPO, capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip


def test_build_carries_label_in_name_and_version(built, synthetic):
    label = patchset.release_label(patchset.select(["ddtree", "fork"], synthetic))
    assert built.built and built.label == label
    assert built.wheel.name == f"sglang-0.5.23+{label}-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert built.version == f"0.5.23+{label}"
    assert built.patches == ("0001-ddtree.patch", "0002-fork.patch")
    assert built.features == ("ddtree", "fork")
    assert wheel.sha256_file(built.wheel) == built.sha256
    # Nothing but the wheel and its recorded sha256 in the output directory (no temp files left behind).
    assert sorted(p.name for p in built.wheel.parent.iterdir()) == [built.wheel.name, built.wheel.name + ".sha256"]


def test_record_hashes_verify(built):
    with zipfile.ZipFile(built.wheel) as zf:
        names = zf.namelist()
        info = f"sglang-{built.version}.dist-info"
        assert names[-1] == f"{info}/RECORD"
        rows = list(csv.reader(io.StringIO(zf.read(f"{info}/RECORD").decode())))
        assert {r[0] for r in rows} == set(names)
        for name, digest, size in rows:
            if name.endswith("/RECORD"):
                assert digest == size == ""
                continue
            data = zf.read(name)
            b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={b64}", name
            assert int(size) == len(data), name
        meta = zf.read(f"{info}/METADATA").decode()
        assert f"\nVersion: {built.version}\n" in meta
        assert not any(n.startswith("sglang-0.5.23.dist-info/") for n in names)
        assert {i.date_time for i in zf.infolist()} == {wheel.ZIP_DATE}


def test_wheel_installs_and_reports_patched_version(built, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--no-index",
         "--target", str(target), str(built.wheel)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "RECORD" not in proc.stderr, proc.stderr
    # What an installer and `pip show` see (without importing sglang, whose __init__ needs torch).
    probe = "import importlib.metadata as m; print(m.version('sglang'))"
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == built.version
    assert f"__version__ = version = '{built.version}'" in (target / "sglang/_version.py").read_text()
    assert (target / PROBE).read_text() == "FORK = True\n"
    readme = (target / README).read_text()
    assert "DDTREE PATCHED + FORK\n" in readme and "DDTREE PATCHED\n" not in readme


def test_second_build_is_skipped(built, synthetic):
    before = built.wheel.stat().st_mtime_ns
    args = ["--features", "ddtree,fork", "--patches-dir", str(synthetic), "--out", str(built.wheel.parent)]
    people = cli(*args)
    assert people.returncode == 0, people.stderr
    assert "up to date" in people.stdout and str(built.wheel) in people.stdout
    machine = cli(*args, "--json")
    assert machine.returncode == 0, machine.stderr
    doc = json.loads(machine.stdout)
    assert doc == {
        "wheel": str(built.wheel), "label": built.label, "version": built.version, "python": "3.11",
        "features": ["ddtree", "fork"], "patches": ["0001-ddtree.patch", "0002-fork.patch"],
        "sha256": built.sha256, "built": False,
    }  # fmt: skip
    assert built.wheel.stat().st_mtime_ns == before


@pytest.mark.slow  # several seconds: `make test-slow`
def test_same_inputs_give_the_same_bytes(built, synthetic, downloads, tmp_path):
    again = wheel.build(
        patchset.select(["ddtree", "fork"], synthetic), "3.11", tmp_path, downloads, pins=PINS, log=quiet
    )
    assert again.built and again.wheel != built.wheel
    assert again.sha256 == built.sha256


@pytest.mark.parametrize("damage", ["context", "garbage"])
def test_patch_that_does_not_apply_fails_with_name_and_file(synthetic, tmp_path, damage):
    bad = tmp_path / "patches"
    shutil.copytree(synthetic, bad)
    fork = bad / "0002-fork.patch"
    text = fork.read_text()
    if damage == "context":
        # Change a context line of the README hunk: the patch no longer matches the file.
        text = text.replace("\n DDTREE PATCHED", "\n DDTREE PATCHEX", 1).replace(
            "\n-DDTREE PATCHED\n", "\n-DDTREE PATCHEX\n", 1
        )
    else:
        text = text.replace("@@ -1,", "@@ -1,x", 1)
    assert text != fork.read_text()
    fork.write_text(text)
    out = tmp_path / "wheels"
    proc = cli("--features", "ddtree,fork", "--patches-dir", str(bad), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "0002-fork.patch" in err[0] and README in err[0], err[0]
    assert not out.exists() or not any(out.iterdir())


def test_src_file_over_an_upstream_file_fails_naming_it(synthetic, tmp_path):
    bad = tmp_path / "patches"
    shutil.copytree(synthetic, bad)
    (bad / "src" / README).write_text("mine\n")
    out = tmp_path / "wheels"
    proc = cli("--features", "ddtree", "--patches-dir", str(bad), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"src/{README} would overwrite upstream file {README}" in err[0], err[0]
    assert not out.exists() or not any(out.iterdir())


def test_diff_that_adds_a_file_fails_naming_patch_and_file(synthetic, tmp_path):
    bad = tmp_path / "patches"
    shutil.copytree(synthetic, bad)
    new = "sglang/srt/sgdeploy_new.py"
    with open(bad / "0002-fork.patch", "ab") as fh:
        fh.write(udiff(new, "", "X = 1\n"))
    proc = cli("--features", "ddtree", "--patches-dir", str(bad), "--out", str(tmp_path / "wheels"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "patch 0002-fork.patch (fork) edits " + new in err[0], err[0]
    assert "src" in err[0]


def test_hash_mismatch_names_expected_and_actual(downloads, tmp_path):
    index = tmp_path / "simple" / "sglang"
    index.mkdir(parents=True)
    try:
        os.link(downloads / PIN.file, index / PIN.file)
    except OSError:
        shutil.copyfile(downloads / PIN.file, index / PIN.file)
    (index / "index.html").write_text(f'<html><body><a href="{PIN.file}">{PIN.file}</a></body></html>\n')
    wrong = "0" * 64
    pins = wheel.Pins(PINS.path, PINS.package, PINS.version, {"3.11": wheel.Pin("3.11", PIN.file, wrong)})
    cache = tmp_path / "downloads"
    with pytest.raises(wheel.BuildError) as exc:
        wheel.fetch_upstream(pins, pins.wheels["3.11"], cache, f"file://{tmp_path / 'simple'}", log=quiet)
    msg = str(exc.value)
    assert f"expected {wrong}" in msg and f"got {PIN.sha256}" in msg and PIN.file in msg
    assert not (cache / PIN.file).exists()
    # The same local index with the right pin downloads and keeps the file.
    got = wheel.fetch_upstream(PINS, PIN, cache, f"file://{tmp_path / 'simple'}", log=quiet)
    assert got == cache / PIN.file and wheel.sha256_file(got) == PIN.sha256


def test_cached_download_is_reused_without_the_index(downloads):
    got = wheel.fetch_upstream(PINS, PIN, downloads, "file:///nonexistent/simple", log=quiet)
    assert got == downloads / PIN.file


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--features", "ddtree", "--python", "3.10"], "--python 3.10: no pinned sglang 0.5.23 wheel"),
        (["--features", "ddtree,speed"], "unknown patch feature 'speed' (allowed: ddtree, fork, topk)"),
        (["--config", "no-such-config-h6"], "no-such-config-h6"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, needle, tmp_path):
    proc = cli(*args, "--out", str(tmp_path / "w"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_real_series_applies_in_order_to_the_pristine_wheel(downloads):
    series_file = patchset.DEFAULT_PATCHES_DIR / "series"
    if not series_file.is_file():
        pytest.skip("patches/sglang/series is not written yet")
    series = patchset.load()
    if not series.patches:
        pytest.skip("patches/sglang/series lists no patches yet")
    applied = []
    src = patchset.src_files(series.src_dir)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(downloads / PIN.file) as zf:
        upstream = set(zf.namelist())
        entries = wheel.patch_tree(zf, list(series.patches), Path(tmp), log=applied.append, src=src)
        changed = sorted(n for n, e in entries.items() if e.path is not None and n in upstream)
    assert applied[:-1] == [f"applied {p.name} ({p.feature})" for p in series.patches]
    assert changed, "the series changes no file"
    # Every new file comes from src/ at its package path, and none of them replaces an upstream file.
    assert "sglang/srt/speculative/ddtree_tree.py" in {n for n, _ in src}
    assert all(entries[n].path == path for n, path in src) and not {n for n, _ in src} & upstream


def test_real_diffs_are_small_with_headers_and_edit_only_upstream_files(downloads):
    series = patchset.load()
    with zipfile.ZipFile(downloads / PIN.file) as zf:
        upstream = set(zf.namelist())
    added = 0
    for p in series.patches:
        text = p.path.read_text()
        head = text[: text.index("diff --git ")]
        assert "What" in head and "Why" in head and "What holds" in head, f"{p.name}: header lacks what/why/holds"
        assert "new file mode" not in text and "--- /dev/null" not in text, f"{p.name} creates a file"
        assert wheel.touched_paths([p]) <= upstream, p.name
        added += sum(1 for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    assert 0 < added <= 600, f"the diffs add {added} lines (at most 600)"
    # Every src file starts with a docstring that says it is a new file of the series.
    for rel, path in patchset.src_files(series.src_dir):
        if rel.endswith(".py"):
            head = path.read_text().split('"""')[1] if path.read_text().startswith('"""') else ""
            assert "New file of the sgdeploy patch series" in " ".join(head.split()), rel


@pytest.mark.slow  # several seconds: `make test-slow`
def test_patch_work_and_patch_diff_round_trip(synthetic, downloads, tmp_path):
    """make patch-work / patch-diff: the tree is pristine + src + the series up to the patch; an edit
    there comes back as that patch (header kept) and the build then applies it."""
    from sgdeploy import patchwork

    d = tmp_path / "patches"
    shutil.copytree(synthetic, d)
    series, work = patchset.load(d), tmp_path / "work"
    before = (d / "0001-ddtree.patch").read_bytes()
    tree = patchwork.work(series, "0001-ddtree", "3.11", work, downloads, pins=PINS, log=quiet)
    readme = (tree / README).read_text()
    assert "DDTREE PATCHED\n" in readme and "FORK" not in readme  # 0001 only
    assert (tree / PROBE).read_text() == "FORK = True\n"  # src laid over
    # Nothing edited: the patch comes back with the same effect (difflib writes its own hunk header).
    patchwork.diff(series, "0001-ddtree.patch", work, downloads, pins=PINS, log=quiet)
    again = (d / "0001-ddtree.patch").read_bytes()
    assert again.startswith(b"Header: what, why.\n\ndiff --git ") and again.split(b"@@")[2:] == before.split(b"@@")[2:]
    (tree / README).write_text(readme + "AND EDITED\n")  # away from 0002's context
    patchwork.diff(series, "0001-ddtree", work, downloads, pins=PINS, log=quiet)
    text = (d / "0001-ddtree.patch").read_text()
    assert text.startswith("Header: what, why.\n\ndiff --git a/sglang/README.md b/sglang/README.md\n"), text[:200]
    assert "+DDTREE PATCHED\n" in text and "+AND EDITED\n" in text
    built = wheel.build(patchset.select(["ddtree"], d), "3.11", tmp_path / "w", downloads, pins=PINS, log=quiet)
    with zipfile.ZipFile(built.wheel) as zf:
        got = zf.read(README).decode()
        assert "DDTREE PATCHED + FORK\n" in got and got.endswith("AND EDITED\n")
    # The tree holds 0001: writing 0002 from it is refused, and so is a new file in the tree.
    with pytest.raises(wheel.BuildError, match=r"holds 0001-ddtree.patch, not 0002-fork.patch: run `make patch-work"):
        patchwork.diff(series, "0002-fork", work, downloads, pins=PINS, log=quiet)
    (tree / "sglang" / "brand_new.py").write_text("X = 1\n")
    with pytest.raises(wheel.BuildError, match=r"brand_new.py is a new file: put it in .*/src/sglang/brand_new.py"):
        patchwork.diff(series, "0001-ddtree", work, downloads, pins=PINS, log=quiet)


def test_a_wheel_changed_after_its_build_is_refused_naming_both_digests(built, synthetic, tmp_path):
    """Issue 34 item 5: the build records the wheel's sha256 next to it; a changed wheel is not used."""
    out = tmp_path / "wheels"
    out.mkdir()
    copy = out / built.wheel.name
    copy.write_bytes(built.wheel.read_bytes())
    (out / (built.wheel.name + ".sha256")).write_text(built.sha256 + "\n")
    args = ["--features", "ddtree,fork", "--patches-dir", str(synthetic), "--out", str(out), "--json"]
    ok = cli(*args)
    assert ok.returncode == 0 and json.loads(ok.stdout)["sha256"] == built.sha256, ok.stderr
    with copy.open("ab") as f:
        f.write(b"\0")
    tampered = wheel.sha256_file(copy)
    bad = cli(*args)
    assert bad.returncode == 1 and bad.stdout == ""
    line = bad.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert str(copy) in line and tampered in line and built.sha256 in line and "recorded at its build" in line


def test_a_build_records_the_wheels_sha256_next_to_it(built):
    assert (built.wheel.parent / (built.wheel.name + ".sha256")).read_text().strip() == built.sha256


def _series_python_files() -> list[tuple[str, Path]]:
    return [(rel, path) for rel, path in patchset.src_files(patchset.load().src_dir) if rel.endswith(".py")]


KERNELS_PACKAGE = "sglang/kernels/ops/speculative/ddtree/"


def test_series_kernels_live_with_upstreams_speculative_kernels():
    """Every Triton/Gluon kernel of the series is in sglang/kernels/ops/speculative/ddtree/, where 0.5.23 keeps
    its speculative kernels (docs/build.md, "Where the series' files live"); the host side imports no
    triton.language."""
    kernels = {}
    for rel, path in _series_python_files():
        tree = ast.parse(path.read_text())
        jit = [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and any("jit" in ast.unparse(d) and ("triton" in ast.unparse(d) or "gluon" in ast.unparse(d))
                    for d in node.decorator_list)
        ]  # fmt: skip
        if jit:
            kernels[rel] = jit
        if not rel.startswith(KERNELS_PACKAGE):
            assert "triton.language" not in path.read_text(), f"{rel}: a kernel outside {KERNELS_PACKAGE}"
    assert kernels and all(rel.startswith(KERNELS_PACKAGE) for rel in kernels), sorted(kernels)
    assert sum(map(len, kernels.values())) == 18, kernels


# The private upstream names the series still imports, each with no public seam in 0.5.23 (docs/build.md,
# "Upstream seams"): a new one must be argued there first.
PRIVATE_UPSTREAM_NAMES = {"_prepare_dflash_draft_block_unchecked", "_resolve_dflash_embedding_module"}


def test_series_imports_no_other_private_upstream_name():
    ours = {rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for rel, _ in _series_python_files()}
    private = {}
    for rel, path in _series_python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if module.startswith("sglang") and module not in ours:
                for alias in node.names:
                    if alias.name.startswith("_"):
                        private.setdefault(alias.name, []).append(rel)
    for p in patchset.load().patches:  # and none in the diffs' added lines
        for line in p.path.read_text().splitlines():
            if line.startswith("+") and not line.startswith("+++") and "import" in line:
                for name in line.replace(",", " ").replace("(", " ").split():
                    if name.startswith("_") and not name.startswith("__"):
                        private.setdefault(name, []).append(p.name)
    assert set(private) == PRIVATE_UPSTREAM_NAMES, private
