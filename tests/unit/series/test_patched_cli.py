"""The patched wheel's command line, parsed by SGLang itself on the CPU.

A CPU virtualenv (build/cpu-venv: torch 2.13 CPU and the light dependencies that
`sglang.srt.server_args` imports) is made when missing. The patched wheel (the whole series) and the
stock wheel are each installed with `--no-deps` into their own `--target` directory, and
`prepare_server_args` parses a full DDTree command line: the patched wheel returns the budget and
top-k cap and resolves the switches `--speculative-ddtree-state-forking` (on),
`--speculative-ddtree-topk` (fused) and `--speculative-ddtree-tree-conv` (parents) to their
defaults or the values given, rejects a value outside their choices, and leaves them unset for
DFLASH; the stock wheel rejects the DDTree flags, and a cap larger than the budget is refused with
a message.

Slow (minutes when the venv must be made; about 30 s when it exists): `pytest -m slow`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sgdeploy import patchset, wheel

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent  # torchvision_standin.py
CPU_VENV = Path(os.environ.get("SGDEPLOY_CPU_VENV", REPO / "build" / "cpu-venv"))
# What `from sglang.srt.server_args import prepare_server_args` needs on the CPU
# (/work/shared/docs/sglang-0.5.23.md, "Running SGLang code without the whole server"),
# pinned to versions known to work together.
CPU_REQUIREMENTS = [
    "torch==2.13.0", "numpy==2.4.6", "orjson==3.13.0", "psutil==7.2.2", "pybase64==1.5.1",
    "requests==2.34.2", "pillow==13.0.0", "ipython==9.18.1", "pydantic==2.14.4", "fastapi==0.165.0",
    "uvicorn==0.54.0", "transformers==5.24.0", "msgspec==0.22.0", "pyzmq==27.3.0", "setproctitle==1.3.8",
    "aiohttp==3.14.5", "uvloop==0.23.0", "prometheus-client==0.26.0", "tqdm==4.70.1",
    "sentencepiece==0.2.3", "tiktoken==0.14.0", "einops==0.8.2", "triton==3.8.0", "dill==0.4.1",
    # What importing the DDTree worker / decode modules adds (test_ddtree_plumbing.py), all small:
    # tvm_ffi (kernel loader, imported by the KV pools), compressed_tensors and gguf (quantization
    # registry), openai and partial_json_parser (the OpenAI protocol and function-call parsers that
    # ScheduleBatch's grammar module pulls in). Pins of 0.5.23's METADATA where it has one.
    "apache-tvm-ffi==0.1.11", "compressed-tensors==0.18.0", "gguf==0.19.0", "openai==2.8.0",
    "partial-json-parser==0.2.1.1.post7",
]  # fmt: skip
IMPORT_PROBE = "import torch, transformers, fastapi, pydantic, zmq, orjson, msgspec, uvloop, triton, IPython, dill"
# Every package of CPU_REQUIREMENTS is installed (a venv made before a package was added lacks it).
INSTALLED_PROBE = "import importlib.metadata as m, sys\nfor r in sys.argv[1:]: m.version(r.split('==')[0])"

# Parse with SGLang's own parser, then run its speculative-decoding resolution hook (the full
# resolve_once() would need the model weights' stack); report what it resolved, or the rejection.
PARSE = r"""
import json, sys

import torchvision_standin  # tests/unit/series, on PYTHONPATH

torchvision_standin.install()
from sglang.srt.server_args import prepare_server_args
try:
    args = prepare_server_args(sys.argv[1:])
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    handle_speculative_decoding(args)
    a = resolving_view(args)
except SystemExit as exc:
    print(json.dumps({"rejected": "exit", "code": exc.code}))
