#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gate
short_description: Run the deploy gates (smoke, exactness, throughput, acceptance) against a running service
description:
  - Smoke first; when it fails, the other gates are inconclusive and no bench runs. Then, for a speculative
    config, the exactness gate against the reference of its model in O(references_dir), or, with no usable
    reference there, against the target's own prefill on the same server; then one bench run shared by the
    throughput and acceptance gates. A non-speculative config whose gates all passed records the reference
    of its model instead (docs/gates.md).
  - The baseline is the last good deploy of O(config) on O(host) in O(records_dir); with O(peer_url), also
    the old replica's bench measured in the same window.
  - The same code as the controller's C(sgdeploy gate) (module_utils C(sglang_gate)).
  - Never fails the task because a gate failed; the verdicts are return values (RV(passed), RV(failed_gates)).
    Fails only on bad input.
  - When O(unit) names an engine API key (serving.api_key_secret), every request sends it as
    C(Authorization) bearer token, read on the host from the unit's environment file, to O(url) and
    O(peer_url) only (a replica of the same config); it is never a module argument, a return value or
    in the report.
  - In check mode nothing is measured (the service a check run would gate was never started) and
    nothing is written.
options:
  url: {description: "http://HOST:PORT of the service.", type: str, required: true}
  unit: {description: "The service's systemd unit: its engine API key, if its config names one, is sent.",
         type: str}
  speculative: {description: The config uses speculative decoding., type: bool, required: true}
  thresholds:
    description: The complete gates mapping of the deploy description (C(sgdeploy render --json)'s C(gates));
      the controller filled its defaults and checked it with the config schema.
    type: dict
    required: true
  gates:
    description: Which gates run (smoke always first when selected).
    type: list
    elements: str
    choices: [smoke, exactness, throughput, acceptance]
    default: [smoke, exactness, throughput, acceptance]
  config: {description: "Config name (baseline, references).", type: str, default: "?"}
  host: {description: "Inventory host name (baseline, references).", type: str, default: "?"}
  release: {description: Release label (references)., type: str}
  models: {description: The deploy description's models (the target names the reference)., type: list,
           elements: dict, default: []}
  records_dir: {description: The config's records folder (the baseline is its last good record)., type: path}
  references_dir: {description: The host's exactness references; without it the exactness gate does not run.,
                   type: path}
  exactness_enforced: {description: false records the exactness verdict without letting it fail the gates.,
                       type: bool, default: true}
  report_path: {description: Write the gate report here (atomically)., type: path}
  bench_timeout_s: {description: Seconds for the bench run and for the exactness requests., type: float,
                    default: 600}
  peer_url:
    description: A canary's old replica (http://HOST:PORT, a replica of the same config still on the old one).
      The bench runs against O(url) and it side by side, in the same window with the same prompts, and its
      numbers are a second baseline of the throughput and acceptance gates (docs/router.md).
    type: str
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: partial
    details:
      - Nothing is measured or written (the service a check run would gate was never started); RV(passed) is null.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Run the gates in the background (bench and exactness take minutes)
  sgdeploy.host.sglang_gate:
    url: http://127.0.0.1:30000
    speculative: true
    thresholds: "{{ deploy.gates }}"  # sgdeploy render --json's gates, defaults filled in
    config: ddtree-b15
    host: gpu1
    release: 59d01d1e39ee
    models: "{{ deploy.models }}"
    records_dir: /var/lib/sglang-deploy/ddtree-b15/records
    references_dir: /var/lib/sglang-deploy/references
    report_path: /var/lib/sglang-deploy/ddtree-b15/staged/gates.json
    bench_timeout_s: 900
  async: 1800
  poll: 0
  register: gates_job
  changed_when: false

- name: Wait for the gates
  ansible.builtin.async_status:
    jid: "{{ gates_job.ansible_job_id }}"
  register: gates
  until: gates.finished
  retries: 361
  delay: 5

- name: Smoke-gate a rolled-back service only
  sgdeploy.host.sglang_gate:
    url: http://127.0.0.1:30000
    speculative: false
    thresholds: "{{ deploy.gates }}"
    gates: [smoke]
    config: ar
    host: gpu1
  register: smoke
"""

RETURN = r"""
passed: {description: Nothing blocks (every selected gate passed; exactness passed or does not block).,
         returned: success, type: bool}
all_passed: {description: "Every verdict is pass, exactness included.", returned: success, type: bool}
verdict_line: {description: "C(gates passed) only when every verdict is pass; else names what did not pass.",
               returned: success, type: str}
failed_gates: {description: "Gates whose verdict is not pass, in order.", returned: success, type: list}
summary: {description: "One line per gate, a bench line and the verdict line.", returned: success, type: list}
report: {description: 'The gate report (docs/gates.md, "Gate report"); null in check mode.', returned: success,
         type: dict}
baseline_path: {description: "The last good record compared with, or null.", returned: success, type: str}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_records as records  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate as gates  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_exactness as exactness  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True), speculative=dict(type="bool", required=True),
            thresholds=dict(type="dict", required=True),
            gates=dict(type="list", elements="str", choices=list(gates.ALL_GATES), default=list(gates.ALL_GATES)),
            config=dict(type="str", default="?"), host=dict(type="str", default="?"), release=dict(type="str"),
            models=dict(type="list", elements="dict", default=[]), records_dir=dict(type="path"),
            references_dir=dict(type="path"), exactness_enforced=dict(type="bool", default=True),
            report_path=dict(type="path"), bench_timeout_s=dict(type="float", default=600.0),
            peer_url=dict(type="str"), unit=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, passed=None, all_passed=None, verdict_line="check mode: no gates run",
                         failed_gates=[], summary=["check mode: no gates run"],
                         report=None, baseline_path=None)
    if p["unit"]:
        try:
            key = units.engine_key(p["unit"])
            for url in (p["url"], p["peer_url"]):
                if url:
                    sglang_http.authorize(url, key)
        except (units.EngineKeyError, sglang_http.UsageError) as err:
            module.fail_json(msg=f"gates: {err}")
        if key:
            module.no_log_values.add(key)
    thresholds = gates.GateThresholds(p["thresholds"])
    found = None
    if p["records_dir"]:
        found = records.last_good_path(p["records_dir"], p["config"], p["host"])
    target = None
    if p["references_dir"]:
        target = gates.ExactnessTarget(p["references_dir"], exactness.model_identity({"models": p["models"]}),
                                       p["config"], p["host"], p["release"])
    try:
        report = gates.run_all(p["url"], thresholds, p["speculative"], found[1] if found else None, p["gates"],
                               bench_timeout=p["bench_timeout_s"], exactness_target=target,
                               exactness_enforced=p["exactness_enforced"], peer_url=p["peer_url"] or None)
    except (gates.GateError, sglang_http.UsageError) as err:
        module.fail_json(msg=f"gates: {err}")
    data = report.to_dict()
    if p["report_path"]:
        try:
            records.write_json(p["report_path"], data)
        except OSError as err:
            module.fail_json(msg="gates: cannot write the report {}: {}".format(p["report_path"], err.strerror or err),
                             report=data)
    recorded = bool(report.exactness and report.exactness.details.get("recorded"))
    module.exit_json(changed=recorded, passed=report.passed, all_passed=report.all_passed,
                     verdict_line=report.verdict_line(), failed_gates=report.failed_gates,
                     summary=report.lines(), report=data, baseline_path=str(found[0]) if found else None)


if __name__ == "__main__":
    main()
