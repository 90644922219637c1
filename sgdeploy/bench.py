"""The benchmark's command line (``sgdeploy bench``); the benchmark itself is the gate module's code,
``sglang_gate_bench`` in the collection's module_utils, which the installed ``sgdeploy`` package
carries (docs/gates.md, "One implementation").

Command line (exit 0 all requests completed, 1 some failed, 2 misuse)::

    python -m sgdeploy.bench --url URL [--requests N] [--concurrency C] [--max-tokens M]
                             [--timeout S] [--prompts FILE] [--json]
"""

from __future__ import annotations

import json
import sys

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_gate_bench import (  # noqa: F401
    DEFAULT_PROMPTS,
    BenchError,
    BenchResult,
    Prompt,
    RequestSample,
    accept_length,
    load_prompts,
    parse_prompts,
    prompts_digest,
    run,
    summarise,
)

from sgdeploy import serving


def main(argv: list[str] | None = None) -> int:
    parser = serving._Parser(prog="python -m sgdeploy.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="http://HOST:PORT of the service")
    parser.add_argument("--requests", type=serving._positive(int), default=16)
    parser.add_argument("--concurrency", type=serving._positive(int), default=4)
    parser.add_argument("--max-tokens", type=serving._positive(int), default=128)
    parser.add_argument("--timeout", type=serving._positive(float), default=300.0, help="seconds for the run")
    parser.add_argument("--prompts", help=f"JSON-lines prompt file (default {DEFAULT_PROMPTS})")
    parser.add_argument("--json", action="store_true", help="print the BenchResult as JSON")
    args = parser.parse_args(argv)
    try:
        result = run(args.url, load_prompts(args.prompts), args.requests, args.concurrency, args.max_tokens,
                     args.timeout)
    except (BenchError, serving.UsageError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json else result.summary())
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
