"""The simulated SGLang engine (tests/sim/sglang_sim.py), driven as a user sees it: a process on 127.0.0.1.

Each simulator gets its release the way it does on a lab host: a fake `sglang` distribution whose version
carries the release label, put on PYTHONPATH.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from sgdeploy import serving

SIM = Path(__file__).resolve().parents[2] / "sim" / "sglang_sim.py"
HYBRID = "Qwen/Qwen3.6-27B"  # not a local folder: decided from the name
PURE = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = ["--speculative-draft-model-path", "z-lab/Qwen3.6-27B-DFlash"]


def load_model():
    spec = importlib.util.spec_from_file_location("sglang_sim", SIM)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sglang_sim"] = mod
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def release(root: Path, label: str) -> Path:
    """A folder holding a fake sglang distribution 0.5.23+<label>."""
    d = root / f"rel-{label}"
    info = d / f"sglang-0.5.23+{label}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23+{label}\n")
    return d


class Sim:
    def __init__(self, tmp: Path, name: str, label: str | None, args: list[str], env: dict | None = None,
                 port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        e = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
        e.pop("PYTHONPATH", None)
        if label is not None:
            e["PYTHONPATH"] = str(release(tmp, label))
        e.setdefault("SGLANG_SIM_STARTUP_S", "0.3")
        e.update(env or {})
        self.log_file = open(self.log_path, "w")  # closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(SIM), "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=self.log_file, env=e)

    @property
    def log(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text()

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)

    def post(self, path: str, body: dict, **kw) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 60), **kw)

    def first_answer(self, path: str = "/health", within: float = 15.0) -> int:
        """Status of the first answer the server gives (it is retried while nothing listens)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                return self.get(path, timeout=5).status_code
            except requests.ConnectionError:
                if self.proc.poll() is not None:
                    raise AssertionError(f"simulator exited with {self.proc.returncode}:\n{self.log}") from None
                time.sleep(0.02)
        raise AssertionError(f"no answer from {self.url}{path} within {within} s:\n{self.log}")

    def wait_ready(self, within: float = 20.0) -> Sim:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.first_answer(within=within) == 200:
                return self
            time.sleep(0.05)
        raise AssertionError(f"{self.url} not healthy within {within} s:\n{self.log}")

    def generate(self, text: str, max_new: int, temperature: float = 0.0) -> dict:
        r = self.post("/generate", {"text": text, "sampling_params": {"temperature": temperature,
                                                                      "max_new_tokens": max_new}})
        assert r.status_code == 200, r.text
        return r.json()

    def wait_exit(self, within: float = 20.0) -> int:
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"simulator still running after {within} s:\n{self.log}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log_file.close()


