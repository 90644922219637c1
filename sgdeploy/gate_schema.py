"""The config's ``gates:`` section, defined once: every key, its kind, its default and what is allowed.

``sgdeploy.spec`` builds the gates section of its config schema from ``FIELDS`` and checks the values
with ``check``; ``sgdeploy.gate`` takes the defaults of its ``GateThresholds`` from ``DEFAULTS`` and
checks a mapping with the same ``check``. So a default or a bound changes in one place only
(``tests/unit/tool/test_gate.py`` fails if the two ever disagree again). See docs/gates.md.

Standard library only: ``sgdeploy.gate`` imports it on hosts with the system python3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Field:
    kind: str  # float | int | str | bool (the kinds of sgdeploy.spec's schema)
    default: Any
    allowed: str  # what is allowed, as "give ..." text
    ok: Callable[[Any], bool]  # the bound on a value of the right kind
    nullable: bool = False  # null means "not set" (no minimum)


FIELDS: dict[str, Field] = {
    "min_accept_length": Field("float", None, "give a number of 0 or more, or null for no minimum",
                               lambda v: v >= 0, nullable=True),
    "min_tokens_per_s": Field("float", None, "give a number of 0 or more, or null for no minimum",
                              lambda v: v >= 0, nullable=True),
    "max_regression_pct": Field("float", 10.0, "give a percentage between 0 and 100", lambda v: 0 <= v <= 100),
    "smoke_prompt": Field("str", "The capital of France is", "give a non-empty prompt string",
                          lambda v: bool(v.strip())),
    "smoke_max_tokens": Field("int", 32, "give a whole number of 1 or more", lambda v: v >= 1),
    "bench_requests": Field("int", 16, "give a whole number of 1 or more", lambda v: v >= 1),
    "bench_concurrency": Field("int", 4, "give a whole number of 1 or more", lambda v: v >= 1),
    "bench_max_tokens": Field("int", 128, "give a whole number of 1 or more", lambda v: v >= 1),
    "min_completed_fraction": Field("float", 0.9, "give a fraction above 0 and at most 1", lambda v: 0 < v <= 1),
    "warmup_requests": Field("int", 2, "give a whole number of 0 or more", lambda v: v >= 0),
    # The exactness gate (sgdeploy.exactness): the largest top-1/top-2 log-probability gap of the
    # reference, in nats, at which a first differing token still counts as a near-tie flip.
    "exactness_tie_tolerance": Field("float", 0.1, "give a log-probability gap in nats above 0 and at most 5",
                                     lambda v: 0 < v <= 5),
    "exactness_concurrency": Field("int", 4, "give a whole number of 1 or more", lambda v: v >= 1),
    # Without a recorded reference the exactness gate checks the candidate against the target's own prefill on
    # the same server; true refuses that check (the verdict is fail until a reference is recorded).
    "exactness_require_reference": Field("bool", False, "give true or false", lambda v: True),
    # An inconclusive exactness verdict (its requests failed): fail rolls the deploy back, warn records it,
    # shows it on the gate lines and in the verdict line, and lets the deploy stay.
    "exactness_inconclusive": Field("str", "fail", "give fail or warn", lambda v: v in ("fail", "warn")),
}

DEFAULTS: dict[str, Any] = {key: f.default for key, f in FIELDS.items()}


def _kind_ok(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "float":
        return isinstance(value, int | float)
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, str)


def check(key: str, value: Any) -> Any:
    """The value as the gates use it (numbers of kind float as float), or ValueError with what is allowed.

    KeyError for a key that is not a gates setting."""
    f = FIELDS[key]
    if value is None and f.nullable:
        return None
    if not _kind_ok(f.kind, value) or not f.ok(value):
        raise ValueError(f.allowed)
    return float(value) if f.kind == "float" else value
