# Copyright: sgdeploy contributors. Apache-2.0
"""Talking to a running SGLang service over HTTP: one greedy /generate request, /health.

Standard library only: shipped to the host by Ansible with the gate module (sgdeploy.host.sglang_gate),
and imported by the controller's ``sgdeploy.serving`` (the one implementation, docs/gates.md).

An engine with an API key (``serving.api_key_secret``) asks every route except ``/health*`` and
``/metrics`` for ``Authorization: Bearer <key>``. A caller on the host reads the key there
(``sglang_deploy_units.engine_key``) and calls ``authorize(url, key)`` for the config's own service
URLs; every request of this process to that origin (scheme, host, port), and to no other, then sends
it. The key is never returned, logged or put in an error message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request


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


def _request(method: str, url: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
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
        status, raw = _request("POST", base_url + "/generate", body, timeout)
    except OSError as err:
        raise ServingError(f"/generate failed: {_reason(err)}") from None
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


def _reason(err: BaseException) -> str:
    """The cause of a failed exchange in a few words ("Connection refused", "timed out")."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err = err.reason if isinstance(err.reason, BaseException) else Exception(str(err.reason))
    if isinstance(err, TimeoutError):
        return "timed out"
    return (err.strerror if isinstance(err, OSError) else None) or str(err) or type(err).__name__


def _refused(err: BaseException) -> bool:
    """True when nothing listens at the address (as opposed to a slow or broken answer)."""
    if isinstance(err, urllib.error.URLError):
        err = err.reason
    return isinstance(err, ConnectionRefusedError)


def is_healthy(base_url: str, timeout: float = 5.0) -> bool:
    """True when ``/health`` answers HTTP 200 (SGLang answers 503 while starting or draining)."""
    try:
        status, _ = _request("GET", base_url + "/health", None, timeout)
    except OSError:
        return False
    return status == 200
