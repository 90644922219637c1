"""SGLang 0.5.23's own command line, as a table: every option string of its parser and the field it sets.

`serving.extra_args` may not set what the config manages (sgdeploy.spec.MANAGED_DESTS), whatever the
spelling: SGLang's parser knows aliases (`--tp` ... `--tensor-parallel-size` for `--tp-size`) and,
being a plain `argparse.ArgumentParser`, takes any unique prefix of a long option (`--tp-s`,
`--mem-frac`) and the `--flag=value` form. The table is generated from the pristine wheel
(patches/sglang/upstream.yml) by SGLang's own `ServerArgs.add_cli_args` on the CPU and committed
(sgdeploy/sglang_flags.json); `tests/unit/series/test_sglang_flags.py` (slow) regenerates it and checks it equals
the committed file:

    python -m sgdeploy.sglang_flags --python build/cpu-venv/bin/python [--out sgdeploy/sglang_flags.json]

The patched series adds the DDTree switches (PATCHED_FLAGS below); they resolve like the others.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

TABLE_PATH = Path(__file__).resolve().parent / "sglang_flags.json"

# The patched series' flags (patches/sglang/, docs/ddtree.md): not in the pristine wheel's parser.
PATCHED_FLAGS = {
    "--speculative-ddtree-budget": "speculative_ddtree_budget",
    "--speculative-ddtree-topk-cap": "speculative_ddtree_topk_cap",
    "--speculative-ddtree-state-forking": "speculative_ddtree_state_forking",
    "--speculative-ddtree-topk": "speculative_ddtree_topk",
    "--speculative-ddtree-tree-conv": "speculative_ddtree_tree_conv",
    "--speculative-ddtree-budget-schedule": "speculative_ddtree_budget_schedule",
}

# Run by the CPU venv's Python with the installed wheel on PYTHONPATH: SGLang's own parser, every
# option string and the field (dest) it sets.
DUMP = r"""
import argparse, json, sys
try:
    import torchvision_standin
    torchvision_standin.install()
except ImportError:
    pass
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
table = {o: a.dest for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}
print(json.dumps({"allow_abbrev": parser.allow_abbrev, "flags": dict(sorted(table.items()))}))
"""


@functools.lru_cache(maxsize=1)
def table() -> dict[str, str]:
    """Option string -> dest: the committed table of the pristine 0.5.23 parser plus the patched flags."""
    data = json.loads(TABLE_PATH.read_text())
    return {**data["flags"], **PATCHED_FLAGS}


def resolve(arg: str) -> tuple[str, set[str]]:
    """What SGLang's parser makes of one argument that starts with '-': (the option as written, the
    dests it may set). An exact option string sets its own dest; otherwise argparse takes a unique
    prefix of a long option (several matches are an error at start: all of them are returned, so a
    caller can refuse any that it manages). `--flag=value` is the flag. Empty: not a flag SGLang knows."""
    flags = table()
    written = arg.split("=", 1)[0] if arg.startswith("--") else arg
    if written in flags:
        return written, {flags[written]}
    if not written.startswith("--") or len(written) < 3:
        # A single-dash word: argparse takes its first two characters as a short option with the rest
        # as its value (`-X4`); SGLang 0.5.23 has no short options except -h.
        short = flags.get(arg[:2]) if arg.startswith("-") and not arg.startswith("--") else None
        return written, ({short} if short else set())
    return written, {dest for option, dest in flags.items() if option.startswith(written)}


def generate(python: Path, site: Path, extra_path: Sequence[Path] = ()) -> dict:
    """The table from the SGLang installed in `site`, by its own parser, with `python` (a CPU venv that
    has SGLang's import-time dependencies)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(Path(p).absolute()) for p in (site, *extra_path)),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([str(Path(python).absolute()), "-c", DUMP], capture_output=True, text=True, env=env, cwd=site,
                          timeout=600, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"SGLang's parser did not load (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    data = json.loads(lines[-1])
    if not data["allow_abbrev"]:
        raise RuntimeError("SGLang's parser no longer takes abbreviations: sgdeploy.sglang_flags.resolve assumes it")
    return {"sglang": "0.5.23", "generated_by": "python -m sgdeploy.sglang_flags", "flags": data["flags"]}


def install_pristine(target: Path, python_version: str = "3.11") -> Path:
    """The pinned pristine wheel (downloaded and hash-checked by sgdeploy.wheel) installed into `target`."""
    from sgdeploy import wheel

    pins = wheel.load_pins()
    pin = pins.for_python(python_version)
    upstream = wheel.fetch_upstream(pins, pin, wheel.DEFAULT_DOWNLOADS, log=lambda m: None)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                           "--target", str(target), str(upstream)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {upstream} into {target} failed: {proc.stderr.strip()[-2000:]}")
    return target


def dump(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgdeploy.sglang_flags", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", type=Path, required=True, help="a CPU venv's python with SGLang's dependencies")
    ap.add_argument("--out", type=Path, default=TABLE_PATH)
    ap.add_argument("--extra-path", type=Path, action="append", default=[],
                    help="more PYTHONPATH entries (tests/unit/series for its torchvision stand-in)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-flags-") as tmp:
        version = subprocess.run([str(args.python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        site = install_pristine(Path(tmp) / "site", version)
        data = generate(args.python, site, args.extra_path)
    args.out.write_text(dump(data))
    print(f"{args.out}: {len(data['flags'])} option strings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
