"""Start the Rust router of the pinned sglang-router wheel (installed by the role sglang_router).

The same steps as the wheel's own `python -m sglang_router.launch_router` (parse RouterArgs from the
command line, validate, Router.from_args(...).start()), without the one import that module makes at
load time of the Python MiniLB, a debugging-only balancer that pulls in fastapi, uvicorn, aiohttp,
orjson and setproctitle. The Rust router needs none of them, so the venv holds only the hash-checked
wheel (docs/router.md).

Keys come from the environment (the unit's EnvironmentFile, /etc/sglang/router-<port>.env, 0640
root:sglang-router), never from the command line, and are taken out of the environment before the
router starts:

- SGLANG_ROUTER_CONTROL_KEY: the control plane's admin key (0.3.2's --control-plane-api-keys): the
  worker API (GET/POST /workers, DELETE /workers/<id>) answers 401 without it;
- SGLANG_ROUTER_API_KEY (when the config names serving.api_key_secret): the engines' API key, which the
  router sends to them and asks of its own clients (0.3.2's --api-key).
"""

import argparse
import os
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
    if args.api_key or args.control_plane_api_keys:
        parser.error("--api-key / --control-plane-api-keys: keys come from the environment file, never argv")
    control_key = os.environ.pop("SGLANG_ROUTER_CONTROL_KEY", "")
    api_key = os.environ.pop("SGLANG_ROUTER_API_KEY", "")
    if not control_key:
        parser.error("SGLANG_ROUTER_CONTROL_KEY is not set (the unit's EnvironmentFile): the worker API would "
                     "answer anyone on the host")
    # (id, name, key, role), as RouterArgs._parse_control_plane_api_keys gives them.
    args.control_plane_api_keys = [("sgdeploy", "sgdeploy", control_key, "admin")]
    if api_key:
        args.api_key = api_key
    args._validate_router_args()  # noqa: SLF001 - upstream launch_router calls it the same way
    Router.from_args(args).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
