"""The end-to-end harness's pieces that run inside or beside the server, on the CPU: the import hook that
logs accepted paths (e2e_hook), the host-sync check of a profiler trace (trace_check), and the release
folders rebuilt from base + overlay (bundle.overlay, releases.assemble)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "gpu" / "e2e"
sys.path.insert(0, str(HERE))

import bundle  # noqa: E402
import releases  # noqa: E402
import trace_check  # noqa: E402

FAKE_INFO = '''
class DDTreeVerifyInput:
    def __init__(self, parents, firsts, siblings, width):
        self.retrieve_parent_token, self.retrieve_next_token = T(parents), T(firsts)
        self.retrieve_next_sibling, self.draft_token_num = T(siblings), width

    def set_accepted_nodes(self, accept_index, accept_lens):
        self.accepted_node_index = "computed"
        return "computed"


class T(list):
    def tolist(self):
        return list(self)
'''
FAKE_DECODE = "def forward_decode(worker, batch):\n    return ('decoded', worker, batch)\n"
FAKE_TORCH = textwrap.dedent('''
    import contextlib
    calls = []
    class profiler:
        @staticmethod
        @contextlib.contextmanager
        def record_function(name):
            calls.append(name)
            yield
''')

CHILD = textwrap.dedent('''
    import json, os, sys
    from sglang.srt.speculative import ddtree_info, ddtree_decode
    import torch
    T = ddtree_info.T
    # root 0 with children 1, 2 (rank 0, 1); 3 child of 2.
    vi = ddtree_info.DDTreeVerifyInput([[-1, 0, 0, 2]], [[1, -1, 3, -1]], [[-1, 2, -1, -1]], 4)
    out = [vi.set_accepted_nodes(T([T([0, 2, 3])]), T([3]))]
    open(os.path.join(os.environ["SGDEPLOY_E2E_PATH_LOG"], "on"), "w").close()
    out.append(vi.set_accepted_nodes(T([T([0, 2, 3])]), T([3])))
    out.append(ddtree_decode.forward_decode("w", "b"))
    print(json.dumps({"out": out, "ranges": torch.calls}))
''')


def _fake_tree(root: Path) -> None:
    pkg = root / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True)
    for d in (root / "sglang", root / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "ddtree_info.py").write_text(FAKE_INFO)
    (pkg / "ddtree_decode.py").write_text(FAKE_DECODE)
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text(FAKE_TORCH)


def _run_child(tmp_path: Path, hook: bool) -> tuple[dict, Path]:
    _fake_tree(tmp_path / "site")
    logs = tmp_path / "paths"
    logs.mkdir()
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'site'}:{HERE / 'hook'}", SGDEPLOY_E2E_PATH_LOG=str(logs))
    env.pop("SGDEPLOY_E2E_HOOK", None)
    if hook:
        env["SGDEPLOY_E2E_HOOK"] = "1"
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1]), logs


def test_the_hook_logs_accepted_paths_only_while_switched_on_and_marks_decode_steps(tmp_path):
    out, logs = _run_child(tmp_path, hook=True)
    assert out["out"][:2] == ["computed", "computed"]  # the server's own results are untouched
    assert out["out"][2] == ["decoded", "w", "b"]
    assert out["ranges"] == [trace_check.RANGE_NAME]
    files = list(logs.glob("paths-*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert lines == [{"rows": [[2, [1, 0]]]}]  # one step (the one after "on"): 2 drafts, through rank 1


def test_without_the_variable_nothing_is_hooked(tmp_path):
    out, logs = _run_child(tmp_path, hook=False)
    assert out["ranges"] == [] and not list(logs.glob("paths-*.jsonl"))


def _event(name, cat, ts, dur=0.0, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "args": args}


def test_trace_check_counts_syncs_inside_decode_steps_only():
    events = [
        _event(trace_check.RANGE_NAME, "user_annotation", 100, 50),
        _event(trace_check.RANGE_NAME, "user_annotation", 300, 50),
        _event("aten::item", "cpu_op", 120, 5),
        _event("cudaMemcpyAsync", "cuda_runtime", 121, correlation=5),
        _event("aten::item", "cpu_op", 140, 2),  # a host tensor's read: no runtime call inside, no sync
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 400, tid=99, correlation=5),
        _event("cudaStreamSynchronize", "cuda_runtime", 122),
        _event("cudaStreamSynchronize", "cuda_runtime", 200),  # between steps: not counted
        _event("aten::item", "cpu_op", 310, tid=2),  # another thread: not counted
        _event("cudaLaunchKernel", "cuda_runtime", 320),
    ]
    out = trace_check.check({"traceEvents": events})
    assert out["decode_steps"] == 2 and out["host_syncs"] == 3
    assert out["by_kind"] == {"aten::item": 1, "DtoH copy (Memcpy DtoH (Device -> Pinned))": 1,
                              "cudaStreamSynchronize": 1}
    assert out["host_tensor_reads"] == {"aten::item": 1}
    clean = trace_check.check({"traceEvents": events[:2] + events[-1:]})
    assert clean["host_syncs"] == 0 and clean["verdict"] == "no host sync inside a decode step"
    assert trace_check.check({"traceEvents": []})["verdict"] == "no decode step in the trace"


def test_a_release_rebuilt_from_base_and_overlay_equals_its_own_files(tmp_path):
    base = {"pkg/a.py": "1", "pkg/b.py": "2", "pkg/gone.py": "3"}
    other = {"pkg/a.py": "1", "pkg/b.py": "22", "pkg/new.py": "4"}
    changed, removed = bundle.overlay(base, other)
    assert changed == ["pkg/b.py", "pkg/new.py"] and removed == ["pkg/gone.py"]

    def tree(root: Path, files: dict) -> None:
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)

    b = tmp_path / "bundle"
    b.mkdir()
    tree(tmp_path / "base", base)
    tree(tmp_path / "other", {k: other[k] for k in changed})
    with tarfile.open(b / "sglang-base.tar.xz", "w:xz") as t:
        t.add(tmp_path / "base" / "pkg", arcname="pkg")
    with tarfile.open(b / "overlay-x.tar.xz", "w:xz") as t:
        for n in changed:
            t.add(tmp_path / "other" / n, arcname=n)
    (b / "overlay-x.json").write_text(json.dumps({"changed": changed, "removed": removed}))
    (b / "base.json").write_text(json.dumps({"key": "full"}))
    out = releases.assemble(b, tmp_path / "rel")
    got = {str(p.relative_to(out["x"])): p.read_text() for p in out["x"].rglob("*.py")}
    assert got == other
    assert (out["full"] / "pkg" / "b.py").read_text() == "2"  # the base is left as it was
