#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_deploy_record
short_description: Write a deploy record on the host (one file per attempt, never overwritten)
description:
  - Builds the record of one deploy, rollback or failure (the gate verdicts and bench copied from
    O(report_path)) and writes it as a new file in O(records_dir); an existing record is never
    overwritten.
  - In check mode the record is built (and checked) but not written; RV(path) is empty.
options:
  records_dir: {description: The config's records folder., type: path, required: true}
  config: {description: Config name., type: str, required: true}
  host: {description: Inventory host name., type: str, required: true}
  release: {description: Release label., type: str, required: true}
  outcome: {description: What happened., type: str, required: true,
            choices: [deployed, rolled_back, failed, unchanged]}
  started: {description: When the run started (ISO)., type: str, required: true}
  patches: {description: Patch files of the release., type: list, elements: str, default: []}
  features: {description: Patch features of the release., type: list, elements: str, default: []}
  unit_digest: {description: Digest of the unit and env text., type: str}
  report_path: {description: Gate report on the host (its gates and bench are copied)., type: path}
  rollback: {description: What the rollback did., type: dict}
  watch: {description: "The post-deploy watch's result (module sgdeploy.host.sglang_watch), or its C(off) reason.",
          type: dict}
  summary_line:
    description: One line for people, kept as the record's C(message).
    type: str
    default: ""
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Builds and checks the record, writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Write the deploy record
  sgdeploy.host.sglang_deploy_record:
    records_dir: /var/lib/sglang-deploy/ddtree-b15/records
    config: ddtree-b15
    host: gpu1
    release: 59d01d1e39ee
    outcome: deployed
    patches: [0001-ddtree-speculative-decoding.patch, 0002-ddtree-recurrent-state-forking.patch]
    features: [ddtree, fork]
    started: "2026-12-03T14:10:00Z"
    unit_digest: "{{ deploy.digest }}"
    report_path: /var/lib/sglang-deploy/ddtree-b15/staged/gates.json
    summary_line: ddtree-b15 deployed on gpu1 (release 59d01d1e39ee); gates passed
  register: record
  changed_when: false

- name: Record a failed manual rollback
  sgdeploy.host.sglang_deploy_record:
    records_dir: /var/lib/sglang-deploy/ddtree-b15/records
    config: ddtree-b15
    host: gpu1
    release: stock
    outcome: failed
    started: "2026-12-03T14:10:00Z"
    rollback: {manual: true, restored: [], restored_healthy: false}
    summary_line: manual rollback failed; what ran before was restored
"""

RETURN = r"""
path: {description: The record written., returned: success, type: str}
record: {description: The record., returned: success, type: dict}
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_records as records  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            records_dir=dict(type="path", required=True), config=dict(type="str", required=True),
            host=dict(type="str", required=True), release=dict(type="str", required=True),
            outcome=dict(type="str", required=True, choices=list(records.OUTCOMES)),
            started=dict(type="str", required=True),
            patches=dict(type="list", elements="str", default=[]),
            features=dict(type="list", elements="str", default=[]),
            unit_digest=dict(type="str"), report_path=dict(type="path"), rollback=dict(type="dict"),
            watch=dict(type="dict"),
            summary_line=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    report = read_json(p["report_path"]) if p["report_path"] and os.path.exists(p["report_path"]) else None
    try:
        record = records.build_record(config=p["config"], host=p["host"], release=p["release"], outcome=p["outcome"],
                                      started=p["started"], patches=p["patches"], features=p["features"],
                                      unit_digest=p["unit_digest"], report=report, rollback=p["rollback"],
                                      message=p["summary_line"], watch=p["watch"])
    except records.RecordError as exc:
        module.fail_json(msg=f"deploy record: {exc}")
    if module.check_mode:
        module.exit_json(changed=True, path="", record=record)
    try:
        path = str(records.write_record(p["records_dir"], record))
    except OSError as exc:
        module.fail_json(msg="could not write the deploy record in {}: {}".format(p["records_dir"], exc), record=record)
    module.exit_json(changed=True, path=path, record=record)


if __name__ == "__main__":
    main()
