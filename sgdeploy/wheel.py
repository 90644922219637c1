"""Build the patched SGLang wheel (one per series and target Python), or find the pristine one.

    python -m sgdeploy.wheel --config ddtree-b15 [--python 3.11] [--out build/wheels] [--json]
    python -m sgdeploy.wheel --features ddtree       # any feature: the patched series
    python -m sgdeploy.wheel --features ''           # the pristine wheel, label `stock`

Steps: decide patched or stock (patches/sglang/series), compute the release label, stop early when
`build/wheels/sglang-0.5.23+<label>-<tag>.whl` already exists; otherwise fetch the pinned upstream
wheel (patches/sglang/upstream.yml, sha256-checked) into build/downloads, lay the files of
patches/sglang/src/ over it (new files only), apply the diffs in series order (each one checked
before it is applied), set the version to `0.5.23+<label>`, regenerate RECORD and write a
deterministic zip atomically, with its sha256 recorded next to it (`<wheel>.sha256`). A wheel
found already built must still have that digest: one changed after its build is refused (the
deploy checks it again on the controller before the upload and on the host before the install).

Exit status: 0 built or up to date, 1 the build failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from sgdeploy import patchset
from sgdeploy.patchset import Patch, PatchSetError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PINS = REPO_ROOT / "patches" / "sglang" / "upstream.yml"
DEFAULT_PATCHES_DIR = REPO_ROOT / "patches" / "sglang"
DEFAULT_OUT = REPO_ROOT / "build" / "wheels"
DEFAULT_DOWNLOADS = REPO_ROOT / "build" / "downloads"
DEFAULT_PYTHON = "3.11"

ZIP_DATE = (1980, 1, 1, 0, 0, 0)
ZIP_LEVEL = 6
CHUNK = 1 << 20


class BuildError(Exception):
    """The build failed; the message is one line for people."""


class UsageError(Exception):
    """Bad arguments; the message is one line for people."""


@dataclass(frozen=True)
class Pin:
    python: str
    file: str
    sha256: str

    @property
    def tag(self) -> str:
        """`cp311-cp311-manylinux_2_34_x86_64` from the pinned file name."""
        return self.file[: -len(".whl")].split("-", 2)[2]

    @property
    def platform(self) -> str:
        return self.tag.rsplit("-", 1)[1]


@dataclass(frozen=True)
class Pins:
    path: Path
    package: str
    version: str
    wheels: dict[str, Pin]

    def for_python(self, python: str) -> Pin:
        if python not in self.wheels:
            raise UsageError(
                f"--python {python}: no pinned {self.package} {self.version} wheel in {self.path} "
                f"(allowed: {', '.join(sorted(self.wheels))})"
            )
        return self.wheels[python]


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    label: str
    version: str
    python: str
    features: tuple[str, ...]
    patches: tuple[str, ...]
    sha256: str
    built: bool

    def as_json(self) -> dict:
        return {
            "wheel": str(self.wheel),
            "label": self.label,
            "version": self.version,
            "python": self.python,
            "features": list(self.features),
            "patches": list(self.patches),
            "sha256": self.sha256,
            "built": self.built,
        }


def load_pins(path: Path | str = DEFAULT_PINS) -> Pins:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BuildError(f"cannot read wheel pins {path}: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict) or not isinstance(data.get("wheels"), dict):
        raise BuildError(f"{path}: expected keys 'package', 'version' and a 'wheels' mapping")
    package, version = str(data.get("package", "")), str(data.get("version", ""))
    if not package or not version:
        raise BuildError(f"{path}: 'package' and 'version' are required")
    wheels = {}
    for py, entry in data["wheels"].items():
        py = str(py)
        if not isinstance(entry, dict) or not {"file", "sha256"} <= set(entry):
            raise BuildError(f"{path}: wheels.{py}: expected 'file' and 'sha256'")
        file, sha = str(entry["file"]), str(entry["sha256"]).lower()
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise BuildError(f"{path}: wheels.{py}.sha256: {sha!r} is not 64 hex digits")
        if not file.startswith(f"{package}-{version}-") or not file.endswith(".whl"):
            raise BuildError(f"{path}: wheels.{py}.file: {file!r} is not a {package} {version} wheel")
        wheels[py] = Pin(python=py, file=file, sha256=sha)
    return Pins(path=path, package=package, version=version, wheels=wheels)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def wheel_name(pins: Pins, pin: Pin, label: str) -> str:
    return f"{pins.package}-{pins.version}+{label}-{pin.tag}.whl"


# --------------------------------------------------------------------------------------------------
# Upstream wheel


def fetch_upstream(
    pins: Pins,
    pin: Pin,
    downloads: Path,
    index_url: str | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """The pinned upstream wheel in `downloads`, downloaded unless a copy with the right hash is there."""
    target = downloads / pin.file
    if target.is_file():
        actual = sha256_file(target)
        if actual == pin.sha256:
            return target
        log(f"{target}: sha256 {actual} is not the pinned {pin.sha256}; downloading again")
        target.unlink()
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".download-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version", pin.python, "--platform", pin.platform,
            "--implementation", "cp", "--dest", tmp, f"{pins.package}=={pins.version}",
        ]  # fmt: skip
        if index_url:
            cmd[4:4] = ["--index-url", index_url]
        log(f"downloading {pins.package}=={pins.version} for Python {pin.python} ({pin.file})")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = Path(tmp) / pin.file
        if proc.returncode != 0 or not got.is_file():
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"pip did not produce {pin.file}"
            what = f"{pins.package}=={pins.version} (Python {pin.python})"
            raise BuildError(f"pip download {what} failed: {why}")
        actual = sha256_file(got)
        if actual != pin.sha256:
            raise BuildError(
                f"{pin.file}: sha256 mismatch: expected {pin.sha256} (pinned in {pins.path}), got {actual}"
            )
        os.replace(got, target)
    return target


# --------------------------------------------------------------------------------------------------
# Patching


def _tool() -> str:
    if shutil.which("git"):
        return "git"
    if shutil.which("patch"):
        return "patch"
    raise BuildError("neither git nor patch is installed: one of them is needed to apply the patches")


def _patch_files(patch: Patch) -> list[tuple[int, str]]:
    """(line number, file) of each file header in a unified diff."""
    out = []
    for n, line in enumerate(patch.read_bytes().decode("utf-8", "replace").splitlines(), start=1):
        m = re.match(r"^\+\+\+ (?:b/)?(\S+)", line) or re.match(r"^diff --git a/\S+ b/(\S+)", line)
        if m and m.group(1) != "/dev/null":
            out.append((n, m.group(1)))
    return out


def _failing_file(patch: Patch, output: str) -> str:
    """The file a failed `git apply`/`patch` run complains about."""
    for pattern in (
        r"patch failed: (\S+?):\d+",
        r"error: (\S+?): (?:does not exist in index|No such file|already exists|patch does not apply)",
        r"(?:checking|patching) file '?([^'\s]+)'?\n(?:.*\n)*?.*(?:FAILED|Reversed|malformed|ignored)",
        r"can't find file to patch.*\n.*\n\|.*?(\S+)",
    ):
        m = re.search(pattern, output)
        if m:
            return m.group(1)
    m = re.search(r"corrupt patch at line (\d+)|malformed patch at line (\d+)", output)
    headers = _patch_files(patch)
    if m:
        at = int(m.group(1) or m.group(2))
        before = [f for n, f in headers if n <= at]
        if before:
            return before[-1]
    return headers[0][1] if headers else "(no file header found)"


def apply_patches(root: Path, patches: Sequence[Patch], log: Callable[[str], None] = print) -> None:
    """Apply `patches` in order inside `root` (the unpacked wheel; paths are `-p1`)."""
    if not patches:
        return
    tool = _tool()
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent), LC_ALL="C")
    for p in patches:
        if tool == "git":
            check = ["git", "apply", "--check", "-p1", "--whitespace=nowarn", str(p.path)]
            apply = ["git", "apply", "-p1", "--whitespace=nowarn", str(p.path)]
        else:
            common = ["patch", "-p1", "--forward", "--fuzz=0", "--batch", "-i", str(p.path)]
            check, apply = [*common, "--dry-run"], common
        proc = subprocess.run(check, cwd=root, env=env, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            proc = subprocess.run(apply, cwd=root, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            output = proc.stderr + proc.stdout
            first = next((ln.strip() for ln in output.splitlines() if ln.strip()), "no output")
            raise BuildError(f"patch {p.name} ({p.feature}) does not apply to {_failing_file(p, output)}: {first}")
        log(f"applied {p.name} ({p.feature})")


# --------------------------------------------------------------------------------------------------
# Wheel assembly
#
# Only the files the patches name are unpacked (git apply needs them on disk); every other entry is
# streamed from the upstream wheel straight into the new one.


@dataclass(frozen=True)
class Entry:
    """One file of the new wheel: from the upstream zip (`member`) or from the work tree (`path`)."""

    mode: int
    member: zipfile.ZipInfo | None = None
    path: Path | None = None


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _zip_mode(info: zipfile.ZipInfo) -> int:
    return 0o755 if (info.external_attr >> 16) & 0o111 else 0o644


def _file_mode(path: Path) -> int:
    return 0o755 if path.stat().st_mode & 0o111 else 0o644


def touched_paths(patches: Sequence[Patch]) -> set[str]:
    """Paths (after `-p1`) that the patches read or write."""
    out = set()
    for p in patches:
        for line in p.read_bytes().decode("utf-8", "replace").splitlines():
            m = re.match(r"^diff --git (\S+) (\S+)", line)
            found = list(m.groups()) if m else []
            m = re.match(r"^(?:---|\+\+\+) (\S+)", line)
            if m:
                found.append(m.group(1))
            for path in found:
                if path != "/dev/null" and "/" in path:
                    out.add(path.split("/", 1)[1])
            m = re.match(r"^(?:rename|copy) (?:from|to) (\S+)", line)
            if m:
                out.add(m.group(1))
    return out


def _extract(zf: zipfile.ZipFile, info: zipfile.ZipInfo, root: Path) -> None:
    target = root / info.filename
    if not target.resolve().is_relative_to(root.resolve()):
        raise BuildError(f"wheel entry {info.filename!r} points outside the wheel")
    target.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(info) as fh, open(target, "wb") as out:
        shutil.copyfileobj(fh, out, CHUNK)
    os.chmod(target, _zip_mode(info))


def check_layout(upstream: set[str], patches: Sequence[Patch], src: Sequence[tuple[str, Path]]) -> None:
    """Refuse a src file that would overwrite an upstream file, and a diff of a file upstream lacks."""
    for name, path in src:
        if name in upstream:
            raise BuildError(
                f"{path} would overwrite upstream file {name}: src/ holds new files only; "
                "change an upstream file with a diff in the series"
            )
    for p in patches:
        for name in sorted(touched_paths([p]) - upstream):
            raise BuildError(
                f"patch {p.name} ({p.feature}) edits {name}, which the upstream wheel does not ship: "
                f"new files belong in {p.path.parent / patchset.SRC_NAME}/"
            )


def patch_tree(
    zf: zipfile.ZipFile,
    patches: Sequence[Patch],
    root: Path,
    log: Callable[[str], None] = print,
    src: Sequence[tuple[str, Path]] = (),
) -> dict[str, Entry]:
    """Lay `src` (new files) over the wheel in `zf`, apply `patches` in `root` (the work tree for
    the files they edit); the resulting entries."""
    upstream = {i.filename: i for i in zf.infolist() if not i.is_dir()}
    check_layout(set(upstream), patches, src)
    touched = touched_paths(patches) & upstream.keys()
    for name in sorted(touched):
        _extract(zf, upstream[name], root)
    apply_patches(root, patches, log)
    if src:
        log(f"laid {len(src)} new file(s) from {patchset.SRC_NAME}/ over the wheel")
    entries: dict[str, Entry] = {name: Entry(mode=_file_mode(path), path=path) for name, path in src}
    for name, info in upstream.items():
        if name not in touched:
            entries[name] = Entry(mode=_zip_mode(info), member=info)
        elif (root / name).is_file():
            entries[name] = Entry(mode=_file_mode(root / name), path=root / name)
        # else: the patch deleted it
    for path in root.rglob("*"):
        name = path.relative_to(root).as_posix()
        if name in upstream or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            raise BuildError(f"{name}: only regular files can go into a wheel")
        if not name.endswith((".orig", ".rej")):
            entries[name] = Entry(mode=_file_mode(path), path=path)
    return entries


def _read(zf: zipfile.ZipFile, entry: Entry) -> bytes:
    if entry.member is not None:
        return zf.read(entry.member)
    if entry.path is None:
        raise AssertionError("a wheel entry with neither a zip member nor a file")
    return entry.path.read_bytes()


def set_version(
    zf: zipfile.ZipFile, entries: dict[str, Entry], root: Path, package: str, old: str, new: str
) -> tuple[dict[str, Entry], str]:
    """Move the dist-info to `<package>-<new>.dist-info`, rewrite METADATA's Version and
    `<package>/_version.py`; returns the new entries and the dist-info name."""
    old_info, new_info = f"{package}-{old}.dist-info", f"{package}-{new}.dist-info"
    meta_name = f"{old_info}/METADATA"
    if meta_name not in entries:
        raise BuildError(f"upstream wheel has no {meta_name}")
    out: dict[str, Entry] = {}
    for name, entry in entries.items():
        if name.startswith(f"{old_info}/"):
            name = new_info + name[len(old_info) :]
        out[name] = entry

    def rewrite(name: str, edit: Callable[[str], str]) -> None:
        text = _read(zf, out[name]).decode("utf-8")
        path = root / ".sgdeploy" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(edit(text), encoding="utf-8")
        out[name] = Entry(mode=out[name].mode, path=path)

    def metadata(text: str) -> str:
        head, sep, body = text.partition("\n\n")
        head, n = re.subn(rf"(?m)^Version: {re.escape(old)}$", f"Version: {new}", head, count=1)
        if n != 1:
            raise BuildError(f"{meta_name}: no 'Version: {old}' header to rewrite")
        return head + sep + body

    rewrite(f"{new_info}/METADATA", metadata)
    # `sglang.__version__` comes from the generated _version.py; make it carry the label too.
    if f"{package}/_version.py" in out:
        rewrite(
            f"{package}/_version.py",
            lambda t: t.replace(f"__version__ = version = '{old}'", f"__version__ = version = '{new}'"),
        )
    return out, new_info


def write_wheel(zf: zipfile.ZipFile, entries: dict[str, Entry], dist_info: str, dest: Path) -> str:
    """Zip `entries` into `dest` deterministically with a fresh RECORD; returns the wheel's sha256.

    Sorted names (package files, then dist-info, RECORD last), fixed timestamps and modes, one
    compression level: the same inputs give the same bytes. Written to a temp name, then renamed.
    """
    record = f"{dist_info}/RECORD"
    names = sorted(
        (n for n in entries if n != record and "/__pycache__/" not in f"/{n}"),
        key=lambda n: (n.startswith(f"{dist_info}/"), n),
    )
    rows = []
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=ZIP_LEVEL) as out:

            def put(name: str, data: bytes, mode: int) -> None:
                info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
                info.create_system = 3
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(info, data, compresslevel=ZIP_LEVEL)

            for name in names:
                data = _read(zf, entries[name])
                rows.append((name, _record_hash(data), str(len(data))))
                put(name, data, entries[name].mode)
            rows.append((record, "", ""))
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            put(record, buf.getvalue().encode(), 0o644)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return sha256_file(dest)


def digest_file(wheel: Path) -> Path:
    """Where the build records the wheel's sha256: `<wheel>.sha256`."""
    return wheel.with_name(wheel.name + ".sha256")


