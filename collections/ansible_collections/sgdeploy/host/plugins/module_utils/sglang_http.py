# Copyright: sgdeploy contributors. Apache-2.0
"""The project's one HTTP/health helper for a running SGLang service (or the router in front of replicas).

``/health`` (``is_healthy``, and ``wait_healthy``, which also watches the systemd unit), one greedy
``/generate`` request (``generate``; ``answer`` for the deploy's short "does it answer text" check), the
exchange underneath (``request``) and the engine's API key (``authorize``). Every caller uses it: on hosts
the modules ``sgdeploy.host.sglang_deploy_wait``, ``sglang_deploy_status``, ``sglang_replicas_plan`` and the
gates (Ansible ships it with them); on the controller ``sgdeploy.serving`` (warm-up, drain) and the
controller's gate commands import it from the installed ``sgdeploy`` package, which carries this
collection's module_utils (docs/gates.md, "One implementation").

Standard library only: a host runs it with its system python3, which has nothing else. For the same reason
``/metrics`` is not parsed here: the controller parses it with ``prometheus_client`` (``sgdeploy.serving``);
the one host module that reads metrics, the post-deploy watch, sums four counters with its own minimal
parser (``sglang_watch.parse``).

An engine with an API key (``serving.api_key_secret``) asks every route except ``/health*`` and
``/metrics`` for ``Authorization: Bearer <key>``. A caller on the host reads the key there
(``sglang_deploy_units.engine_key``) and calls ``authorize(url, key)`` for the config's own service
URLs; every request of this process to that origin (scheme, host, port), and to no other, then sends
it. The key is never returned, logged or put in an error message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units


class ServingError(Exception):
    """A service did not do what was asked (down, wrong answer, timed out): one line for people."""


class UsageError(ValueError):
    """Bad input from the caller (a malformed URL, a negative count): one line naming the value."""


def check_url(url: str) -> str:
    """Return ``url`` without a trailing slash, or raise UsageError naming what is wrong."""
    parsed = urllib.parse.urlsplit(url or "")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"--url {url!r} is not a service address; expected http://HOST:PORT")
    try:
        _ = parsed.port
    except ValueError:
        raise UsageError(f"--url {url!r} has a bad port; expected http://HOST:PORT") from None
    return url.rstrip("/")


# The engines' API keys this process sends, by origin (scheme, host, port): set by authorize() only.
_KEYS: dict[tuple[str, str, int | None], str] = {}


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port filled in from the scheme; ('', '', None) when malformed."""
    parsed = urllib.parse.urlsplit(url or "")
    try:
        port = parsed.port
    except ValueError:
        return "", "", None
    scheme = parsed.scheme.lower()
    return scheme, (parsed.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def authorize(url: str, key: str | None) -> None:
    """Send ``key`` as ``Authorization: Bearer`` on every later request of this process to ``url``'s origin
    (and to no other); an empty key forgets it. ``url`` must be a service address (UsageError otherwise)."""
    origin = _origin(check_url(url))
    if key:
        _KEYS[origin] = key
    else:
        _KEYS.pop(origin, None)


def headers_for(url: str) -> dict[str, str]:
    """The headers a request to ``url`` carries besides its body's: the bearer key of its origin, if any."""
    key = _KEYS.get(_origin(url))
    return {"Authorization": f"Bearer {key}"} if key else {}


def request(method: str, url: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP exchange. Returns (status, body); raises OSError when nothing answers. Sends the bearer
    key of ``url``'s origin when ``authorize`` gave one."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers_for(url))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=max(timeout, 0.05)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read() or b""


def generate(base_url: str, text: str, max_new_tokens: int, timeout: float,
             ignore_eos: bool = True) -> dict:
    """Send one greedy ``/generate`` request and return the decoded response.

    The answer has ``text`` and ``meta_info``; raises ServingError when the service does not
    answer with HTTP 200 and a JSON object.
    """
    body = {
        "text": text,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos},
    }
    try:
        status, raw = request("POST", base_url + "/generate", body, timeout)
    except OSError as err:
        raise ServingError(f"/generate failed: {reason(err)}") from None
    if status != 200:
        snippet = raw[:200].decode(errors="replace").strip()
        raise ServingError(f"/generate answered HTTP {status}: {snippet}")
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ServingError("/generate answered something that is not JSON") from None
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    if not isinstance(answer, dict) or not isinstance(answer.get("meta_info", {}), dict):
        raise ServingError("/generate answered JSON without the expected text and meta_info")
    return answer


def reason(err: BaseException) -> str:
    """The cause of a failed exchange in a few words ("Connection refused", "timed out")."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err = err.reason if isinstance(err.reason, BaseException) else Exception(str(err.reason))
    if isinstance(err, TimeoutError):
        return "timed out"
    return (err.strerror if isinstance(err, OSError) else None) or str(err) or type(err).__name__


def refused(err: BaseException) -> bool:
    """True when nothing listens at the address (as opposed to a slow or broken answer)."""
    cause = err.reason if isinstance(err, urllib.error.URLError) else err
    return isinstance(cause, ConnectionRefusedError)


def is_healthy(base_url: str, timeout: float = 5.0) -> bool:
    """True when ``/health`` answers HTTP 200 (SGLang answers 503 while starting or draining)."""
    try:
        status, _ = request("GET", base_url.rstrip("/") + "/health", None, timeout)
    except OSError:
        return False
    return status == 200


def answer(url: str, timeout: float = 60.0) -> str:
    """One short greedy /generate request (the deploy's check that a healthy engine answers text): '' when it
    answered with text, else why not, in a few words."""
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    try:
        status, raw = request("POST", url.rstrip("/") + "/generate", body, timeout)
    except OSError as err:
        return f"/generate failed: {err}"
    if status != 200:
        return f"/generate answered HTTP {status}"
    try:
        data = json.loads(raw)
    except ValueError:
        return "/generate answered something that is not JSON"
    data = data[0] if isinstance(data, list) and data else data
    return "" if isinstance(data, dict) and data.get("text") else "/generate answered no text"


def unit_problem(unit: str, baseline: int) -> str:
    """Why ``unit`` cannot become healthy any more (failed, stopped, restarted since the baseline), or ''.

    ``baseline`` is the unit's NRestarts when the wait began: systemd's count is cumulative until
    ``systemctl reset-failed``, so only growth against it says the unit crashed during this wait."""
    props = units.show(unit, "ActiveState", "NRestarts")
    value = props.get("NRestarts") or ""
    restarts = int(value) if value.isdigit() else 0
    if restarts > baseline:
        return f"{unit} restarted {restarts - baseline} time(s) since this start"
    if props.get("ActiveState") in ("failed", "inactive"):
        return f"{unit} is {props.get('ActiveState')}"
    return ""


def wait_healthy(url: str, unit: str | None, baseline: int, deadline: float, poll_s: float,
                 interval: float = 1.0, probe_timeout: float = 5.0, clock=time.time,
                 sleep=time.sleep) -> tuple[str, str]:
    """Poll ``/health`` until it answers 200, ``unit`` (when given) can no longer get there (``unit_problem``),
    the ``deadline`` (on ``clock``) or ``poll_s`` seconds of this call have passed.

    Returns (state, detail) with state healthy | exited | timeout | waiting (the call's time is up, the
    deadline is not: an Ansible ``until`` loop calls again).
    """
    url = url.rstrip("/")
    call_end = clock() + poll_s
    while True:
        if is_healthy(url, timeout=probe_timeout):
            return "healthy", f"{url}/health answers 200"
        if unit:
            problem = unit_problem(unit, baseline)
            if problem:
                return "exited", f"{problem} before {url}/health answered 200 (see journalctl -u {unit})"
        now = clock()
        if now >= deadline:
            return "timeout", f"{url}/health did not answer 200 in time"
        if now >= call_end:
            return "waiting", f"{url}/health does not answer 200 yet"
        sleep(min(interval, max(deadline - now, 0.01)))
