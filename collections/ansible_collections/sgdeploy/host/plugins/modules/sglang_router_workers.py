#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_workers
short_description: Put engines into, or take them out of, the sglang-router in front of a config's replicas
description:
  - Adds the URLs of O(present) that the router does not list (POST /workers) and removes the
    URLs of O(absent) that it lists (DELETE /workers/<id>), then waits up to O(timeout_s) until
    every O(present) URL is listed healthy and no O(absent) URL is listed.
  - Removing a worker stops new requests to it; requests already forwarded finish on it.
  - A router that does not answer is waited for up to O(timeout_s) (e.g. systemd's restart delay), then the
    module fails; it never reports success for a router it could not reach.
  - In check mode it only reads the router's list and reports what it would change.
options:
  router_url: {description: The router's base URL (its bind address and serving.port)., type: str, required: true}
  present: {description: Worker URLs that must be in the router., type: list, elements: str, default: []}
  absent: {description: Worker URLs that must not be in the router., type: list, elements: str, default: []}
  timeout_s: {description: Longest wait for the router to settle., type: int, default: 60}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the router's list and reports what it would add and remove; changes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the replica out of the router (requests in flight on it finish)
  sgdeploy.host.sglang_router_workers:
    router_url: http://127.0.0.1:30000
    absent: [http://127.0.0.1:30003]
    timeout_s: 60

- name: Put the replica back into the router
  sgdeploy.host.sglang_router_workers:
    router_url: http://127.0.0.1:30000
    present: [http://127.0.0.1:30003]
    timeout_s: 60
"""

RETURN = r"""
added: {description: URLs added., returned: always, type: list}
removed: {description: URLs removed., returned: always, type: list}
workers: {description: "The router's list after the change: {url: {id, healthy, load}}.", returned: always, type: dict}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "required": True},
            "present": {"type": "list", "elements": "str", "default": []},
            "absent": {"type": "list", "elements": "str", "default": []},
            "timeout_s": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    p = module.params
    present = [u.rstrip("/") for u in p["present"]]
    absent = [u.rstrip("/") for u in p["absent"]]
    both = sorted(set(present) & set(absent))
    if both:
        module.fail_json(msg=f"sglang_router_workers: {', '.join(both)} both present and absent; name each once")
    try:
        # A router in systemd's restart delay is waited for (bounded), never taken for "no router".
        listing = api.workers_wait(p["router_url"], p["timeout_s"])
        to_add = [u for u in present if u not in listing]
        to_remove = [u for u in absent if u in listing]
        if module.check_mode:
            module.exit_json(changed=bool(to_add or to_remove), added=to_add, removed=to_remove, workers=listing)
        for url in to_remove:
            api.remove(p["router_url"], listing[url]["id"])
        for url in to_add:
            api.add(p["router_url"], url)
        ok, listing, detail = api.settle(p["router_url"], present, absent, p["timeout_s"])
    except api.RouterError as exc:
        module.fail_json(msg=str(exc))
    if not ok:
        module.fail_json(msg=f"router {p['router_url']}: {detail} after {p['timeout_s']} s", workers=listing,
                         added=to_add, removed=to_remove)
    module.exit_json(changed=bool(to_add or to_remove), added=to_add, removed=to_remove, workers=listing)


if __name__ == "__main__":
    main()