def ddtree(budget: int, model: str = HYBRID, block: int = 16) -> list[str]:
    return ["--model-path", model, "--speculative-algorithm", "DDTREE", *DRAFT,
            "--speculative-dflash-block-size", str(block), "--speculative-ddtree-budget", str(budget),
            "--speculative-ddtree-topk-cap", "8", "--attention-backend", "triton", "--trust-remote-code"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Long-running simulators, started together so that their start-ups overlap."""
    tmp = tmp_path_factory.mktemp("sims")
    hybrid_dir = tmp / "hybrid-model"  # a local model folder: decided from config.json, not the name
    hybrid_dir.mkdir()
    (hybrid_dir / "config.json").write_text(json.dumps({
        "model_type": "some_new_arch", "layer_types": ["linear_attention"] * 3 + ["full_attention"]}))
    specs = {
        "main": ("ddtree.fork.topk.abcdef12",
                 ddtree(15) + ["--enable-metrics", "--served-model-name", "qwen", "--unknown-flag", "7",
                               "--another-unknown"], {}),
        "nofork15": ("ddtree.topk.abcdef12", ddtree(15, str(hybrid_dir)), {}),
        "nofork64": ("ddtree.topk.abcdef12", ddtree(64, str(hybrid_dir)), {}),
        "fork64": ("ddtree.fork.topk.abcdef12", ddtree(64, str(hybrid_dir)), {}),
        "pure64": ("ddtree.topk.abcdef12", ddtree(64, PURE), {}),
        "flagoff": ("ddtree.fork.topk.abcdef12",
                    ddtree(15) + ["--speculative-ddtree-state-forking", "off",
                                  "--speculative-ddtree-topk", "torch"], {}),
        "ar": ("stock", ["--model-path", PURE], {}),
        "slow": ("stock", ["--model-path", PURE], {"SGLANG_SIM_SLOWDOWN": "3.0"}),
        "override": ("ddtree.fork.topk.abcdef12", ddtree(15), {"SGLANG_SIM_ACCEPT_OVERRIDE": "3.0"}),
        "never": ("stock", ["--model-path", PURE], {"SGLANG_SIM_NEVER_HEALTHY": "1",
                                                     "SGLANG_SIM_STARTUP_S": "0.1"}),
    }
    sims = {name: Sim(tmp, name, label, args, env) for name, (label, args, env) in specs.items()}
    yield sims
    for s in sims.values():
        s.stop()


def accept(meta: dict) -> float:
    return meta["completion_tokens"] / meta["spec_verify_ct"]


# ------------------------------------------------------------------------------------------------------
# start-up and health
# ------------------------------------------------------------------------------------------------------


def test_health_is_503_while_loading_then_200(tmp_path):
    sim = Sim(tmp_path, "load", "stock", ["--model-path", PURE], {"SGLANG_SIM_STARTUP_S": "1.5"})
    try:
        assert sim.first_answer("/health") == 503
        assert sim.get("/health_generate").status_code == 503
        r = sim.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        assert "fired up" not in sim.log
        sim.wait_ready()
        assert sim.get("/health_generate").status_code == 200
        assert "The server is fired up and ready to roll!" in sim.log
    finally:
        sim.stop()


def test_api_key_asks_bearer_except_on_health_and_metrics_and_is_never_logged(tmp_path):
    key = "sk-sim-test-5e1f0c"
    sim = Sim(tmp_path, "apikey", "stock", ["--model-path", PURE, "--enable-metrics", "--api-key", key])
    try:
        sim.wait_ready()
        assert sim.get("/health_generate").status_code == 200
        assert sim.get("/metrics").status_code == 200
        body = {"text": "hi", "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
        assert sim.post("/generate", body).status_code == 401
        assert sim.post("/generate", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert sim.get("/get_server_info").status_code == 401
        good = {"Authorization": f"Bearer {key}"}
        assert sim.post("/generate", body, headers=good).status_code == 200
        info = sim.get("/get_server_info", headers=good)
        assert info.status_code == 200 and key not in info.text
        assert key not in sim.log
    finally:
        sim.stop()


def test_never_healthy_stays_loading(fleet):
    sim = fleet["never"]
    assert sim.first_answer() == 503
    time.sleep(1.0)  # well past its 0.1 s start-up delay
    assert sim.get("/health").status_code == 503
    assert sim.get("/health_generate").status_code == 503
    assert sim.proc.poll() is None


def test_fail_start_exits_1_after_the_load_delay(tmp_path):
    sim = Sim(tmp_path, "fail", "stock", ["--model-path", PURE],
              {"SGLANG_SIM_FAIL_START": "1", "SGLANG_SIM_STARTUP_S": "0.8"})
    try:
        assert sim.first_answer() == 503  # it binds and answers while "loading"
        assert sim.wait_exit() == 1
        assert "Capture cuda graph failed" in sim.log
        assert "fired up" not in sim.log
    finally:
        sim.stop()


def test_port_in_use_exits_1_with_message(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sim = Sim(tmp_path, "busy", "stock", ["--model-path", PURE], port=port)
        try:
            t0 = time.monotonic()
            assert sim.wait_exit() == 1
            assert time.monotonic() - t0 < 10
            assert f"port 127.0.0.1:{port} is already in use" in sim.log
            assert "Traceback" not in sim.log
        finally:
            sim.stop()


# ------------------------------------------------------------------------------------------------------
# flags and release features
# ------------------------------------------------------------------------------------------------------


def run_cli(tmp_path: Path, label: str | None, args: list[str], env: dict | None = None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIM_")}
    e.pop("PYTHONPATH", None)
    if label:
        e["PYTHONPATH"] = str(release(tmp_path, label))
    e["SGLANG_SIM_STARTUP_S"] = "0"
    e.update(env or {})
    return subprocess.run([sys.executable, str(SIM), "--port", str(free_port()), *args],
                          capture_output=True, text=True, env=e, timeout=30)


@pytest.mark.parametrize("args, flag", [
    (["--speculative-algorithm", "DDTREE"], "--speculative-algorithm"),
    (["--speculative-algorithm", "DFLASH", "--speculative-ddtree-budget", "15"], "--speculative-ddtree-budget"),
    (["--speculative-algorithm", "DFLASH", "--speculative-ddtree-topk-cap=4"], "--speculative-ddtree-topk-cap"),
])
def test_ddtree_flags_on_a_stock_release_exit_2(tmp_path, args, flag):
    r = run_cli(tmp_path, "stock", ["--model-path", HYBRID, *DRAFT, *args])
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert flag in last and "sglang 0.5.23+stock" in last and "ddtree" in last
    assert "Traceback" not in r.stderr


def test_ddtree_is_accepted_on_a_ddtree_release_without_fork(tmp_path):
    r = run_cli(tmp_path, "ddtree.abcdef12", ddtree(15), {"SGLANG_SIM_FAIL_START": "1"})
    assert r.returncode == 1  # got past flag parsing to the (failing) load
    assert "release features: ddtree" in r.stderr and "state forking off" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang installed in this Python")
def test_no_sglang_distribution_is_treated_as_stock(tmp_path):
    r = run_cli(tmp_path, None, ["--model-path", HYBRID, *DRAFT, "--speculative-algorithm", "DDTREE"])
    assert r.returncode == 2
    assert "no sglang distribution" in r.stderr
    assert "--speculative-algorithm" in r.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args, words", [
    (["--port", "70000"], ["--port", "70000", "between 1 and 65535"]),
    (["--tp-size", "two"], ["--tp-size", "'two'"]),
    (["--speculative-algorithm", "EAGLE9"], ["--speculative-algorithm", "EAGLE9", "NONE, DFLASH"]),
    (["--speculative-algorithm", "DFLASH"], ["--speculative-draft-model-path", "DFLASH"]),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, args, words):
    r = run_cli(tmp_path, "stock", ["--model-path", PURE, *args])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("sglang_sim: error: ")
    assert all(w in lines[-1] for w in words), lines[-1]
    assert "Traceback" not in r.stderr


def test_bad_fault_switch_value_exits_1_naming_it(tmp_path):
    r = run_cli(tmp_path, "stock", ["--model-path", PURE], {"SGLANG_SIM_SLOWDOWN": "fast"})
    assert r.returncode == 1
    assert "SGLANG_SIM_SLOWDOWN='fast'" in r.stderr and "Traceback" not in r.stderr


def test_unknown_flags_warn_but_run(fleet):
    sim = fleet["main"].wait_ready()
    assert "ignoring unknown arguments (not simulated): --unknown-flag 7 --another-unknown" in sim.log
    info = sim.get("/get_server_info").json()
    assert info["served_model_name"] == "qwen" and info["model_path"] == HYBRID


# ------------------------------------------------------------------------------------------------------
# the API
# ------------------------------------------------------------------------------------------------------


def test_generate_is_deterministic_for_greedy_and_meta_info_is_consistent(fleet):
    sim = fleet["main"].wait_ready()
    a = sim.generate("Explain speculative decoding.", 24)
    b = sim.generate("Explain speculative decoding.", 24)
    c = sim.generate("Something else entirely.", 24)
    assert a["text"] == b["text"] and a["text"] != c["text"]
    assert len(a["text"].split()) == 24
    m = a["meta_info"]
    assert m["completion_tokens"] == 24 and m["prompt_tokens"] == 4
    assert m["finish_reason"] == {"type": "length", "length": 24}
    assert m["spec_verify_ct"] >= 2 and m["e2e_latency"] > 0 and m["id"] != b["meta_info"]["id"]
    assert m["spec_accept_length"] == pytest.approx(accept(m), rel=1e-4)
    assert a["meta_info"]["spec_verify_ct"] == b["meta_info"]["spec_verify_ct"]
    # a batch of prompts answers a list
    batch = sim.post("/generate", {"text": ["Explain speculative decoding.", "x"],
                                   "sampling_params": {"temperature": 0, "max_new_tokens": 24}}).json()
    assert [r["text"] for r in batch][0] == a["text"] and len(batch) == 2


def test_bad_request_body_is_400_naming_the_field(fleet):
    sim = fleet["main"].wait_ready()
    r = sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -3}})
    assert r.status_code == 400 and "max_new_tokens=-3" in r.json()["error"]["message"]
    r = sim.post("/generate", {"sampling_params": {}})
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]


def test_server_and_model_info(fleet):
    sim = fleet["main"].wait_ready()
    sim.generate("warm", 8)
    info = sim.get("/get_server_info").json()
    assert info["speculative_algorithm"] == "DDTREE" and info["speculative_ddtree_budget"] == 15
    assert info["speculative_dflash_block_size"] == 16 and info["speculative_ddtree_topk_cap"] == 8
    assert info["tp_size"] == 1 and info["version"] == "0.5.23+ddtree.fork.topk.abcdef12"
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert info["simulator"]["state_forking"] is True and info["simulator"]["hybrid_model"] is True
    model = sim.get("/get_model_info").json()
    assert model["model_path"] == HYBRID and model["is_generation"] is True
    assert sim.get("/v1/models").json()["data"][0]["id"] == "qwen"


def test_server_info_reports_the_switches_the_server_was_started_with(fleet):
    # One release carries the whole series; the flags decide what runs, and the info says so.
    info = fleet["flagoff"].wait_ready().get("/get_server_info").json()["simulator"]
    assert "fork" in info["features"] and "topk" in info["features"]
    assert info["state_forking"] is False and info["fused_topk"] is False


def test_metrics_have_sglang_0_5_23s_names_types_and_labels(fleet):
    from prometheus_client.parser import text_string_to_metric_families
    sim = fleet["main"].wait_ready()
    before = serving.parse_metrics(sim.get("/metrics").text)
    metas = [sim.generate(f"metrics please {i}", 16)["meta_info"] for i in range(3)]
    text = sim.get("/metrics").text
    values = serving.parse_metrics(text)  # prometheus_client's parser: the text is valid exposition format
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for gauge in ("sglang:num_running_reqs", "sglang:gen_throughput", "sglang:spec_accept_length"):
        assert families[gauge].type == "gauge"
        assert set(families[gauge].samples[0].labels) == {"model_name", "engine_type", "tp_rank", "pp_rank",
                                                          "moe_ep_rank"}
    for counter in ("sglang:num_requests", "sglang:generation_tokens", "sglang:spec_verify_calls",
                    "sglang:num_aborted_requests", "sglang:prompt_tokens"):
        assert families[counter].type == "counter", counter
    for hist in ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                 "sglang:e2e_request_latency_seconds"):
        assert families[hist].type == "histogram", hist
    gen = [s for s in families["sglang:generation_tokens"].samples if s.name.endswith("_total")]
    assert {s.labels["is_streaming"] for s in gen} == {"true", "false"}
    assert all(s.labels["model_name"] == "qwen" for s in gen)
    # the counters move by what the finished requests report: the watch's accept length is their ratio
    d_gen = values["sglang:generation_tokens_total"] - before.get("sglang:generation_tokens_total", 0)
    d_ver = values["sglang:spec_verify_calls_total"] - before.get("sglang:spec_verify_calls_total", 0)
    assert d_gen == sum(m["completion_tokens"] for m in metas)
    assert d_ver == sum(m["spec_verify_ct"] for m in metas)
    assert values["sglang:num_requests_total"] - before.get("sglang:num_requests_total", 0) == 3
    assert values["sglang:spec_accept_length"] > 1 and values["sglang:gen_throughput"] > 0
    responses = {(s.labels["endpoint"], s.labels["status_code"], s.labels["method"]): s.value
                 for s in families["sglang:http_responses"].samples}
    assert responses[("/generate", "200", "POST")] >= 3 and responses[("/metrics", "200", "GET")] >= 1
    assert fleet["ar"].wait_ready().get("/metrics").status_code == 404  # no --enable-metrics


def test_acceptance_collapses_after_n_completed_requests_and_the_server_stays_healthy(tmp_path):
    sim = Sim(tmp_path, "collapse", "ddtree.fork.topk.abcdef12", ddtree(15) + ["--enable-metrics"],
              {"SGLANG_SIM_COLLAPSE_AFTER": "2", "SGLANG_SIM_COLLAPSE_ACCEPT": "1.5"})
    try:
        sim.wait_ready()
        healthy = [accept(sim.generate(f"before {i}", 64)["meta_info"]) for i in range(2)]
        collapsed = [accept(sim.generate(f"after {i}", 64)["meta_info"]) for i in range(3)]
        assert min(healthy) > 3, healthy
        assert max(collapsed) < 2.2, collapsed
        assert sim.get("/health").status_code == 200
        assert "simulated acceptance collapse after 2 completed requests" in sim.log
    finally:
        sim.stop()


def test_openai_completions_and_streaming_chat(fleet):
    sim = fleet["main"].wait_ready()
    body = {"model": "qwen", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 12,
            "temperature": 0}
    plain = sim.post("/v1/chat/completions", body).json()
    assert plain["object"] == "chat.completion" and plain["usage"]["completion_tokens"] == 12
    r = sim.post("/v1/chat/completions", {**body, "stream": True}, stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    comp = sim.post("/v1/completions", {"prompt": "Once", "max_tokens": 5, "temperature": 0}).json()
    assert comp["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    assert len(comp["choices"][0]["text"].split()) == 5
    r = sim.post("/v1/completions", {"prompt": "Once", "max_tokens": 5, "stream": True}, stream=True)
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert lines[-1] == "data: [DONE]"


# ------------------------------------------------------------------------------------------------------
# the acceptance model, end to end and as formulas
# ------------------------------------------------------------------------------------------------------


def test_ddtree_big_budget_collapses_without_fork_on_a_recurrent_model(fleet):
    results = {}

    def run(name):
        results[name] = accept(fleet[name].wait_ready().generate("The budget sweep", 128)["meta_info"])

    threads = [threading.Thread(target=run, args=(n,)) for n in ("nofork15", "nofork64", "fork64", "pure64")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4, results
    assert "hybrid (recurrent GDN/Mamba layers) (from " in fleet["nofork64"].log  # decided from config.json
    assert "config.json" in fleet["nofork64"].log
    assert results["nofork64"] < 0.5 * results["nofork15"], results
    assert results["fork64"] >= 0.9 * results["nofork15"], results
    assert results["pure64"] >= 0.9 * results["nofork15"], results
    assert results["nofork15"] > 10, results


def test_accept_override_and_autoregressive(fleet):
    meta = fleet["override"].wait_ready().generate("override", 64)["meta_info"]
    assert 2.5 <= accept(meta) <= 3.5
    ar = fleet["ar"].wait_ready().generate("plain", 8)["meta_info"]
    assert ar["completion_tokens"] == 8 and "spec_verify_ct" not in ar


def test_slowdown_multiplies_step_time(fleet):
    base = fleet["ar"].wait_ready().generate("timing", 12)["meta_info"]["e2e_latency"]
    slow = fleet["slow"].wait_ready().generate("timing", 12)["meta_info"]["e2e_latency"]
    assert base >= 11 * 0.037 * 0.95  # 11 decode steps of ~37 ms after the prefill
    assert slow > 2.0 * base


def test_acceptance_model_matches_the_field_anchors():
    m = load_model()
    C = m.SpecConfig

    def tps(**kw):
        return m.expected_tokens_per_s(C(**kw))

    def acc(**kw):
        return m.mean_accept(C(**kw))

    hybrid = {"algorithm": "DDTREE", "hybrid": True}
    assert tps() == pytest.approx(1000 / 37, rel=0.01)  # autoregressive
    assert 6.0 <= acc(algorithm="DFLASH", block_size=16) <= 7.0
    assert acc(algorithm="DFLASH", block_size=8) < acc(algorithm="DFLASH", block_size=16)
    b15 = tps(budget=15, **hybrid)
    assert b15 == pytest.approx(173.4, rel=0.03)
    assert acc(budget=15, **hybrid) == pytest.approx(15, abs=0.5)
    assert m.step_ms(C(budget=15, **hybrid), acc(budget=15, **hybrid)) == pytest.approx(87, abs=2)
    assert tps(budget=32, **hybrid) == pytest.approx(92, rel=0.08)
    assert tps(budget=64, **hybrid) == pytest.approx(64, rel=0.08)
    assert acc(budget=64, **hybrid) < acc(budget=15, **hybrid) / 2.5
    for fork_or_pure in ({"fork": True, "hybrid": True}, {"hybrid": False}):
        for b in (32, 64):
            assert tps(algorithm="DDTREE", budget=b, **fork_or_pure) >= b15
    clean = [acc(algorithm="DDTREE", budget=b, fork=True, hybrid=True) for b in (4, 8, 15, 32, 64, 256)]
    assert clean == sorted(clean) and clean[-1] <= 16
    assert acc(algorithm="DDTREE", budget=15, topk_cap=2) < acc(algorithm="DDTREE", budget=15, topk_cap=8)
    assert tps(budget=15, fused_topk=True, **hybrid) > b15  # fused top-k: shorter step


# ------------------------------------------------------------------------------------------------------
# shutdown and crashes
# ------------------------------------------------------------------------------------------------------


def test_sigterm_drains_the_in_flight_request_and_exits_0(tmp_path):
    sim = Sim(tmp_path, "drain", "stock", ["--model-path", PURE]).wait_ready()
    try:
        out = {}

        def call():
            out["r"] = sim.post("/generate", {"text": "long", "sampling_params": {"max_new_tokens": 40}})

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.4)  # the request is running (40 steps x 37 ms)
        sim.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert sim.get("/health").status_code == 503
        late = sim.post("/generate", {"text": "late", "sampling_params": {"max_new_tokens": 2}})
        assert late.status_code == 503
        t.join(30)
        assert out["r"].status_code == 200 and out["r"].json()["meta_info"]["completion_tokens"] == 40
        assert sim.wait_exit() == 0
        assert "waiting for 1 in-flight request(s) to finish" in sim.log
        assert "Gracefully exiting" in sim.log
    finally:
        sim.stop()


def test_a_request_taken_while_draining_is_answered_before_the_exit(tmp_path):
    """Under a steady load, SIGTERM then exit: every request is answered (200 or 503) or refused (nothing
    listens); none is accepted and then torn by the exit (unhealthy_window.py's 'broken'; the lab's
    drain-under-load test counts those as dropped work)."""
    sys.path.insert(0, str(SIM.parents[1] / "lab"))
    import unhealthy_window as uw

    broken = []
    for attempt in range(3):
        sim = Sim(tmp_path / str(attempt), "drain", "stock", ["--model-path", PURE]).wait_ready()
        results, stop = [], threading.Event()

        def client(url: str, out: list, until: threading.Event) -> None:
            while not until.is_set():
                out.append(uw.probe(url, timeout=10))

        threads = [threading.Thread(target=client, args=(sim.url, results, stop)) for _ in range(8)]
        try:
            for t in threads:
                t.start()
            time.sleep(0.3)
            sim.proc.send_signal(signal.SIGTERM)
            assert sim.wait_exit() == 0
            time.sleep(0.2)  # refused from here on
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            sim.stop()
        assert "rejected" in results and "refused" in results, sorted(set(results))
        broken.append(results.count("broken"))
    # Eight clients in tight loops open thousands of connections a second: one may complete its handshake in
    # the microseconds between the last accept and the close of the listening socket, and the kernel resets
    # it (no server avoids that when it closes its listener). At the lab's 10 requests/s that is about one
    # exit in 10 000; before the fix, every exit tore 6-8 requests that were being answered.
    assert max(broken) <= 1, f"requests accepted and then torn by the exit, per attempt: {broken}"


def test_crash_after_n_requests(tmp_path):
    sim = Sim(tmp_path, "crash", "stock", ["--model-path", PURE], {"SGLANG_SIM_CRASH_AFTER": "2"})
    try:
        sim.wait_ready()
        assert sim.generate("one", 2)["meta_info"]["completion_tokens"] == 2
        assert sim.proc.poll() is None
        assert sim.generate("two", 2)["meta_info"]["completion_tokens"] == 2
        assert sim.wait_exit() == 1
        assert "simulated crash after 2 completed requests" in sim.log
    finally:
        sim.stop()


# ------------------------------------------------------------------------------------------------------
# the target's tokens and log-probabilities (the exactness gate's view)
# ------------------------------------------------------------------------------------------------------


def test_logprobs_come_in_sglangs_shape(fleet):
    body = {"text": "The capital of France is", "sampling_params": {"temperature": 0, "max_new_tokens": 5},
            "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    meta = fleet["main"].wait_ready().post("/generate", body).json()["meta_info"]
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(chosen) == len(top) == meta["output_token_logprobs_length"] == 5
    for (lp, tok, text), pairs in zip(chosen, top, strict=True):
        assert lp <= 0 and isinstance(tok, int) and text.startswith(" ")
        assert len(pairs) == 2 and pairs[0][0] > pairs[1][0]  # top-1 first, a real gap
        assert tok in (pairs[0][1], pairs[1][1])
    text = fleet["main"].post("/generate", {**body, "return_text_in_logprobs": False}).json()
    assert text["meta_info"]["output_token_logprobs"][0][2] is None
    plain = fleet["main"].post("/generate", {**body, "return_logprob": False}).json()["meta_info"]
    assert "output_token_logprobs" not in plain and "output_top_logprobs" not in plain
    no_top = fleet["main"].post("/generate", {**body, "top_logprobs_num": 0}).json()["meta_info"]
    assert "output_top_logprobs" not in no_top and len(no_top["output_token_logprobs"]) == 5
    bad = fleet["main"].post("/generate", {**body, "return_logprob": "yes"})
    assert bad.status_code == 400 and "return_logprob" in bad.text


def answers(sim) -> list[dict]:
    from sgdeploy import exactness

    outputs, errors = exactness.collect(sim.wait_ready().url, exactness.load_prompts(), concurrency=16, timeout=120)
    assert not errors, errors
    return outputs


@pytest.mark.slow  # several seconds: `make test-slow`
def test_only_a_state_leak_leaves_the_targets_tokens(fleet):
    from sgdeploy import exactness

    ar = answers(fleet["ar"])
    assert all(o["tokens"] == [step[0][1] for step in o["top"]] for o in ar)  # the target takes top-1 always
    ref = exactness.build_reference(ar, exactness.load_prompts(), {"key": "m", "label": "m"}, config="ar",
                                    host="h", release=None, concurrency=16)
    for name in ("main", "fork64", "nofork15", "pure64", "override"):  # no leak: near-tie flips at most
        v = exactness.compare(ref, answers(fleet[name]), 0.1)
        assert v.verdict == "pass", (name, v.reason)
        assert 4 <= v.equal < 16 and all(f["gap"] < 0.03 for f in v.details["near_tie_flips"])
    leak = exactness.compare(ref, answers(fleet["nofork64"]), 0.1)
    assert leak.verdict == "fail" and leak.equal == 0
    assert max(f["step"] for f in leak.details["failures"]) <= 12  # it leaves the target within a few steps
    # Forced acceptance changes the steps, not the tokens.
    assert answers(fleet["override"]) == answers(fleet["main"])


def test_the_divergence_rate_rises_with_the_budget_and_only_without_forking():
    m = load_model()

    def rate(budget: int, fork: bool = False, hybrid: bool = True) -> float:
        return m.leak_rate(m.SpecConfig("DDTREE", 16, budget, 8, hybrid=hybrid, fork=fork))

    assert rate(15) == 0.0 and rate(64, fork=True) == 0.0 and rate(64, hybrid=False) == 0.0
    assert 0 < rate(16) < rate(32) < rate(64) < m.LEAK_RATE
    assert rate(64) == pytest.approx(0.451, abs=0.001)


# ------------------------------------------------------------------------------------------------------
# the target's prefill: input_ids, input log-probabilities, the prefix cache (the exactness self-check's view)
# ------------------------------------------------------------------------------------------------------

PROMPT = "The capital of France is"


def decode_with_ids(sim, max_new: int = 48) -> tuple[list[int], list[int]]:
    body = {"text": PROMPT, "return_logprob": True, "logprob_start_len": 0, "return_text_in_logprobs": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new}}
    a = sim.wait_ready().post("/generate", body).json()
    return [e[1] for e in a["meta_info"]["input_token_logprobs"]], a["output_ids"]


def prefill(sim, ids: list[int], **extra) -> dict:
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "return_text_in_logprobs": True, "sampling_params": {"temperature": 0, "max_new_tokens": 1}, **extra}
    r = sim.post("/generate", body)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_a_prefill_answers_the_targets_own_logprobs_in_sglangs_shape(fleet):
    prompt_ids, out = decode_with_ids(fleet["ar"])
    assert len(prompt_ids) == 5  # The, capital, of, France, is
    meta = prefill(fleet["ar"], prompt_ids + out)
    chosen, top = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert len(chosen) == len(top) == len(prompt_ids) + len(out)
    assert chosen[0] == [None, prompt_ids[0], " The"] and top[0] is None  # SGLang pads the first position
    assert [e[1] for e in chosen] == prompt_ids + out
    # The autoregressive server's answer is the target's top-1 at every position of its own prefill.
    assert [top[len(prompt_ids) + k][0][1] for k in range(len(out))] == out
    assert all(chosen[i][0] == top[i][0][0] for i in range(len(prompt_ids), len(chosen)))
    # The same prompt as text and as token ids is the same prompt.
    again = fleet["ar"].post("/generate", {"input_ids": prompt_ids,
                                           "sampling_params": {"temperature": 0, "max_new_tokens": 48}}).json()
    assert again["output_ids"] == out


def test_a_leaking_server_decodes_wrong_tokens_but_prefills_the_targets(fleet):
    """DDTree budget 64 without forking on a hybrid target: its decode leaves the target's tokens, while a
    prefill of prompt + its answer (no draft, no tree) shows the target's top-1 at each position, the one the
    autoregressive server picks after the same prefix."""
    prompt_ids, out = decode_with_ids(fleet["nofork64"])
    meta = prefill(fleet["nofork64"], prompt_ids + out)
    top1 = [meta["input_top_logprobs"][len(prompt_ids) + k][0][1] for k in range(len(out))]
    wrong = [k for k in range(len(out)) if out[k] != top1[k]]
    assert len(wrong) >= 8 and wrong[0] >= 1  # the first token comes from the prefill: the target's
    k = wrong[0]
    ar = fleet["ar"].post("/generate", {"input_ids": prompt_ids + out[:k],
                                        "sampling_params": {"temperature": 0, "max_new_tokens": 1}}).json()
    assert ar["output_ids"] == [top1[k]]
    gaps = [meta["input_top_logprobs"][len(prompt_ids) + k][0][0] - meta["input_token_logprobs"][len(prompt_ids) + k][0]
            for k in wrong]
    assert max(gaps) > 0.3  # not near-ties


def test_the_prefix_cache_serves_a_repeat_but_not_a_prefill_from_the_first_token(fleet):
    sim = fleet["fork64"]
    prompt_ids, out = decode_with_ids(sim)
    ids = prompt_ids + out
    plain = sim.post("/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 1}})
    assert plain.json()["meta_info"]["cached_tokens"] == len(ids) - 1  # prompt + answer but its last token
    assert prefill(sim, ids)["cached_tokens"] == 0  # logprob_start_len 0: nothing from the cache
    assert prefill(sim, ids, logprob_start_len=len(prompt_ids))["cached_tokens"] == len(prompt_ids)
    assert prefill(sim, ids, return_logprob=False)["cached_tokens"] == len(ids) - 1


@pytest.mark.parametrize("body, words", [
    ({"text": "x", "input_ids": [1]}, "give either text or input_ids, not both"),
    ({"input_ids": [1, -2]}, "input_ids must be a non-empty list of token ids"),
    ({"input_ids": []}, "input_ids must be a non-empty list of token ids"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len=2 is not allowed"),
    ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len=-2 is not allowed"),
])
def test_bad_input_ids_are_400_naming_the_field(fleet, body, words):
    r = fleet["ar"].wait_ready().post("/generate", {**body, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
