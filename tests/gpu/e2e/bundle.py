"""Prepare what the end-to-end harness carries to the GPU machine (development machine, registry reachable).

    .venv/bin/python tests/gpu/e2e/bundle.py [--out .gpu-e2e]        (make gpu-server-bundle)

Writes into OUT (an ignored folder of the checkout: .git/info/exclude lists /.gpu-e2e/; the device call
names it in ``carry``), all under the 64 MiB carry limit:

- ``sglang-base.tar.xz``: the full patched cp312 wheel (``sgdeploy.wheel --features ddtree,fork,topk
  --python 3.12``), unpacked and trimmed of what the server never imports (``multimodal_gen/``,
  ``test/``, the ``_bench`` / ``_grpc`` / ``_multimodal`` Rust extensions);
- ``overlay-<key>.tar.xz`` + ``overlay-<key>.json`` per other release a plan needs (``stock``, ``ddtree``,
  ...): the files in which that wheel differs from the base, and the files it lacks; run.sh rebuilds
  each release folder as base + overlay (a few hundred kB instead of 16 MB each);
- ``sgl_kernel_046_sm90.tar.xz``: sglang-kernel 0.4.6's Python files and ``sm90/common_ops`` only (the
  newest release whose common_ops loads against torch 2.11; ``flash_ops`` is FA3, unused with triton);
- ``wheels/``: the pure-Python and small wheels the server imports that the GPU image lacks
  (``requirements-device.txt``), downloaded with pip for CPython 3.12 manylinux;
- ``flashinfer_standin.tar.xz``: TEST EQUIPMENT, flashinfer-python 0.7.2's ``data/include`` headers (for
  SGLang's JIT kernels), the empty folders its ``deps.py`` checks, and ``flashinfer_standin/*.py``;
- ``plan-core.json``, ``plan-extra.json``: the servers and their rendered flags (plan.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))

import plan  # noqa: E402

CARRY_LIMIT = 64 << 20
BASE_FEATURES = ("ddtree", "fork", "topk")
TRIM = ("sglang/multimodal_gen", "sglang/test")
TRIM_PREFIXES = ("sglang/srt/rust_extensions/_bench", "sglang/srt/rust_extensions/_grpc",
                 "sglang/srt/rust_extensions/_multimodal")
SGL_KERNEL = "sglang-kernel==0.4.6"
SGL_KERNEL_SKIP = ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops", "sgl_kernel/sm100/",
                   "triton_kernels/")
FLASHINFER = "flashinfer-python==0.7.2"
FLASHINFER_EMPTY = ("flashinfer/data/csrc", "flashinfer/data/cutlass/include", "flashinfer/data/cutlass/tools/util/include",
                    "flashinfer/data/spdlog/include")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64")


def pip_download(dest: Path, *what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, *what], check=True)


def build_wheel(features: tuple[str, ...] | list[str]) -> Path:
    out = subprocess.run([sys.executable, "-m", "sgdeploy.wheel", "--features", ",".join(features), "--python",
                          "3.12", "--json"], cwd=REPO, check=True, capture_output=True, text=True)
    return Path(json.loads(out.stdout.strip().splitlines()[-1])["wheel"])


def kept(name: str) -> bool:
    return not (any(name == t or name.startswith(t + "/") for t in TRIM) or name.startswith(TRIM_PREFIXES))


def wheel_files(wheel: Path) -> dict[str, str]:
    """{path: sha256} of the files a trimmed install of ``wheel`` holds (its .dist-info excluded)."""
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir() or ".dist-info/" in info.filename or not kept(info.filename):
                continue
            out[info.filename] = hashlib.sha256(z.read(info)).hexdigest()
    return out


def overlay(base: dict[str, str], other: dict[str, str]) -> tuple[list[str], list[str]]:
    """(files to write from ``other``, files to delete from the base) so that base + overlay = other."""
    changed = sorted(p for p, h in other.items() if base.get(p) != h)
    removed = sorted(p for p in base if p not in other)
    return changed, removed


def _xz(out: Path, root: Path, names: list[str]) -> None:
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for n in names:
            tar.add(root / n, arcname=n)


def make_base(wheel: Path, out: Path, work: Path) -> None:
    tree = work / "base"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tree)
    for t in TRIM:
        shutil.rmtree(tree / t, ignore_errors=True)
    for p in (tree / "sglang/srt/rust_extensions").glob("*"):
        if any(str(p.relative_to(tree)).startswith(x) for x in TRIM_PREFIXES):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    _xz(out / "sglang-base.tar.xz", tree, sorted(x.name for x in tree.iterdir()))


def make_overlay(key: str, base_wheel: Path, wheel: Path, out: Path, work: Path) -> dict:
    changed, removed = overlay(wheel_files(base_wheel), wheel_files(wheel))
    tree = work / f"ov-{key}"
    with zipfile.ZipFile(wheel) as z:
        for n in changed:
            z.extract(n, tree)
    tree.mkdir(parents=True, exist_ok=True)
    _xz(out / f"overlay-{key}.tar.xz", tree, changed)
    meta = {"wheel": wheel.name, "changed": changed, "removed": removed}
    (out / f"overlay-{key}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def fetch_part(requirement: str, pattern: str, dest: Path, work: Path, keep) -> None:
    """pip-download one wheel (``pattern`` globs its file name) and extract the members ``keep(name)`` accepts."""
    dl = work / f"dl-{dest.name}"
    pip_download(dl, requirement)
    with zipfile.ZipFile(next(dl.glob(pattern))) as z:
        for info in z.infolist():
            if keep(info.filename):
                z.extract(info, dest)


def make_sgl_kernel(out: Path, work: Path) -> None:
    tree = work / "sk046"
    fetch_part(SGL_KERNEL, "sglang_kernel-0.4.6-*.whl", tree, work, lambda n: not n.startswith(SGL_KERNEL_SKIP))
    _xz(out / "sgl_kernel_046_sm90.tar.xz", tree, sorted(x.name for x in tree.iterdir()))


def make_flashinfer_standin(out: Path, work: Path) -> None:
    tree = work / "fi-standin"
    fetch_part(FLASHINFER, "flashinfer_python-0.7.2-*.whl", tree, work,
               lambda n: n.startswith("flashinfer/data/include/"))
    for d in FLASHINFER_EMPTY:
        (tree / d).mkdir(parents=True, exist_ok=True)
    for f in (HERE / "flashinfer_standin").glob("*.py"):
        shutil.copy(f, tree / "flashinfer" / f.name)
    _xz(out / "flashinfer_standin.tar.xz", tree, ["flashinfer"])


def ensure_ignored(out: Path) -> None:
    """The bundle must not be committed, and travels only when a device call names it in ``carry``."""
    if subprocess.run(["git", "check-ignore", "-q", str(out)], cwd=REPO, check=False).returncode == 0:
        return
    exclude = REPO / ".git" / "info" / "exclude"
    if not exclude.parent.is_dir():
        raise SystemExit(f"{out}: not ignored by git and {exclude.parent} does not exist; ignore it by hand")
    rel = out.resolve().relative_to(REPO)
    with exclude.open("a") as f:
        f.write(f"/{rel}/\n")
    print(f"added /{rel}/ to {exclude}")


def folder_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu-e2e")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    ensure_ignored(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpu-e2e-") as tmp:
        work = Path(tmp)
        base_wheel = build_wheel(BASE_FEATURES)
        make_base(base_wheel, out, work)
        base_key = plan.wheel_key(BASE_FEATURES)
        overlays = {}
        for key, features in sorted(plan.all_wheels().items()):
            if key != base_key:
                overlays[key] = make_overlay(key, base_wheel, build_wheel(features), out, work)
        make_sgl_kernel(out, work)
        make_flashinfer_standin(out, work)
        (out / "wheels").mkdir()
        pip_download(out / "wheels", "-r", str(HERE / "requirements-device.txt"))
    for name in plan.SETS:
        (out / f"plan-{name}.json").write_text(json.dumps(plan.build(name), indent=1) + "\n")
    (out / "base.json").write_text(json.dumps({"key": base_key, "wheel": base_wheel.name}) + "\n")
    size = folder_size(out)
    for key, meta in overlays.items():
        print(f"overlay {key}: {len(meta['changed'])} files changed, {len(meta['removed'])} removed")
    print(f"{out}: {size / 2**20:.1f} MiB (carry limit {CARRY_LIMIT >> 20} MiB with the working tree)")
    if size > CARRY_LIMIT - (4 << 20):
        print(f"{out}: {size / 2**20:.1f} MiB leaves too little of the {CARRY_LIMIT >> 20} MiB carry limit "
              "for the working tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
