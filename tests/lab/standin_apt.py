#!/usr/bin/env python3
"""Build the lab's stand-in apt repository (test equipment; never reaches a real inventory).

The repository is *flat*: `Packages`, `Packages.gz`, `Release` and the `.deb` files side by side
in one directory, `$LAB_DIR/apt` on the controller, which every lab host sees read-only at
`/srv/lab-apt`. It is signed as NVIDIA's is: `InRelease` and `Release.gpg` carry a signature by
the lab's own key, generated once per lab (`$LAB_DIR/apt-gnupg`, see `signing_key`), whose public
half is published beside the repository as `lab-apt.pub`, as NVIDIA publishes `3bf863cc.pub`. The
lab inventory points the nvidia_apt_repo role at the repository and pins that key's fingerprint
(`nvidia_apt_repo_key_fingerprint`), so the role verifies the key and writes the line

    deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] file:/srv/lab-apt ./

exactly as it does for NVIDIA's repository (no `trusted=yes`). The packages carry the real names of
NVIDIA's CUDA repository (Ubuntu naming: `nvidia-open-580`, `nvidia-dkms-580-open`,
`cuda-toolkit-13-0`, ...) and a `linux-headers-<running kernel>`, so that the roles' real apt,
pin, hold and reboot logic runs; their contents only pretend (see standin/pkgs/README.md).

Usage: python tests/lab/standin_apt.py [DEST]   (default: $LAB_DIR/apt, LAB_DIR=build/lab)
Prints the signing key's fingerprint last.

The destination directory is emptied and refilled in place, never replaced: the lab hosts
bind-mount it, and a new directory would not be seen by hosts already running.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

HERE = Path(__file__).resolve().parent
PKGS = HERE / "standin" / "pkgs"

# Where the hosts see the repository, and the role variables that make nvidia_apt_repo use it.
HOST_DIR = "/srv/lab-apt"
KEY_NAME = "lab-apt.pub"
UID = "sgdeploy lab apt repository (test equipment) <lab-apt@localhost>"


def role_vars(fingerprint: str) -> dict[str, str]:
    """The nvidia_apt_repo variables that point a lab host at this repository and pin its key."""
    return {
        "nvidia_apt_repo_url": f"file:{HOST_DIR}",
        "nvidia_apt_repo_suite": "./",
        "nvidia_apt_repo_key_url": f"file://{HOST_DIR}/{KEY_NAME}",
        "nvidia_apt_repo_key_fingerprint": fingerprint,
    }
ARCH = "amd64"
MAINTAINER = "sgdeploy lab <lab@localhost>"

# What the repository offers. Two driver releases of the pinned branch, so that an upgrade
# (a changed kernel module) can be exercised; a second branch, so that the pin is exercised.
DRIVER_RELEASES = {"580": ["580.82.07", "580.95.05"], "590": ["590.44.01"]}
CUDA_RELEASES = {"13.0": "13.0.2", "12.8": "12.8.1", "12.6": "12.6.3"}
NVCC_BUILD = {"13.0": "13.0.88", "12.8": "12.8.93", "12.6": "12.6.85"}


@dataclass
class Package:
    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> target
    scripts: dict[str, bytes] = field(default_factory=dict)  # postinst, prerm, ...


def _text(name: str, **subst: str) -> bytes:
    data = (PKGS / name).read_text(encoding="utf-8")
    for key, value in subst.items():
        data = data.replace(f"@{key}@", value)
    return data.encode()


def fake_module(version: str, license_: str, workdir: Path) -> bytes:
    """An ELF relocatable object whose .modinfo section is what modinfo reads from nvidia.ko."""
    info = workdir / "modinfo.bin"
    out = workdir / "nvidia.ko"
    fields = {
        "license": license_,
        "version": version,
        "description": "NVIDIA kernel module (lab stand-in, not loadable)",
        "author": "sgdeploy lab",
        "name": "nvidia",
    }
    info.write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in fields.items()))
    subprocess.run(
        [
            "objcopy", "-I", "binary", "-O", "elf64-x86-64", "-B", "i386:x86-64",
            "--rename-section", ".data=.modinfo,contents,alloc,load,readonly,data",
            str(info), str(out),
        ],
        check=True,
        cwd=workdir,
    )
    return out.read_bytes()


def driver_packages(branch: str, version: str, workdir: Path) -> list[Package]:
    deb_version = f"{version}-1"
    pinned = f"(= {deb_version})"
    scripts = {"postinst": _text("dkms.postinst"), "prerm": _text("dkms.prerm")}
    ko_open = fake_module(version, "Dual MIT/GPL", workdir)
    ko_prop = fake_module(version, "NVIDIA", workdir)
    return [
        Package(
            f"nvidia-dkms-{branch}-open", deb_version,
            f"NVIDIA kernel module, open flavour, branch {branch} (lab stand-in)",
            files={
                "usr/share/lab-nvidia/nvidia-open.ko": (ko_open, 0o644),
                "usr/share/lab-nvidia/nvidia-proprietary.ko": (ko_prop, 0o644),
                "usr/libexec/lab-nvidia/modload": (_text("lab-nvidia-modload"), 0o755),
                "usr/lib/systemd/system/lab-nvidia-modload.service": (
                    _text("lab-nvidia-modload.service"), 0o644),
            },
            scripts=scripts,
        ),
        Package(
            f"libnvidia-compute-{branch}", deb_version,
            f"NVIDIA compute libraries, branch {branch} (lab stand-in)",
            files={f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}": (
                b"lab stand-in: not a library\n", 0o644)},
            symlinks={"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": f"libnvidia-ml.so.{version}"},
        ),
        Package(
            f"nvidia-utils-{branch}", deb_version,
            f"NVIDIA driver utilities (nvidia-smi), branch {branch} (lab stand-in)",
            depends=[f"libnvidia-compute-{branch} {pinned}", "python3"],
            files={"usr/bin/nvidia-smi": (_text("nvidia-smi", DRIVER_VERSION=version), 0o755)},
        ),
        Package(
            f"nvidia-compute-utils-{branch}", deb_version,
            f"NVIDIA compute utilities (nvidia-persistenced), branch {branch} (lab stand-in)",
            files={
                "usr/bin/nvidia-persistenced": (_text("nvidia-persistenced"), 0o755),
                "usr/lib/systemd/system/nvidia-persistenced.service": (
                    _text("nvidia-persistenced.service"), 0o644),
            },
        ),
        Package(
            f"nvidia-open-{branch}", deb_version,
            f"NVIDIA driver, open kernel modules, branch {branch} (lab stand-in metapackage)",
            depends=[
                f"nvidia-dkms-{branch}-open {pinned}",
                f"nvidia-utils-{branch} {pinned}",
                f"nvidia-compute-utils-{branch} {pinned}",
                f"libnvidia-compute-{branch} {pinned}",
            ],
        ),
        Package(
            f"nvidia-fabricmanager-{branch}", deb_version,
            f"NVIDIA fabric manager for NVSwitch systems, branch {branch} (lab stand-in)",
            files={
                "usr/bin/nv-fabricmanager": (_text("nv-fabricmanager", DRIVER_VERSION=version), 0o755),
                "usr/lib/systemd/system/nvidia-fabricmanager.service": (
                    _text("nvidia-fabricmanager.service"), 0o644),
            },
        ),
    ]


def cuda_packages(series: str, release: str) -> list[Package]:
    dashed = series.replace(".", "-")
    priority = series.replace(".", "")
    subst = {"CUDA_VERSION": series, "CUDA_FULL_VERSION": NVCC_BUILD[series], "CUDA_PRIORITY": priority}
    return [
        Package(
            f"cuda-nvcc-{dashed}", f"{NVCC_BUILD[series]}-1",
            f"CUDA nvcc {series} (lab stand-in)",
            files={f"usr/local/cuda-{series}/bin/nvcc": (_text("nvcc", **subst), 0o755)},
        ),
        Package(
            f"cuda-toolkit-{dashed}", f"{release}-1",
            f"CUDA Toolkit {series} (lab stand-in metapackage)",
            depends=[f"cuda-nvcc-{dashed}"],
            scripts={
                "postinst": _text("cuda-toolkit.postinst", **subst),
                "prerm": _text("cuda-toolkit.prerm", **subst),
            },
        ),
    ]


def headers_package(kernel: str) -> Package:
    return Package(
        f"linux-headers-{kernel}", "1.0-1",
        f"Header files for Linux {kernel} (lab stand-in)",
        files={f"usr/src/linux-headers-{kernel}/Makefile": (
            b"# lab stand-in: no kernel headers here\n", 0o644)},
    )


def all_packages(kernel: str, workdir: Path) -> list[Package]:
    pkgs: list[Package] = []
    for branch, versions in DRIVER_RELEASES.items():
        for version in versions:
            pkgs += driver_packages(branch, version, workdir)
    for series, release in CUDA_RELEASES.items():
        pkgs += cuda_packages(series, release)
    pkgs.append(headers_package(kernel))
    return pkgs


def build_deb(pkg: Package, dest: Path, workdir: Path) -> Path:
    root = workdir / f"{pkg.name}_{pkg.version}"
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (content, mode) in pkg.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    for rel, target in pkg.symlinks.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    control = [
        f"Package: {pkg.name}",
        f"Version: {pkg.version}",
        f"Architecture: {ARCH}",
        f"Maintainer: {MAINTAINER}",
        "Section: lab",
        "Priority: optional",
    ]
    if pkg.depends:
        control.append("Depends: " + ", ".join(pkg.depends))
    control.append(f"Description: {pkg.description}")
    control.append(" Test equipment of the sgdeploy lab. Never install it on a real host.")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n", encoding="utf-8")
    for name, content in pkg.scripts.items():
        script = root / "DEBIAN" / name
        script.write_bytes(content)
        script.chmod(0o755)
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    out = dest / f"{pkg.name}_{pkg.version}_{ARCH}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def index_entry(deb: Path, dest: Path) -> str:
    control = subprocess.run(
        ["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True
    ).stdout.rstrip("\n")
    data = deb.read_bytes()
    extra = [
        f"Filename: ./{deb.relative_to(dest)}",
        f"Size: {len(data)}",
        f"MD5sum: {hashlib.md5(data).hexdigest()}",  # noqa: S324 - apt's index format
        f"SHA256: {hashlib.sha256(data).hexdigest()}",
    ]
    lines = control.split("\n")
    # Keep the description last, as dpkg-scanpackages does.
    desc_at = next(i for i, line in enumerate(lines) if line.startswith("Description:"))
    return "\n".join(lines[:desc_at] + extra + lines[desc_at:]) + "\n"


def _gpg(home: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), *args], check=True,
                          capture_output=True, **kwargs)


def default_gnupg_home(dest: Path) -> Path:
    return dest.parent / "apt-gnupg"


def signing_key(home: Path) -> str:
    """The fingerprint of the lab's repository signing key in `home`, generated on first use
    (ed25519, no passphrase: test equipment). Kept across rebuilds, so the pin stays valid."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)

    def secret_fingerprints() -> list[str]:
        out = _gpg(home, "--with-colons", "--list-secret-keys", text=True).stdout if any(
            home.glob("private-keys-v1.d/*")) else ""
        return [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")][:1]

    try:
        found = secret_fingerprints()
        if not found:
            _gpg(home, "--passphrase", "", "--quick-gen-key", UID, "ed25519", "sign", "never")
            found = secret_fingerprints()
        return found[0]
    finally:
        _stop_agent(home)


def _stop_agent(home: Path) -> None:
    """gpg starts an agent for a home's secret keys: stop it, nothing of the lab keeps running."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)


def sign(dest: Path, home: Path) -> str:
    """InRelease (clear-signed) and Release.gpg (detached) for `dest`/Release, and the public key
    as `dest`/lab-apt.pub. Returns the key's fingerprint."""
    fingerprint = signing_key(home)
    release = dest / "Release"
    try:
        for name, mode in (("InRelease", "--clearsign"), ("Release.gpg", "--detach-sign")):
            out = dest / name
            out.unlink(missing_ok=True)
            _gpg(home, "--local-user", fingerprint, "--digest-algo", "SHA512", "--armor", mode,
                 "--output", str(out), str(release))
        (dest / KEY_NAME).write_bytes(_gpg(home, "--armor", "--export", fingerprint).stdout)
    finally:
        _stop_agent(home)
    return fingerprint


def fingerprint_of(dest: Path, home: Path | None = None) -> str:
    """The fingerprint the lab inventory pins: that of the key `build` signed `dest` with."""
    return signing_key(home or default_gnupg_home(dest))


def build(dest: Path, kernel: str | None = None, gnupg_home: Path | None = None) -> Path:
    """Build the repository into `dest` (emptied in place) and sign it with the lab's key in
    `gnupg_home` (default: `apt-gnupg` beside `dest`). Returns `dest`."""
    kernel = kernel or os.uname().release
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        if old.is_file() or old.is_symlink():
            old.unlink()
    dest.chmod(0o755)
    with tempfile.TemporaryDirectory(prefix="standin-apt-") as tmp:
        work = Path(tmp)
        (work / "ko").mkdir()
        debs = []
        for i, pkg in enumerate(all_packages(kernel, work / "ko")):
            debs.append(build_deb(pkg, dest, work / f"pkg{i}"))
    packages = "\n".join(index_entry(deb, dest) for deb in sorted(debs)).encode()
    (dest / "Packages").write_bytes(packages)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write(packages)
    (dest / "Packages.gz").write_bytes(buf.getvalue())
    release = [
        "Origin: sgdeploy-lab",
        "Label: lab stand-ins for NVIDIA's CUDA repository",
        "Suite: lab",
        "Codename: lab",
        f"Date: {formatdate(usegmt=True)}",
        f"Architectures: {ARCH}",
        "Description: test equipment, never for real hosts",
    ]
    for algo, fn in (("MD5Sum", hashlib.md5), ("SHA256", hashlib.sha256)):
        release.append(f"{algo}:")
        for name in ("Packages", "Packages.gz"):
            data = (dest / name).read_bytes()
            release.append(f" {fn(data).hexdigest()} {len(data)} {name}")
    (dest / "Release").write_text("\n".join(release) + "\n", encoding="utf-8")
    sign(dest, gnupg_home or default_gnupg_home(dest))
    for path in dest.iterdir():
        path.chmod(0o644)
    return dest


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    dest = Path(argv[0]) if argv else Path(os.environ.get("LAB_DIR", "build/lab")) / "apt"
    build(dest)
    print(f"stand-in apt repository in {dest} ({len(list(dest.glob('*.deb')))} packages), signed by key")
    print(fingerprint_of(dest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
