"""NVIDIA functions on the PCI bus, as ``lspci -nn -d 10de:`` lists them: GPUs and NVSwitch chips.

Standard library only (Ansible ships this file with each module call). The provisioning roles ask two
things of it: how many GPUs the host has before a driver is installed (the preflight's count), and
whether the host is an NVSwitch system (HGX/DGX baseboards), which needs NVIDIA's fabric manager of the
driver's branch running before any CUDA work and must not have it on PCIe cards.

By PCI class (the first four hex digits of ``lspci -nn``'s ``[cccc]``):

- ``03xx`` (display controller; ``0302`` 3D controller on data-centre cards): a GPU;
- ``0680`` (bridge, other) with NVIDIA's vendor ID: an NVSwitch (third-generation NVSwitch on HGX H100/H200
  is ``10de:22a3``; the class, not a list of device IDs, decides, so later generations are found too).
"""

from __future__ import annotations

import re
import shutil
import subprocess

# "18:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [...] [10de:2bb5] (rev a1)"
# "07:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)"
LSPCI_LINE = re.compile(
    r"^(?P<slot>\S+) .*?\[(?P<cls>[0-9a-f]{4})\]: (?P<desc>.*)\[(?P<id>10de:[0-9a-f]{4})\]", re.I)
GPU_CLASS_PREFIX = "03"
NVSWITCH_CLASS = "0680"


def parse(text: str) -> list[dict[str, str]]:
    """Every NVIDIA function of an ``lspci -nn`` listing: slot, class, pci_id, description."""
    functions = []
    for line in text.splitlines():
        match = LSPCI_LINE.match(line.strip())
        if match:
            functions.append({"slot": match["slot"], "class": match["cls"].lower(), "pci_id": match["id"].lower(),
                              "description": match["desc"].strip()})
    return functions


def gpus(functions: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: f[k] for k in ("slot", "pci_id", "description")}
            for f in functions if f["class"].startswith(GPU_CLASS_PREFIX)]


def nvswitches(functions: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: f[k] for k in ("slot", "pci_id", "description")} for f in functions if f["class"] == NVSWITCH_CLASS]


def read() -> tuple[bool, list[dict[str, str]]]:
    """(lspci exists, the NVIDIA functions it lists)."""
    if not shutil.which("lspci"):
        return False, []
    proc = subprocess.run(["lspci", "-nn", "-d", "10de:"], capture_output=True, text=True, check=False)
    return True, parse(proc.stdout)
