"""Every Ansible module of the project documents itself as Ansible expects, and says what it really takes.

For each module (all live in the collection's ``plugins/modules``; no role has a ``library``): DOCUMENTATION,
EXAMPLES and RETURN exist and are YAML; DOCUMENTATION's options are the module's argument_spec (name,
type, required, default, choices, elements; the spec is captured by running ``main()`` with AnsibleModule
replaced); every EXAMPLES task calls a module by its fully qualified name; ``ansible-doc`` renders every
module, fragments merged, with check and diff support declared; the action group ``deploy`` of
meta/runtime.yml is the modules that take state_dir and run_id, and ``module_defaults`` reaches them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES_DIR = "collections/ansible_collections/sgdeploy/host/roles"
ROLES = REPO / ROLES_DIR
COLLECTIONS = REPO / "collections"
COLLECTION = COLLECTIONS / "ansible_collections" / "sgdeploy" / "host"
sys.path.insert(0, str(COLLECTIONS))

COLLECTION_MODULES = sorted((COLLECTION / "plugins" / "modules").glob("*.py"))
MODULES = COLLECTION_MODULES
IDS = [p.stem for p in MODULES]
BIN = Path(sys.executable).parent

# What an option of DOCUMENTATION may say (ansible-test's validate-modules schema, the keys this project uses).
OPTION_KEYS = {"description", "type", "required", "default", "choices", "elements", "aliases", "suboptions",
               "version_added"}
RETURN_KEYS = {"description", "returned", "type", "elements", "sample", "contains"}
SUPPORT = {"full", "partial", "none", "N/A"}


def fqcn(path: Path) -> str:
    """The name a task calls the module by: sgdeploy.host.<name>."""
    return f"sgdeploy.host.{path.stem}"


def doc_strings(path: Path) -> dict[str, str]:
    """The module-level string constants DOCUMENTATION, EXAMPLES and RETURN, read without importing the file."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                out[node.targets[0].id] = node.value.value
    return out


def is_text(value) -> bool:
    """A description: a non-empty string or list of strings (a stray `: ` in plain YAML makes it a mapping)."""
    items = value if isinstance(value, list) else [value]
    return bool(value) and all(isinstance(item, str) and item for item in items)


class _Captured(Exception):
    pass


