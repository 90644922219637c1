"""Start the Rust router of the pinned sglang-router wheel (installed by the role sglang_router).

The same steps as the wheel's own `python -m sglang_router.launch_router` (parse RouterArgs from the
command line, validate, Router.from_args(...).start()), without the one import that module makes at
load time of the Python MiniLB, a debugging-only balancer that pulls in fastapi, uvicorn, aiohttp,
orjson and setproctitle. The Rust router needs none of them, so the venv holds only the hash-checked
wheel (docs/router.md).
"""

import argparse
import sys

from sglang_router.router import Router
from sglang_router.router_args import RouterArgs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang-router-launch",
                                     description="the Rust router of sglang-router (no MiniLB)")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    if args.mini_lb:
        parser.error("--mini-lb: the Python MiniLB is for debugging only and is not installed here")
    args._validate_router_args()  # noqa: SLF001 - upstream launch_router calls it the same way
    Router.from_args(args).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