def recorded_sha256(wheel: Path) -> str:
    """The sha256 recorded when `wheel` was built, checked against the file; raises BuildError when the
    wheel changed since. A wheel built before digests were recorded gets its digest recorded now."""
    actual = sha256_file(wheel)
    record = digest_file(wheel)
    if not record.is_file():
        record.write_text(actual + "\n")
        return actual
    recorded = record.read_text().strip()
    if actual != recorded:
        raise BuildError(f"wheel {wheel}: sha256 {actual} is not {recorded}, the digest recorded at its build "
                         f"({record}); it changed after the build: delete both files to build it again")
    return recorded


def build(
    patches: Sequence[Patch],
    python: str = DEFAULT_PYTHON,
    out: Path = DEFAULT_OUT,
    downloads: Path = DEFAULT_DOWNLOADS,
    index_url: str | None = None,
    pins: Pins | None = None,
    log: Callable[[str], None] = print,
) -> BuildResult:
    """Build (or find) the wheel for `patches`; raises BuildError or UsageError."""
    pins = pins or load_pins()
    pin = pins.for_python(python)
    label = patchset.release_label(patches)
    version = f"{pins.version}+{label}"
    dest = Path(out) / wheel_name(pins, pin, label)
    features, patch_names = patchset.features_of(patches), tuple(p.name for p in patches)

    def result(sha256: str, built: bool) -> BuildResult:
        return BuildResult(
            wheel=dest, label=label, version=version, python=python, features=features, patches=patch_names,
            sha256=sha256, built=built,
        )  # fmt: skip

    if dest.is_file():
        return result(recorded_sha256(dest), built=False)
    names = ", ".join(p.name for p in patches) or "none"
    log(f"building {pins.package} {version} for Python {python} (patches: {names})")
    upstream = fetch_upstream(pins, pin, Path(downloads), index_url, log)
    with tempfile.TemporaryDirectory(prefix="sgdeploy-wheel-") as tmp, zipfile.ZipFile(upstream) as zf:
        root = Path(tmp) / "wheel"
        root.mkdir()
        src = patchset.src_files(patches[0].path.parent / patchset.SRC_NAME) if patches else []
        entries = patch_tree(zf, patches, root, log, src)
        entries, dist_info = set_version(zf, entries, Path(tmp), pins.package, pins.version, version)
        dest.parent.mkdir(parents=True, exist_ok=True)
        sha = write_wheel(zf, entries, dist_info, dest)
    digest_file(dest).write_text(sha + "\n")
    log(f"wrote {dest} (sha256 {sha})")
    return result(sha, built=True)


