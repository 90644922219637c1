"""module_utils/nvidia_pci: GPUs and NVSwitch chips from `lspci -nn -d 10de:` (issue 37, HGX).

The listings are the real shapes: an HGX H100 baseboard (four third-generation NVSwitch chips, class 0680,
beside eight GPUs, class 0302), and a PCIe-card server, whose NVIDIA audio function (class 0403) is neither.
The lab's stand-in lspci prints the same shape (tests/lab/standin/hw/lspci); it is run here too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import nvidia_pci  # noqa: E402

HGX = """\
05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
06:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
07:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
08:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
""" + "".join(f"{bus:02x}:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)\n"
              for bus in (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB))
PCIE = """\
18:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] [10de:2bb5] (rev a1)
18:00.1 Audio device [0403]: NVIDIA Corporation Device [10de:22e8] (rev a1)
2a:00.0 VGA compatible controller [0300]: NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85] (rev a1)
"""


def test_an_hgx_baseboard_has_nvswitch_chips_beside_its_gpus():
    functions = nvidia_pci.parse(HGX)
    switches, gpus = nvidia_pci.nvswitches(functions), nvidia_pci.gpus(functions)
    assert [s["slot"] for s in switches] == ["05:00.0", "06:00.0", "07:00.0", "08:00.0"]
    assert {s["pci_id"] for s in switches} == {"10de:22a3"}
    assert len(gpus) == 8 and {g["pci_id"] for g in gpus} == {"10de:2330"}


def test_pcie_cards_have_no_nvswitch_and_an_audio_function_is_not_a_gpu():
    functions = nvidia_pci.parse(PCIE)
    assert nvidia_pci.nvswitches(functions) == []
    assert [g["pci_id"] for g in nvidia_pci.gpus(functions)] == ["10de:2bb5", "10de:2b85"]


def test_the_lab_stand_in_lists_what_its_conf_says(tmp_path):
    conf = tmp_path / "lab-gpu.conf"
    conf.write_text("GPU_COUNT=2\nNVSWITCH_COUNT=4\n")
    script = (REPO / "tests/lab/standin/hw/lspci").read_text().replace('"/etc/lab-gpu.conf"', repr(str(conf)))
    standin = tmp_path / "lspci"
    standin.write_text(script)
    out = subprocess.run([sys.executable, str(standin), "-nn", "-d", "10de:"], capture_output=True, text=True,
                         check=True).stdout
    functions = nvidia_pci.parse(out)
    assert len(nvidia_pci.nvswitches(functions)) == 4 and len(nvidia_pci.gpus(functions)) == 2
    conf.write_text("GPU_COUNT=8\n")  # a PCIe host: no NVSWITCH_COUNT means none
    out = subprocess.run([sys.executable, str(standin), "-nn", "-d", "10de:"], capture_output=True, text=True,
                         check=True).stdout
    assert nvidia_pci.nvswitches(nvidia_pci.parse(out)) == [] and len(nvidia_pci.gpus(nvidia_pci.parse(out))) == 8
