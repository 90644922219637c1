#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_watch
short_description: Watch a new engine's live metrics after its gates (the post-deploy watch)
description:
  - Reads the engine's C(/metrics) at O(url) now and after every C(interval_s) seconds (in O(settings)) of a window of
    C(window_s) seconds, and judges each interval, Argo Rollouts style (docs/monitoring-watch.md).
  - "Per interval: requests ended (finished + aborted), accept length (delta C(sglang:generation_tokens_total) /
    delta C(sglang:spec_verify_calls_total)), generated tokens/s, error rate (aborted / ended)."
  - An interval with fewer than C(min_requests) requests is inconclusive (neither a failure nor a pass; it does not
    break a run of failures). Otherwise it fails below C(min_accept_length) or C(min_tokens_per_s), above
    C(max_error_rate), when the counters went back (the engine restarted) or C(/metrics) did not answer.
  - C(failure_limit) consecutive failed intervals end the watch at once with RV(result=failed); at the end of the
    window the result is C(inconclusive) when every interval was, else C(passed).
  - The module never fails because the watch failed (the caller decides, and the role sglang_deploy rolls back);
    it fails only on bad arguments.
  - Reads only. C(/metrics) needs no API key (SGLang exempts it, as C(/health)).
options:
  url: {description: "The engine's base URL (http://ADDRESS:PORT).", type: str, required: true}
  settings:
    description:
      - The config's resolved C(watch) mapping, as C(sgdeploy render --json) gives it; C(window_s), C(interval_s),
        C(failure_limit), C(min_requests), C(min_accept_length) (null or 0 for none), C(min_tokens_per_s)
        (null or 0 for none), C(max_error_rate) (null for none). C(enabled) is ignored (the caller decides).
    type: dict
    required: true
  speculative:
    description: The engine decodes speculatively (accept length is judged only then).
    type: bool
    default: true
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Watches nothing; RV(result) is C(check) and RV(line) says what it would watch.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Watch the new engine under live traffic (in the background, like the gates)
  sgdeploy.host.sglang_watch:
    url: http://127.0.0.1:30000
    speculative: true
    settings:
      window_s: 300
      interval_s: 30
      failure_limit: 3
      min_requests: 10
      min_accept_length: 8.0
      min_tokens_per_s: null
      max_error_rate: 0.05
  async: 420
  poll: 0
  register: watch_job
"""

RETURN = r"""
result: {description: "passed, failed, inconclusive (check: check mode).", returned: always, type: str}
line: {description: One sentence of what the watch found., returned: always, type: str}
intervals:
  description:
    - Per interval, in order; C(interval), C(seconds), C(requests), C(finished), C(aborted), C(generation_tokens),
      C(verify_calls), C(accept_length), C(tokens_per_s), C(error_rate) (null when not measured), C(verdict)
      (pass, fail, inconclusive) and C(reasons).
  returned: always
  type: list
  elements: dict
failed_intervals: {description: Intervals that failed., returned: always, type: int}
inconclusive_intervals: {description: Intervals with too little traffic., returned: always, type: int}
consecutive_failures: {description: Failed intervals in a row at the end., returned: always, type: int}
window_s: {description: The window., returned: always, type: int}
interval_s: {description: The interval., returned: always, type: int}
failure_limit: {description: Consecutive failures that fail the watch., returned: always, type: int}
thresholds: {description: "min_requests, min_accept_length, min_tokens_per_s, max_error_rate as applied.",
             returned: always, type: dict}
url: {description: The engine watched., returned: always, type: str}
seconds: {description: How long the watch ran., returned: always, type: float}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http, sglang_watch  # noqa: E402

NUMBERS = {"window_s": int, "interval_s": int, "failure_limit": int, "min_requests": int,
           "min_accept_length": float, "min_tokens_per_s": float, "max_error_rate": float}
REQUIRED = ("window_s", "interval_s", "failure_limit", "min_requests")


def _settings(raw):
    """The settings as numbers, or a one-line problem naming the key and its value."""
    out = {}
    for key, kind in NUMBERS.items():
        value = raw.get(key)
        if value is None or value == "":
            if key in REQUIRED:
                return None, f"settings.{key}: missing (the config's watch mapping, sgdeploy render --json)"
            out[key] = None
            continue
        try:
            out[key] = kind(value)
        except (TypeError, ValueError):
            return None, f"settings.{key}: {value!r}: must be a {'whole number' if kind is int else 'number'}"
    if out["window_s"] < 1 or out["interval_s"] < 1 or out["interval_s"] > out["window_s"]:
        return None, (f"settings.interval_s {out['interval_s']} and window_s {out['window_s']}: both 1 or more, "
                      f"the interval at most the window")
    if not 1 <= out["failure_limit"] <= out["window_s"] // out["interval_s"]:
        return None, (f"settings.failure_limit: {out['failure_limit']}: must be between 1 and the window's "
                      f"{out['window_s'] // out['interval_s']} intervals")
    if out["min_requests"] < 1:
        return None, f"settings.min_requests: {out['min_requests']}: must be 1 or more"
    return out, ""


def main():
    module = AnsibleModule(
        argument_spec=dict(url=dict(type="str", required=True), settings=dict(type="dict", required=True),
                           speculative=dict(type="bool", default=True)),
        supports_check_mode=True,
    )
    p = module.params
    try:
        url = sglang_http.check_url(p["url"])
    except sglang_http.UsageError as exc:
        module.fail_json(msg=f"watch: {exc}")
    s, problem = _settings(p["settings"])
    if s is None:
        module.fail_json(msg=f"watch: {problem}")
    th = sglang_watch.Thresholds(min_requests=s["min_requests"], min_accept_length=s["min_accept_length"],
                                 min_tokens_per_s=s["min_tokens_per_s"], max_error_rate=s["max_error_rate"])
    if module.check_mode:
        module.exit_json(
            changed=False, result="check", intervals=[], failed_intervals=0, inconclusive_intervals=0,
            consecutive_failures=0, window_s=s["window_s"], interval_s=s["interval_s"],
            failure_limit=s["failure_limit"], thresholds=th.as_dict(), url=url, seconds=0.0,
            line=(f"would watch {url}/metrics for {s['window_s']} s in intervals of {s['interval_s']} s "
                  f"(failure_limit {s['failure_limit']}, min_requests {s['min_requests']})"))
    out = sglang_watch.watch(url, s["window_s"], s["interval_s"], s["failure_limit"], th,
                             speculative=p["speculative"])
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
