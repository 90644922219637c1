"""Replicas and the router (issue 24, docs/router.md): the config schema, the port rule, the rendered
replica units, the router role's pins, and the worker API client against a stand-in of the pinned
router's HTTP API (the real router runs in tests/lab/test_router.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from sgdeploy import render, spec

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = "collections/ansible_collections/sgdeploy/host/roles"
ROLES = REPO / ROLES_DIR
sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402

HOST = render.HostSettings(release_label="abc123def456")


def config(tmp_path, serving: dict, name: str = "rep"):
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"extends": "ddtree-b15", "serving": serving}))
    return spec.load(path)


def problems(tmp_path, serving: dict) -> list[str]:
    with pytest.raises(spec.ConfigError) as info:
        config(tmp_path, serving)
    return [p.split(": ", 1)[1] for p in info.value.problems]


def test_one_replica_by_default_keeps_the_unit_ports_and_gpus_of_before(tmp_path):
    c = config(tmp_path, {})
    assert c.serving.replicas == 1 and not c.serving.router
    assert c.replicas == (spec.Replica(0, "rep", "sglang-rep.service", 30000, 30001, (0,)),)
    assert c.ports == (30000, 30001) and c.router_metrics_port is None
    assert render.render(c, HOST).unit_name == "sglang-rep.service"


def test_replicas_follow_the_port_rule_behind_the_router(tmp_path):
    c = config(tmp_path, {"replicas": 3, "tp_size": 2, "gpus": [0, 1, 2, 3, 4, 5], "port": 31000})
    assert c.serving.router
    assert [(r.name, r.unit_name, r.port, r.nccl_port, r.gpus) for r in c.replicas] == [
        ("rep-r0", "sglang-rep-r0.service", 31001, 31002, (0, 1)),
        ("rep-r1", "sglang-rep-r1.service", 31003, 31004, (2, 3)),
        ("rep-r2", "sglang-rep-r2.service", 31005, 31006, (4, 5))]
    assert c.router_metrics_port == 30999
    assert c.ports == (31000, 31001, 31002, 31003, 31004, 31005, 31006, 30999)
    rendered = render.render(c, HOST, replica=c.replicas[2])
    assert "Environment=CUDA_VISIBLE_DEVICES=4,5" in rendered.unit_text
    assert "--port 31005 --nccl-port 31006" in rendered.unit_text
    assert rendered.env_name == "/etc/sglang/rep-r2.env" and rendered.unit_name == "sglang-rep-r2.service"
    # The merged config is itself a valid config with the same layout.
    again = tmp_path / "again.yml"
    again.write_text(spec.to_yaml(c))
    assert spec.load(again).replicas == tuple(
        spec.Replica(r.index, r.name.replace("rep", "again"), r.unit_name.replace("rep", "again"), r.port, r.nccl_port,
                     r.gpus) for r in c.replicas)


def test_a_router_can_front_one_replica(tmp_path):
    c = config(tmp_path, {"router": True})
    assert [(r.unit_name, r.port) for r in c.replicas] == [("sglang-rep-r0.service", 30001)]


@pytest.mark.parametrize("serving, expected", [
    ({"replicas": 0}, "serving.replicas: 0: must be between 1 and 64 (engines of tp_size GPUs each)"),
    ({"replicas": 2}, "serving.gpus: [0]: must list serving.replicas x serving.tp_size (2 x 1 = 2) GPUs: "
                      "replica i runs on gpus[i*tp_size:(i+1)*tp_size]"),
    ({"replicas": 2, "gpus": [0, 1], "router": False},
     "serving.router: false: with serving.replicas 2 the router must hold serving.port in front of the replicas; "
     "leave it out or set it true"),
    ({"replicas": 2, "gpus": [0, 1], "nccl_port": 31000},
     "serving.nccl_port: 31000: not with the router: replica i takes port serving.port + 1 + 2i and NCCL port "
     "serving.port + 2 + 2i; leave nccl_port out"),
    ({"replicas": 2, "gpus": [0, 1], "port": 65532},
     "serving.port: 65532: must be between 1025 and 65531 (with the router, its metrics take the port below it and "
     "its 2 replica(s) the 4 ports above it)"),
    ({"replicas": 2, "gpus": [0, 1], "port": 1024},
     "serving.port: 1024: must be between 1025 and 65531 (with the router, its metrics take the port below it and "
     "its 2 replica(s) the 4 ports above it)"),
    ({"replicas": 2, "gpus": [0, 0]}, "serving.gpus: [0, 0]: each GPU index may appear only once"),
])
def test_bad_replica_settings_get_one_line_each(tmp_path, serving, expected):
    assert expected in problems(tmp_path, serving)


def test_render_json_lists_the_replicas_and_the_router(tmp_path):
    path = tmp_path / "two.yml"
    serving = {"replicas": 2, "gpus": [2, 3], "port": 31100}
    path.write_text(yaml.safe_dump({"extends": "ddtree-b15", "serving": serving}))
    out = subprocess.run([sys.executable, "-m", "sgdeploy", "render", str(path), "--release", "stock", "--json",
                          "--no-verify", "--bind-address", "127.0.9.1", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    d = json.loads(out)
    assert [r["url"] for r in d["replicas"]] == ["http://127.0.9.1:31101", "http://127.0.9.1:31103"]
    assert d["router"] == {"unit_name": "sglang-router-31100.service", "port": 31100, "metrics_port": 31099,
                           "url": "http://127.0.9.1:31100"}
    assert d["config"] == "two" and d["of_config"] == "two"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sglang-two-r0.service", "sglang-two-r1.service",
                                                                     "two-r0.env", "two-r1.env"]
    # One replica as its own deploy (what the role sglang_replicas hands the deploy role).
    one = json.loads(subprocess.run([sys.executable, "-m", "sgdeploy", "render", str(path), "--release", "stock",
                                     "--json", "--no-verify", "--bind-address", "127.0.9.1", "--replica", "1",
                                     "--out", str(tmp_path / "one")], capture_output=True, text=True, cwd=REPO,
                                    check=True).stdout)
    assert (one["config"], one["unit_name"], one["ports"], one["gpus"], one["url"]) == \
        ("two-r1", "sglang-two-r1.service", [31103, 31104], [3], "http://127.0.9.1:31103")
    assert one["env_name"] == "/etc/sglang/two-r1.env"


def test_render_refuses_a_replica_the_config_does_not_have(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "sgdeploy", "render", "ddtree-b15", "--release", "stock", "--json",
                          "--no-verify", "--replica", "0", "--out", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "sgdeploy render: --replica 0: config ddtree-b15 has no router (serving.replicas 1)\n"


def test_the_lab_replica_configs_share_one_layout():
    """The lab's switch keeps the router: every lab-replicas config has the same ports and GPUs."""
    lab = REPO / "tests" / "lab" / "configs"
    layouts = {name: [(r.port, r.nccl_port, r.gpus) for r in spec.load(lab / f"lab-replicas-{name}.yml").replicas]
               for name in ("b15", "b32", "b64-nofork")}
    assert layouts["b15"] == layouts["b32"] == layouts["b64-nofork"] == [(31201, 31202, (4,)), (31203, 31204, (5,))]


