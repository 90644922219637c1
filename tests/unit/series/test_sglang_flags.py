"""The committed table of SGLang 0.5.23's option strings (sgdeploy/sglang_flags.json) is what the pristine
wheel's own parser gives: regenerated here from the wheel, by `ServerArgs.add_cli_args` on the CPU, and
compared with the committed file (a changed pin or parser must come with a regenerated table:
`python -m sgdeploy.sglang_flags --python build/cpu-venv/bin/python --extra-path tests/unit/series`).

Slow (the CPU virtualenv of test_patched_cli.py, made when missing): `pytest -m slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_patched_cli import cpu_python  # noqa: F401 - the shared CPU venv fixture

from sgdeploy import sglang_flags

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent  # torchvision_standin.py


def test_committed_table_is_what_the_pristine_wheels_parser_gives(cpu_python, tmp_path):  # noqa: F811
    site = sglang_flags.install_pristine(tmp_path / "site")
    regenerated = sglang_flags.generate(cpu_python, site, [HERE])
    committed = json.loads(sglang_flags.TABLE_PATH.read_text())
    assert sglang_flags.dump(regenerated) == sglang_flags.TABLE_PATH.read_text(), (
        f"added: {sorted(set(regenerated['flags']) - set(committed['flags']))[:20]}, "
        f"removed: {sorted(set(committed['flags']) - set(regenerated['flags']))[:20]}")
