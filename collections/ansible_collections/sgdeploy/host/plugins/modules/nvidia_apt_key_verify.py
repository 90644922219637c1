#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""Download an apt repository's public signing key and check its fingerprint; read-only."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: nvidia_apt_key_verify
short_description: Fetch a repository signing key and verify its full fingerprint with gpg
description:
  - Downloads the ASCII-armored public key at I(url) into memory (nothing is written on the
    host), lists it with C(gpg --show-keys --with-colons) in a scratch GnuPG home that is removed
    afterwards, and fails unless the file holds exactly one primary key, with the fingerprint
    I(fingerprint), neither revoked nor expired. The failure names both fingerprints. Changes
    nothing, so it runs in check mode too.
options:
  url:
    description: URL of the key (https://, http:// or file://).
    type: str
    required: true
  fingerprint:
    description: The pinned full fingerprint, 40 hex digits (spaces and case are ignored).
    type: str
    required: true
  fingerprint_variable:
    description: Name of the variable that holds the pin, for the messages.
    type: str
    default: fingerprint
  timeout:
    description: Seconds for the download.
    type: int
    default: 60
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Download the repository key and verify its fingerprint (changes nothing)
  sgdeploy.host.nvidia_apt_key_verify:
    url: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub
    fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC
    fingerprint_variable: nvidia_apt_repo_key_fingerprint
  register: repo_key
  check_mode: false

- name: Install the verified key as the repository's keyring
  ansible.builtin.copy:
    content: "{{ repo_key.key }}"
    dest: /usr/share/keyrings/cuda-archive-keyring.asc
    mode: "0644"
"""

RETURN = r"""
key:
  description: the verified key, ASCII-armored, to install as the repository's keyring
  type: str
  returned: success
fingerprint: {description: "its full fingerprint (upper case, no spaces)", type: str, returned: success}
uids: {description: its user IDs, type: list, elements: str, returned: success}
"""


import re
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url

ARMOR = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
BAD_VALIDITY = {"r": "revoked", "e": "expired", "d": "disabled", "i": "invalid"}


def normalise(fingerprint: str) -> str:
    return re.sub(r"\s", "", fingerprint).upper()


def primary_keys(colons: str) -> list[dict]:
    """The primary keys of a `gpg --with-colons` listing: validity, fingerprint, user IDs."""
    keys: list[dict] = []
    previous = ""
    for line in colons.splitlines():
        fields = line.split(":")
        kind = fields[0]
        if kind == "pub":
            keys.append({"validity": fields[1], "fingerprint": "", "uids": []})
        elif kind == "fpr" and previous == "pub" and keys:
            keys[-1]["fingerprint"] = fields[9].upper()
        elif kind == "uid" and keys and len(fields) > 9:
            keys[-1]["uids"].append(fields[9])
        previous = kind
    return keys


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "fingerprint": {"type": "str", "required": True},
            "fingerprint_variable": {"type": "str", "default": "fingerprint"},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    url, var = module.params["url"], module.params["fingerprint_variable"]
    pinned = normalise(module.params["fingerprint"])
    if not re.fullmatch(r"[0-9A-F]{40}", pinned):
        module.fail_json(msg=f"{var} is {module.params['fingerprint']!r}: expected the signing key's full "
                             "fingerprint, 40 hex digits (see docs/provisioning.md). Nothing was changed.")

    response, info = fetch_url(module, url, timeout=module.params["timeout"])
    status = info.get("status")
    if response is None or (status is not None and status not in (-1, 200)):
        module.fail_json(msg=f"cannot download the repository key {url}: {info.get('msg') or status}. "
                             "Nothing was changed.")
    text = response.read().decode("utf-8", errors="replace")
    if ARMOR not in text:
        module.fail_json(msg=f"{url} is not an ASCII-armored OpenPGP public key (no '{ARMOR}' line). "
                             "Nothing was changed.")

    gpg = module.get_bin_path("gpg", required=True)
    with tempfile.TemporaryDirectory(prefix="nvidia-apt-key-") as home:
        rc, out, err = module.run_command([gpg, "--batch", "--no-options", "--homedir", home,
                                           "--show-keys", "--with-colons"], data=text, binary_data=True)
    if rc != 0:
        detail = (err.strip().splitlines() or [f"exit {rc}"])[-1]
        module.fail_json(msg=f"gpg cannot read the key {url}: {detail}. Nothing was changed.")
    keys = primary_keys(out)
    found = ", ".join(k["fingerprint"] for k in keys) or "none"
    if len(keys) != 1:
        module.fail_json(msg=f"the key file {url} holds {len(keys)} keys ({found}); expected exactly one, the "
                             f"one {var} pins ({pinned}). Nothing was changed.")
    key = keys[0]
    if key["fingerprint"] != pinned:
        module.fail_json(msg=f"the key {url} has fingerprint {key['fingerprint']}, but {var} pins {pinned}: "
                             "refusing to trust it. Nothing was changed. If the repository rotated its key, "
                             "confirm the new fingerprint from the vendor and set "
                             f"{var} (docs/provisioning.md).")
    if key["validity"] in BAD_VALIDITY:
        module.fail_json(msg=f"the key {url} ({pinned}) is {BAD_VALIDITY[key['validity']]}: refusing to trust "
                             "it. Nothing was changed.")
    module.exit_json(changed=False, key=text if text.endswith("\n") else text + "\n",
                     fingerprint=key["fingerprint"], uids=key["uids"])


if __name__ == "__main__":
    main()