except Exception as exc:
    print(json.dumps({"rejected": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({k: getattr(a, k, None) for k in (
        "speculative_algorithm", "speculative_ddtree_budget", "speculative_ddtree_topk_cap",
        "speculative_num_draft_tokens", "speculative_dflash_block_size",
        "speculative_ddtree_state_forking", "speculative_ddtree_topk", "speculative_ddtree_tree_conv",
        "speculative_ddtree_budget_schedule")}))
"""


# Tiny model configs: the resolution reads the target's and the drafter's config.json.
TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip
DRAFT_CONFIG = {
    **TARGET_CONFIG, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "block_size": 16,
    "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 1000},
}  # fmt: skip


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for name, config in (("target", TARGET_CONFIG), ("draft", DRAFT_CONFIG)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root


def ddtree_line(models: Path, budget: int, cap: int, *switches: str) -> list[str]:
    return [*dflash_line(models, "DDTREE"),
        "--speculative-ddtree-budget", str(budget), "--speculative-ddtree-topk-cap", str(cap), *switches,
    ]  # fmt: skip


def dflash_line(models: Path, algorithm: str = "DFLASH") -> list[str]:
    return [
        "--model-path", str(models / "target"), "--host", "127.0.0.1", "--port", "30000",
        "--tp-size", "1", "--device", "cuda", "--attention-backend", "triton", "--page-size", "1",
        "--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(models / "draft"),
        "--speculative-dflash-block-size", "16",
    ]  # fmt: skip


@pytest.fixture(scope="session")
def cpu_python() -> Path:
    py = CPU_VENV / "bin" / "python"
    if py.exists() and all(
        subprocess.run([py, "-c", probe, *CPU_REQUIREMENTS], capture_output=True).returncode == 0
        for probe in (IMPORT_PROBE, INSTALLED_PROBE)
    ):
        return py
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(CPU_VENV)], check=True)
    proc = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *CPU_REQUIREMENTS],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert proc.returncode == 0, f"making {CPU_VENV} failed:\n{proc.stderr[-3000:]}"
    return py


@pytest.fixture(scope="session")
def downloads() -> Path:
    pins = wheel.load_pins()
    pin = pins.for_python("3.11")
    d = wheel.DEFAULT_DOWNLOADS
    local = Path("/tmp/whl") / pin.file
    if not (d / pin.file).is_file() and local.is_file():
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, d / pin.file)
    wheel.fetch_upstream(pins, pin, d, log=lambda m: None)
    return d


def install(built: wheel.BuildResult, target: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
         "--target", str(target), str(built.wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return target


@pytest.fixture(scope="session")
def site_dirs(tmp_path_factory, downloads) -> dict[str, tuple[wheel.BuildResult, Path]]:
    series = patchset.load()
    if "ddtree" not in series.features():
        pytest.skip(f"{series.path} has no ddtree patch yet")
    out = tmp_path_factory.mktemp("wheels")
    quiet = lambda m: None  # noqa: E731
    patched = wheel.build(series.select(series.features()), "3.11", out, downloads, log=quiet)
    stock = wheel.build([], "3.11", out, downloads, log=quiet)
    return {
        "patched": (patched, install(patched, tmp_path_factory.mktemp("patched-site"))),
        "stock": (stock, install(stock, tmp_path_factory.mktemp("stock-site"))),
    }


def parse(cpu_python: Path, site: Path, argv: list[str]) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(site), str(HERE))), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [cpu_python, "-c", PARSE, *argv], capture_output=True, text=True, env=env, timeout=600, cwd=site
    )
    last = proc.stdout.strip().splitlines()[-1:] or ["{}"]
    try:
        return json.loads(last[0]), proc.stderr
    except json.JSONDecodeError:
        raise AssertionError(f"no result from the parser (exit {proc.returncode}):\n{proc.stderr[-3000:]}") from None


def test_patched_wheel_parses_a_ddtree_command_line(cpu_python, site_dirs, models):
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, ddtree_line(models, 15, 8))
    assert "rejected" not in got, f"{got} {err[-2000:]}"
    assert got["speculative_algorithm"] == "DDTREE"
    assert got["speculative_ddtree_budget"] == 15
    assert got["speculative_ddtree_topk_cap"] == 8
    # Verify width is budget + 1 while the drafter keeps its block size.
    assert got["speculative_num_draft_tokens"] == 16
    assert got["speculative_dflash_block_size"] == 16
    # The switches default to what every patched build does unless told otherwise.
    assert got["speculative_ddtree_state_forking"] == "on"
    assert got["speculative_ddtree_topk"] == "fused"
    assert got["speculative_ddtree_tree_conv"] == "parents"


def test_patched_wheel_takes_the_switches_off(cpu_python, site_dirs, models):
    built, site = site_dirs["patched"]
    line = ddtree_line(models, 15, 8, "--speculative-ddtree-state-forking", "off", "--speculative-ddtree-topk", "torch",
                       "--speculative-ddtree-tree-conv", "upstream")
    got, err = parse(cpu_python, site, line)
    assert "rejected" not in got, f"{got} {err[-2000:]}"
    assert got["speculative_ddtree_state_forking"] == "off" and got["speculative_ddtree_topk"] == "torch"
    assert got["speculative_ddtree_tree_conv"] == "upstream"
    assert got["speculative_ddtree_budget"] == 15


@pytest.mark.parametrize("flag, value", [("--speculative-ddtree-state-forking", "maybe"),
                                         ("--speculative-ddtree-topk", "cuda"),
                                         ("--speculative-ddtree-tree-conv", "search")])
def test_patched_wheel_rejects_a_switch_value_outside_its_choices(cpu_python, site_dirs, models, flag, value):
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, ddtree_line(models, 15, 8, flag, value))
    assert got == {"rejected": "exit", "code": 2}, f"{got} {err[-2000:]}"
    assert flag in err and repr(value) in err, err[-2000:]


def test_dflash_leaves_the_ddtree_switches_unset(cpu_python, site_dirs, models):
    """The upstream files test these switches before entering DDTree code: None for DFLASH."""
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, dflash_line(models))
    assert "rejected" not in got, f"{got} {err[-2000:]}"
    assert got["speculative_algorithm"] == "DFLASH" and got["speculative_num_draft_tokens"] == 16
    assert got["speculative_ddtree_state_forking"] is None and got["speculative_ddtree_topk"] is None
    assert got["speculative_ddtree_tree_conv"] is None


def test_stock_wheel_rejects_the_same_line(cpu_python, site_dirs, models):
    built, site = site_dirs["stock"]
    assert built.label == "stock"
    got, err = parse(cpu_python, site, ddtree_line(models, 15, 8))
    assert got.get("rejected"), got
    assert "ddtree" in err.lower() or "DDTREE" in got.get("message", ""), err[-2000:]


def test_cap_above_budget_is_rejected_with_a_message(cpu_python, site_dirs, models):
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, ddtree_line(models, 4, 8))
    assert got.get("rejected") == "ValueError", f"{got} {err[-2000:]}"
    assert "--speculative-ddtree-topk-cap (8)" in got["message"]
    assert "--speculative-ddtree-budget (4)" in got["message"]


def schedule_line(models: Path, schedule: str, *more: str) -> list[str]:
    return [*dflash_line(models, "DDTREE"), "--speculative-ddtree-budget-schedule", schedule, *more]


def test_a_budget_schedule_sizes_the_server_for_its_largest_budget(cpu_python, site_dirs, models):
    """Patch 0005: the budget defaults to the schedule's largest (the verify width, KV reservation and graphs are
    sized for it), the cap to min(8, its smallest), and the schedule comes back normalised."""
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, schedule_line(models, " 1:64, 4:32 ,8:15"))
    assert "rejected" not in got, f"{got} {err[-2000:]}"
    assert got["speculative_ddtree_budget"] == 64 and got["speculative_num_draft_tokens"] == 65
    assert got["speculative_ddtree_topk_cap"] == 8
    assert got["speculative_ddtree_budget_schedule"] == "1:64,4:32,8:15"
    assert got["speculative_dflash_block_size"] == 16
    # without a schedule the field stays None, as every switch does
    plain, err = parse(cpu_python, site, ddtree_line(models, 15, 8))
    assert plain["speculative_ddtree_budget_schedule"] is None, err[-2000:]


@pytest.mark.parametrize("line, words", [
    (["--speculative-ddtree-budget", "32"], ["--speculative-ddtree-budget (32)", "largest budget", "(64)"]),
    (["--speculative-ddtree-topk-cap", "16"], ["--speculative-ddtree-topk-cap (16)", "smallest budget", "(15)"]),
])
def test_a_schedule_that_contradicts_the_budget_or_the_cap_is_refused(cpu_python, site_dirs, models, line, words):
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, schedule_line(models, "1:64,4:32,8:15", *line))
    assert got.get("rejected") == "ValueError", f"{got} {err[-2000:]}"
    for w in words:
        assert w in got["message"], got["message"]


@pytest.mark.parametrize("schedule, words", [("4:32,8:15", "must start at min_batch 1"),
                                             ("1:64,8:15,4:32", "must rise strictly"),
                                             ("1:64,8:zero", "not min_batch:budget")])
def test_a_malformed_schedule_is_refused_with_one_line(cpu_python, site_dirs, models, schedule, words):
    built, site = site_dirs["patched"]
    got, err = parse(cpu_python, site, schedule_line(models, schedule))
    assert got.get("rejected") == "ValueError", f"{got} {err[-2000:]}"
    assert "--speculative-ddtree-budget-schedule" in got["message"] and words in got["message"], got["message"]