def build_features(
    features: Sequence[str],
    python: str = DEFAULT_PYTHON,
    out: Path = DEFAULT_OUT,
    downloads: Path = DEFAULT_DOWNLOADS,
    index_url: str | None = None,
    log: Callable[[str], None] = print,
    patches_dir: Path = DEFAULT_PATCHES_DIR,
    pins_path: Path = DEFAULT_PINS,
) -> BuildResult:
    """Build (or find) the wheel of a set of patch features for Python `python`: any feature builds the
    patched series, none the pristine wheel (label `stock`). Raises UsageError (an unknown feature or
    Python), BuildError or PatchSetError."""
    pins = load_pins(pins_path)
    pins.for_python(python)
    unknown = [f for f in features if f not in patchset.FEATURES]
    if unknown:
        allowed = ", ".join(patchset.FEATURES)
        raise UsageError(f"unknown patch feature {unknown[0]!r} (allowed: {allowed})")
    patches: list[Patch] = patchset.load(patches_dir).select(features) if features else []  # stock: no series
    return build(patches, python, out, downloads, index_url, pins, log)


def build_for(
    config: str | Path,
    python: str = DEFAULT_PYTHON,
    index_url: str | None = None,
    log: Callable[[str], None] = print,
) -> BuildResult:
    """Build (or find) the wheel of a config's patch set for Python `python`: what
    `sgdeploy wheel --config CONFIG --python X.Y --json` prints, in-process (the collection's action
    plugin sgdeploy.host.controller_wheel calls this). `config` is a name in configs/ or a file's path
    (a relative one from the current directory). Raises UsageError, BuildError or PatchSetError, each
    with a one-line message."""
    return build_features(_features_from_config(str(config)), python, index_url=index_url, log=log)


