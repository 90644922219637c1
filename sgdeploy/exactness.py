"""The exactness gate's command line (``sgdeploy exactness``); the comparison, the references and the
prompts are the gate module's code, ``sglang_gate_exactness`` in the collection's module_utils
(the installed ``sgdeploy`` package carries it; docs/gates.md).

Command line (exit 0 ok, 1 a failure or not comparable, 2 misuse)::

    python -m sgdeploy.exactness reference-config CONFIG --out FILE.yml   # the target-alone config (controller)
    python -m sgdeploy.exactness compare REFERENCE.json CANDIDATE.json [--tolerance NATS] [--json]
    python -m sgdeploy.exactness collect --url URL --out FILE.json [--concurrency C] [--timeout S]
    python -m sgdeploy.exactness self-check --url URL [--tolerance NATS] [--concurrency C] [--timeout S] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_selfcheck as selfcheck  # noqa: F401
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_gate_exactness import (  # noqa: F401
    FAIL,
    HOW_TO_MAKE,
    INCONCLUSIVE,
    KIND,
    MAX_NEW_TOKENS,
    PASS,
    TOP_N,
    ExactnessError,
    Verdict,
    ask,
    build_reference,
    collect,
    comparable,
    compare,
    load_prompts,
    model_identity,
    parse_answer,
    read_reference,
    reference_path,
    write_reference,
)
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_gate_selfcheck import self_check  # noqa: F401

from sgdeploy import bench, records, serving

# --- command line ---------------------------------------------------------------------------------------------------

def reference_config(name: str) -> dict:
    """The config that runs the target of ``name`` alone: ``extends`` it with speculation off, no drafter,
    and no speed minimum (a speculative config's minimum does not apply to the target alone)."""
    nulls = dict.fromkeys(("block_size", "budget", "topk_cap", "state_forking", "fused_topk",
                           "reproduce_state_leak"))
    return {"extends": name, "description": f"the target of {name} alone: the exactness reference",
            "drafter": None, "speculative": {"algorithm": "NONE", **nulls},
            "gates": {"min_accept_length": None, "min_tokens_per_s": None}}


def main(argv: list[str] | None = None) -> int:
    parser = serving._Parser(prog="python -m sgdeploy.exactness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("reference-config", help="write the target-alone config of CONFIG (JSON is YAML)")
    p.add_argument("config")
    p.add_argument("--out", required=True)
    p = sub.add_parser("compare", help="judge candidate answers against a reference")
    p.add_argument("reference")
    p.add_argument("candidate", help="a JSON list of answers as `collect --out` writes them")
    p.add_argument("--tolerance", type=serving._positive(float), default=None,
                   help="near-tie tolerance in nats (default: gates.exactness_tie_tolerance's default)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("collect", help="ask a service the exactness prompts and write the answers")
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--concurrency", type=serving._positive(int), default=4)
    p.add_argument("--timeout", type=serving._positive(float), default=600.0)
    p = sub.add_parser("self-check", help="check a service's greedy answers against its target's own prefill")
    p.add_argument("--url", required=True)
    p.add_argument("--tolerance", type=serving._positive(float), default=None,
                   help="near-tie tolerance in nats (default: gates.exactness_tie_tolerance's default)")
    p.add_argument("--concurrency", type=serving._positive(int), default=4)
    p.add_argument("--timeout", type=serving._positive(float), default=600.0)
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "self-check":
        return _self_check(parser, args)
    try:
        if args.command == "reference-config":
            name = args.config
            if "/" in name or name.endswith((".yml", ".yaml")):
                raise ExactnessError(f"reference-config {name!r}: give the name of a config in configs/ "
                                     "(the reference config extends it by name)")
            out = Path(args.out)
            if not out.parent.is_dir():
                raise ExactnessError(f"--out {out}: its folder does not exist")
            records.write_json(out, reference_config(name))
            print(out)
            return 0
        if args.command == "collect":
            outputs, errors = collect(args.url, load_prompts(), args.concurrency, args.timeout, top_needed=False)
            records.write_json(args.out, outputs)
            for e in errors:
                print(e, file=sys.stderr)
            return 1 if errors else 0
        from sgdeploy import gate_schema

        tolerance = args.tolerance or gate_schema.DEFAULTS["exactness_tie_tolerance"]
        reference = read_reference(args.reference)
        candidate = records.read_json(args.candidate, f"candidate {args.candidate}", ExactnessError)
        if not isinstance(candidate, list) or not all(isinstance(c, dict) for c in candidate):
            raise ExactnessError(f"candidate {args.candidate}: expected a JSON list of answers")
    except (ExactnessError, serving.UsageError, bench.BenchError, OSError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    v = compare(reference, candidate, tolerance)
    print(json.dumps(v.__dict__, indent=2, sort_keys=True) if args.json else f"{v.verdict.upper()}: {v.reason}")
    return 0 if v.verdict == PASS else 1


def _self_check(parser, args) -> int:
    from sgdeploy import gate_schema

    tolerance = args.tolerance or gate_schema.DEFAULTS["exactness_tie_tolerance"]
    try:
        v = self_check(args.url, load_prompts(), tolerance, args.concurrency, args.timeout)
    except (serving.UsageError, bench.BenchError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(v.__dict__, indent=2, sort_keys=True) if args.json else f"{v.verdict.upper()}: {v.reason}")
    return 0 if v.verdict == PASS else 1


if __name__ == "__main__":
    sys.exit(main())
