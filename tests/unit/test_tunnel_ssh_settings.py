"""The controller's own SSH sessions (sweep bench, `sgdeploy gate`/`tunnel`) go where Ansible's would: the
inventory's ansible_ssh_common_args / ansible_ssh_extra_args (ProxyJump, ProxyCommand, -F, -i, -p, -l) are
honoured (issue 35: "the tunnel ignores ansible_ssh_common_args, ProxyJump and ssh_config")."""

from __future__ import annotations

import pytest

from sgdeploy import tunnel


def test_ssh_args_reads_the_options_that_say_where_and_how_to_connect():
    got = tunnel.ssh_args("-o StrictHostKeyChecking=no -o ProxyJump=ops@bastion:2222 -i ~/.ssh/k -p 2200 "
                          "-o 'ProxyCommand=ssh -W %h:%p gw' -o ConnectTimeout 7 -l ubuntu -F /etc/lab_ssh")
    assert got == {"proxy_jump": "ops@bastion:2222", "key_file": "~/.ssh/k", "port": "2200",
                   "proxy_command": "ssh -W %h:%p gw", "connect_timeout": "7", "user": "ubuntu",
                   "config_file": "/etc/lab_ssh"}


def test_ssh_args_takes_joined_and_separate_spellings():
    assert tunnel.ssh_args("-Jjump1,jump2 -oUser=x") == {"proxy_jump": "jump1,jump2", "user": "x"}
    assert tunnel.ssh_args("-J jump1") == {"proxy_jump": "jump1"}
    assert tunnel.ssh_args("") == {}


@pytest.mark.parametrize("text", ["-o ProxyJump='unclosed", "-J"])
def test_ssh_args_that_cannot_be_read_are_refused_in_one_line(text):
    with pytest.raises(tunnel.TunnelError) as err:
        tunnel.ssh_args(text)
    assert "ansible_ssh_common_args/extra_args" in str(err.value) and "\n" not in str(err.value)


def test_inventory_vars_win_over_the_args_as_ansible_does():
    target = tunnel.Target.from_hostvars("gpu1", {
        "ansible_host": "10.0.0.5", "ansible_user": "ubuntu", "ansible_port": 2222,
        "ansible_ssh_common_args": "-o ProxyJump=ops@bastion -p 1 -l nobody",
        "ansible_ssh_extra_args": "-o ConnectTimeout=9"})
    assert (target.address, target.user, target.port) == ("10.0.0.5", "ubuntu", 2222)
    assert target.proxy_jump == "ops@bastion" and target.connect_timeout == 9.0


def test_no_port_anywhere_leaves_it_to_ssh_config():
    assert tunnel.Target.from_hostvars("gpu1", {}).port is None


def test_a_port_that_is_no_number_is_refused_naming_it():
    with pytest.raises(tunnel.TunnelError, match="gpu1: ssh port 'twenty'"):
        tunnel.Target.from_hostvars("gpu1", {"ansible_port": "twenty"})


def test_proxy_jump_becomes_a_chain_of_fabric_gateways():
    target = tunnel.Target.from_hostvars("gpu1", {"ansible_host": "10.0.0.5", "ansible_ssh_private_key_file": "/k",
                                                  "ansible_ssh_common_args": "-J ops@bastion:2222,inner"})
    conn = tunnel.connection(target)
    inner = conn.gateway
    assert (conn.host, inner.host) == ("10.0.0.5", "inner")
    assert (inner.gateway.host, inner.gateway.user, inner.gateway.port) == ("bastion", "ops", 2222)
    assert inner.connect_kwargs["key_filename"] in ("/k", ["/k"]) and inner.gateway.gateway is None


def test_proxy_command_is_fabric_s_string_gateway():
    target = tunnel.Target.from_hostvars("gpu1", {"ansible_ssh_common_args": "-o 'ProxyCommand=nc -x p:1080 %h %p'"})
    assert tunnel.connection(target).gateway == "nc -x p:1080 %h %p"


def test_without_proxy_options_there_is_no_gateway():
    assert not tunnel.connection(tunnel.Target.from_hostvars("gpu1", {"ansible_host": "10.0.0.5"})).gateway


def test_an_ssh_config_file_given_by_F_is_read(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host gpu1-alias\n  HostName 10.9.9.9\n  User cfguser\n  Port 2022\n  ProxyJump hop@jumpbox\n")
    conn = tunnel.connection(tunnel.Target.from_hostvars("gpu1-alias", {"ansible_ssh_common_args": f"-F {cfg}"}))
    assert (conn.host, conn.user, conn.port) == ("10.9.9.9", "cfguser", 2022)
    assert conn.gateway.host == "jumpbox" and conn.gateway.user == "hop"