# --------------------------------------------------------------------------------------------------
# Command line


def _features_from_config(name: str) -> tuple[str, ...]:
    from sgdeploy import spec

    try:
        return tuple(spec.load(name).patch_features)
    except spec.ConfigError as exc:
        raise UsageError("; ".join(exc.problems) or f"config {name!r} is not valid") from None


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m sgdeploy.wheel",
        description="Build the patched SGLang wheel for a config's patch set (once per patch set).",
    )
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--config", help="config name (configs/NAME.yml) or path: its patch features")
    what.add_argument("--features", help="comma-separated features (ddtree,fork,topk): any builds the "
                      "patched series; empty for the pristine wheel (stock)")
    ap.add_argument("--python", default=DEFAULT_PYTHON, help="target Python X.Y (default %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="wheel directory (default build/wheels)")
    ap.add_argument("--downloads", type=Path, default=DEFAULT_DOWNLOADS, help="upstream wheel cache")
    ap.add_argument("--patches-dir", type=Path, default=DEFAULT_PATCHES_DIR, help="series and patches")
    ap.add_argument("--pins", type=Path, default=DEFAULT_PINS, help="pinned upstream wheels (YAML)")
    ap.add_argument("--index-url", help="index for the upstream wheel (default: pip config, PIP_INDEX_URL)")
    ap.add_argument("--json", action="store_true", help="print one JSON object for programs")
    args = ap.parse_args(argv)
    if args.config is None and args.features is None:
        ap.error("one of --config or --features is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    say = (lambda m: print(m, file=sys.stderr)) if args.json else print
    try:
        if args.config is not None:
            features: Sequence[str] = _features_from_config(args.config)
        else:
            features = _split(args.features or "")
        result = build_features(features, args.python, args.out, args.downloads, args.index_url, say,
                                patches_dir=args.patches_dir, pins_path=args.pins)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BuildError, PatchSetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.as_json(), sort_keys=True))
    else:
        state = "built" if result.built else "up to date (already built)"
        print(f"sglang {result.version} for Python {result.python}: {state}")
        print(f"  wheel   {result.wheel}\n  sha256  {result.sha256}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