def argument_spec(path: Path) -> dict:
    """The argument_spec the module's main() gives AnsibleModule (main() is stopped right there); for a module
    that documents an action plugin (plugins/action/<name>.py, run on the controller), the plugin's ARGUMENT_SPEC."""
    action = COLLECTION / "plugins" / "action" / path.name
    if path in COLLECTION_MODULES and action.is_file():
        loaded = importlib.util.spec_from_file_location(f"_module_docs_action_{path.stem}", action)
        plugin = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(plugin)
        return plugin.ARGUMENT_SPEC
    spec = importlib.util.spec_from_file_location(f"_module_docs_{path.parent.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    seen = {}

    def capture(*args, **kwargs):
        seen.update(kwargs.get("argument_spec") or args[0])
        raise _Captured

    mod.AnsibleModule = capture
    with pytest.raises(_Captured):
        mod.main()
    return seen


def test_every_module_lives_in_the_collection():
    """One home for what Ansible runs: no role carries its own modules (a role's ``library/``)."""
    stray = sorted(p.relative_to(REPO).as_posix() for p in ROLES.glob("*/library/*"))
    assert not stray, f"modules in a role's library/ (their home is the collection's plugins/modules): {stray}"


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_documentation_examples_and_return_are_yaml(path):
    docs = doc_strings(path)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, f"{path.relative_to(REPO)}: has {sorted(docs)}"
    documentation = yaml.safe_load(docs["DOCUMENTATION"])
    assert documentation["module"] == path.stem
    assert isinstance(documentation.get("short_description"), str)
    assert is_text(documentation.get("description")), f"{path.stem}: description {documentation.get('description')!r}"
    returns = yaml.safe_load(docs["RETURN"])
    assert isinstance(returns, dict) and returns
    pending = list(returns.items())
    while pending:  # the return values and what each `contains`
        key, value = pending.pop()
        assert is_text(value.get("description")), f"{path.stem}: RETURN {key}: description {value.get('description')!r}"
        assert set(value) <= RETURN_KEYS, f"{path.stem}: RETURN {key} has keys {sorted(set(value) - RETURN_KEYS)}"
        pending += [(f"{key}.{k}", v) for k, v in (value.get("contains") or {}).items()]
    examples = yaml.safe_load(docs["EXAMPLES"])
    assert isinstance(examples, list) and examples, "EXAMPLES: a list of tasks"


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_documented_options_are_the_argument_spec(path, rendered):
    spec = argument_spec(path)
    options = rendered[fqcn(path)]["doc"].get("options") or {}  # fragments (sgdeploy.host.model_attributes.hub) merged
    assert sorted(options) == sorted(spec), f"{path.stem}: documented {sorted(options)}, argument_spec {sorted(spec)}"
    for name, want in spec.items():
        doc = options[name]
        assert set(doc) <= OPTION_KEYS, f"{path.stem}: option {name} has keys {sorted(set(doc) - OPTION_KEYS)}"
        assert is_text(doc.get("description")), f"{path.stem}: option {name}: description {doc.get('description')!r}"
        kind = want.get("type", "str")
        assert doc.get("type", "str") == kind, f"{path.stem}: option {name} type"
        assert bool(doc.get("required", False)) == bool(want.get("required", False)), f"{path.stem}: {name} required"
        assert doc.get("elements") == want.get("elements"), f"{path.stem}: option {name} elements"
        assert doc.get("choices") == want.get("choices"), f"{path.stem}: option {name} choices"
        default, documented = want.get("default"), doc.get("default")
        if kind == "float" and default is not None and documented is not None:
            default, documented = float(default), float(documented)
        assert documented == default, f"{path.stem}: option {name} default: documented {documented!r}, is {default!r}"


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_examples_call_the_module_by_its_fully_qualified_name(path):
    tasks = yaml.safe_load(doc_strings(path).get("EXAMPLES") or "[]") or []
    keywords = {"name", "register", "when", "loop", "loop_control", "vars", "async", "poll", "until", "retries",
                "delay", "changed_when", "failed_when", "no_log", "check_mode", "tags", "become", "delegate_to",
                "module_defaults", "block", "always", "rescue", "environment", "notify"}
    called = set()
    for task in tasks:
        inner_tasks = [task]
        if "block" in task:
            inner_tasks = task["block"] + task.get("rescue", []) + task.get("always", [])
        for inner in inner_tasks:
            actions = [k for k in inner if k not in keywords]
            assert len(actions) == 1, f"{path.stem}: EXAMPLES task {inner.get('name')!r} calls {actions}"
            assert actions[0].count(".") >= 2, f"{path.stem}: EXAMPLES call {actions[0]}, not a fully qualified name"
            assert inner.get("name"), f"{path.stem}: every EXAMPLES task has a name"
            called.add(actions[0])
    assert fqcn(path) in called, f"{path.stem}: EXAMPLES never call {fqcn(path)}"


@pytest.fixture(scope="module")
def rendered():
    """`ansible-doc --json` of every module, as a user would read them."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(BIN / "ansible-doc"), "--json", "-t", "module", *(fqcn(p) for p in MODULES)], cwd=REPO,
                          env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert sorted(out) == sorted(fqcn(p) for p in MODULES)
    return out


@pytest.mark.parametrize("path", MODULES, ids=IDS)
def test_ansible_doc_renders_with_check_and_diff_support(path, rendered):
    doc = rendered[fqcn(path)]["doc"]
    attributes = doc.get("attributes") or {}
    assert {"check_mode", "diff_mode"} <= set(attributes), f"{path.stem}: attributes {sorted(attributes)}"
    for name, attribute in attributes.items():
        assert attribute.get("description"), f"{path.stem}: attribute {name} has no description"
        assert attribute.get("support") in SUPPORT, f"{path.stem}: attribute {name} support {attribute.get('support')}"
    assert rendered[fqcn(path)]["examples"].strip()
    assert rendered[fqcn(path)]["return"], f"{path.stem}: RETURN is empty"


def test_ansible_doc_renders_every_collection_module_as_text():
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(BIN / "ansible-doc"), *[fqcn(p) for p in COLLECTION_MODULES]], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    for path in COLLECTION_MODULES:
        assert f"sgdeploy.host.{path.stem}" in proc.stdout and "EXAMPLES:" in proc.stdout


# ---------------------------------------------------------------------------------------------
# meta/runtime.yml: requires_ansible and the action group


def runtime() -> dict:
    return yaml.safe_load((COLLECTION / "meta" / "runtime.yml").read_text(encoding="utf-8"))


def test_requires_ansible_admits_the_pinned_ansible_core():
    pin = next(line.split("==")[1].strip() for line in (REPO / "requirements.txt").read_text().splitlines()
               if line.startswith("ansible-core=="))
    floor = runtime()["requires_ansible"].removeprefix(">=")
    assert tuple(map(int, floor.split("."))) <= tuple(map(int, pin.split(".")))
    assert floor.split(".")[:2] == pin.split(".")[:2], "requires_ansible: the minor line the project pins and tests"


def test_the_deploy_group_is_the_modules_that_take_state_dir_and_run_id(rendered):
    group = runtime()["action_groups"]["deploy"]
    both = sorted(p.stem for p in COLLECTION_MODULES if {"state_dir", "run_id"} <= set(argument_spec(p)))
    assert sorted(group) == both
    documented = sorted(p.stem for p in COLLECTION_MODULES
                        if "sgdeploy.host.deploy" in ((rendered[fqcn(p)]["doc"].get("attributes") or {})
                                                      .get("action_group", {}).get("membership") or []))
    assert documented == both, "each member says so in its attributes (sgdeploy.host.attributes.actiongroup_deploy)"


def test_module_defaults_of_the_group_reach_its_modules(tmp_path):
    """A play sets state_dir and run_id once for group/sgdeploy.host.deploy; a member is called with both."""
    state = tmp_path / "state"
    (state / "txn").mkdir(parents=True)
    (state / "txn" / "journal.json").write_text(json.dumps({"run_id": "run-1", "step": "stopping", "config": "ar",
                                                            "step_at": "2026-12-03T14:00:00Z"}))
    playbook = tmp_path / "group.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Group defaults", "hosts": "localhost", "gather_facts": False,
        "module_defaults": {"group/sgdeploy.host.deploy": {"state_dir": str(state), "run_id": "run-7"}},
        "tasks": [{"name": "Recover (check mode; run_id is required, state_dir holds run-1's journal)",
                   "sgdeploy.host.sglang_deploy_switch": {"action": "recover"}, "check_mode": True,
                   "register": "recovered"},
                  {"name": "Show", "ansible.builtin.debug": {"msg": "FOUND {{ recovered.found }}"}}],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_LOCALHOST_WARNING="false")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(playbook)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # run_id (required) came from the group's defaults
    assert "FOUND an interrupted switch to ar (run run-1, step stopping" in proc.stdout, proc.stdout