def test_the_router_role_pins_version_and_sha256_of_one_abi3_wheel():
    d = yaml.safe_load((ROLES / "sglang_router" / "defaults" / "main.yml").read_text())
    assert d["sglang_router_wheel"].startswith(f"sglang_router-{d['sglang_router_version']}-cp38-abi3-manylinux")
    assert len(d["sglang_router_wheel_sha256"]) == 64 and int(d["sglang_router_wheel_sha256"], 16) >= 0
    assert d["sglang_router_bind_address"] == "127.0.0.1"


# -- the worker API client, against a stand-in of the pinned router's API ---------------------------


class FakeRouter(BaseHTTPRequestHandler):
    workers: dict[str, dict] = {}
    healthy = True
    key: str | None = None  # the admin key it asks for (0.3.2's --control-plane-api-keys): 401 without it

    def _authorized(self) -> bool:
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._send(401, {"error": "unauthorized"})
            return False
        return True

    def log_message(self, *args):
        pass

    def _send(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        if not self._authorized():
            return
        if self.path == "/workers":
            self._send(200, {"workers": [{"id": w["id"], "url": u, "is_healthy": self.healthy, "load": 0}
                                         for u, w in self.workers.items()]})
        else:
            self._send(404, {"error": "no"})

    def do_POST(self):  # noqa: N802
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.workers[body["url"]] = {"id": f"id-{len(self.workers)}"}
        self._send(202, {"status": "accepted"})

    def do_DELETE(self):  # noqa: N802
        if not self._authorized():
            return
        wid = self.path.rsplit("/", 1)[1]
        for url, w in list(self.workers.items()):
            if w["id"] == wid:
                del self.workers[url]
        self._send(202, {"status": "accepted"})


@pytest.fixture
def router():
    FakeRouter.workers = {}
    FakeRouter.healthy = True
    FakeRouter.key = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeRouter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_workers_are_added_and_removed_through_the_api(router):
    api.add(router, "http://127.0.0.1:31101/")
    api.add(router, "http://127.0.0.1:31103")
    ok, listing, _ = api.settle(router, ["http://127.0.0.1:31101", "http://127.0.0.1:31103"], [], 2)
    assert ok and set(listing) == {"http://127.0.0.1:31101", "http://127.0.0.1:31103"}
    api.remove(router, listing["http://127.0.0.1:31101"]["id"])
    ok, listing, _ = api.settle(router, ["http://127.0.0.1:31103"], ["http://127.0.0.1:31101"], 2)
    assert ok and list(listing) == ["http://127.0.0.1:31103"]


def test_an_unhealthy_worker_is_reported_after_the_timeout(router):
    FakeRouter.healthy = False
    api.add(router, "http://127.0.0.1:31101")
    ok, _, detail = api.settle(router, ["http://127.0.0.1:31101"], [], 0.3, poll_s=0.1)
    assert not ok and detail == "not listed healthy: http://127.0.0.1:31101"


def test_a_router_that_does_not_answer_is_one_line():
    with pytest.raises(api.RouterError) as info:
        api.workers("http://127.0.0.1:9")
    assert str(info.value).startswith("router http://127.0.0.1:9 does not answer:") and "\n" not in str(info.value)


def test_the_router_unit_the_role_renders_is_hardened_and_parsed_back_by_status_and_testinfra():
    import jinja2

    role = ROLES / "sglang_router"
    values = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    values.update(sglang_router_config="two", sglang_router_bind_address="127.0.9.1", sglang_router_port=31100,
                  sglang_router_metrics_port=31105, sglang_router__address="127.0.9.1",
                  sglang_router_workers=["http://127.0.9.1:31101", "http://127.0.9.1:31103"])
    text = jinja2.Template((role / "templates" / "sglang-router.service.j2").read_text(),
                           undefined=jinja2.StrictUndefined).render(**values)
    parsed = api.parse_router_unit(text)
    assert (parsed["address"], parsed["port"], parsed["metrics_port"]) == ("127.0.9.1", "31100", "31105")
    assert parsed["workers"] == ["http://127.0.9.1:31101", "http://127.0.9.1:31103"]
    assert parsed["argv"][:2] == ["/opt/sglang-router/0.3.2/venv/bin/python",
                                  "/opt/sglang-router/0.3.2/sglang_router_launch.py"]
    for line in ("EnvironmentFile=/etc/sglang/router-31100.env",
                 "User=sglang-router", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=",
                 "PrivateDevices=yes", "Restart=always",
                 # 0.3.2 ignores HF_HUB_OFFLINE: its tokenizer lookups go to a closed loopback port, never the Hub.
                 "Environment=HF_ENDPOINT=http://127.0.0.1:9"):
        assert line in text.splitlines(), line
    # Named by port, not config: the text is the same for every config on that port (no restart on a switch).
    values["sglang_router_config"] = "other"
    assert jinja2.Template((role / "templates" / "sglang-router.service.j2").read_text()).render(**values) == text



def test_a_rollback_of_a_config_with_replicas_finds_each_replica_and_its_router(tmp_path):
    """`make rollback CONFIG=<config>` of a config behind the router: every <config>-r<i>, in order, each with
    the router whose unit lists it; CONFIG=<config>-r<i> one replica (still through its router); a config with
    one engine, itself, behind no router."""
    sys.path.insert(0, str(REPO / "collections" / "ansible_collections" / "sgdeploy" / "host" / "plugins" / "modules"))
    import sglang_router_replicas as finder

    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    (units / "sglang-router-31200.service").write_text(
        "[Service]\nExecStart=/opt/r/python launch.py --host 127.0.9.1 --port 31200 --prometheus-port 31205 "
        "--worker-urls http://127.0.9.1:31201 http://127.0.9.1:31203 --policy round_robin\n")
    for name, port in (("two-r1", 31203), ("two-r0", 31201), ("one", 30000), ("two-r10x", 1)):
        (state / name).mkdir(parents=True)
        (state / name / "current.json").write_text(json.dumps({"bind_address": "127.0.9.1", "ports": [port, port + 1]}))
    found = finder.find(str(state), "two", str(units))
    assert found == [{"name": f"two-r{i}", "url": f"http://127.0.9.1:{p}", "router_unit": "sglang-router-31200.service",
                      "router_url": "http://127.0.9.1:31200"} for i, p in ((0, 31201), (1, 31203))]
    assert [d["name"] for d in finder.find(str(state), "two-r1", str(units))] == ["two-r1"]
    assert finder.find(str(state), "two-r1", str(units))[0]["router_url"] == "http://127.0.9.1:31200"
    assert finder.find(str(state), "one", str(units)) == [{"name": "one", "url": "http://127.0.9.1:30000",
                                                          "router_unit": None, "router_url": None}]
    assert finder.find(str(state), "none", str(units)) == []


def test_the_worker_api_is_called_with_the_routers_admin_key_from_its_env_file(router, tmp_path, monkeypatch):
    """Issue 34: the router answers 401 without its admin key; every call reads it from
    /etc/sglang/router-<port>.env (as the role's module writes it) and sends it as a bearer token."""
    FakeRouter.key = 'k3y-"with$odd`chars\\'
    port = int(router.rsplit(":", 1)[1])
    with pytest.raises(api.RouterError) as info:
        api.workers(router)  # no env file: no key
    assert "answered 401" in str(info.value) and FakeRouter.key not in str(info.value)
    sys.path.insert(0, str(REPO / "collections" / "ansible_collections" / "sgdeploy" / "host" / "plugins" / "modules"))
    import sglang_router_env as env_module

    (tmp_path / f"router-{port}.env").write_text(env_module.content({api.CONTROL_KEY_VAR: FakeRouter.key}))
    monkeypatch.setattr(api, "ENV_DIR", str(tmp_path))
    monkeypatch.setattr(api.control_key, "__defaults__", (str(tmp_path),))
    api.add(router, "http://127.0.0.1:31101")
    ok, listing, _ = api.settle(router, ["http://127.0.0.1:31101"], [], 2)
    assert ok and list(listing) == ["http://127.0.0.1:31101"]
    api.remove(router, listing["http://127.0.0.1:31101"]["id"])
    assert api.workers(router) == {}


def test_a_stranger_is_told_apart_from_the_units_engines():
    listing = {"http://a:1": {"healthy": True}, "http://a:3": {"healthy": False}, "http://evil:9": {"healthy": True}}
    assert api.compare(listing, ["http://a:1/", "http://a:3", "http://a:5"]) == (
        ["http://evil:9"], ["http://a:5"], ["http://a:3"])


def test_the_router_launcher_refuses_keys_on_the_command_line_and_needs_its_control_key():
    text = (ROLES / "sglang_router" / "files" / "sglang_router_launch.py").read_text()
    assert 'os.environ.pop("SGLANG_ROUTER_CONTROL_KEY", "")' in text
    assert "args.control_plane_api_keys = [(" in text and "keys come from the environment file, never argv" in text
