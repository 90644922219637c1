"""The controller's own SSH sessions (the sweep's bench tunnel, `sgdeploy gate`, `sgdeploy tunnel`) follow the
inventory's SSH settings as Ansible does (issue 35): a jump host in ansible_ssh_common_args, a ProxyCommand.

Proof that the session really went through lab2: lab1 is named by a host name only lab2 can resolve
(`lab1-behind-lab2`, in lab2's /etc/hosts), or by an address where nothing listens (the ProxyCommand
connects to lab1 itself)."""

from __future__ import annotations

import pytest

from sgdeploy import tunnel

pytestmark = pytest.mark.lab

HIDDEN = "lab1-behind-lab2"


def lab_target(lab, host: str, **extra) -> tunnel.Target:
    return tunnel.Target.from_hostvars(host, {"ansible_host": lab.address(host), "ansible_user": "root",
                                              "ansible_ssh_private_key_file": str(lab.key), **extra})


def test_a_jump_host_in_ansible_ssh_common_args_is_used(lab):
    lab.ssh("lab2", f"grep -q ' {HIDDEN}$' /etc/hosts || echo '{lab.address('lab1')} {HIDDEN}' >> /etc/hosts")
    try:
        direct = lab_target(lab, "lab1", ansible_host=HIDDEN)
        with pytest.raises(tunnel.TunnelError):
            tunnel.run(direct, "hostname", timeout=20)  # only lab2 knows the name
        jumped = lab_target(lab, "lab1", ansible_host=HIDDEN,
                            ansible_ssh_common_args=f"-o StrictHostKeyChecking=no -J root@{lab.address('lab2')}")
        code, out, err = tunnel.run(jumped, "hostname", timeout=30)
        assert (code, out.strip()) == (0, "lab1"), err
    finally:
        lab.ssh("lab2", f"sed -i '/ {HIDDEN}$/d' /etc/hosts", check=False)


def test_a_proxy_command_in_ansible_ssh_common_args_is_used(lab):
    nowhere = lab.address("lab1").rsplit(".", 1)[0] + ".250"  # nothing listens there
    proxy = (f"ssh -i {lab.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
             f"-W {lab.address('lab1')}:22 root@{lab.address('lab2')}")
    target = lab_target(lab, "lab1", ansible_host=nowhere, ansible_ssh_common_args=f"-o 'ProxyCommand={proxy}'")
    code, out, err = tunnel.run(target, "hostname", timeout=30)
    assert (code, out.strip()) == (0, "lab1"), err
