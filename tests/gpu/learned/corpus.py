"""TEST EQUIPMENT: the text the learned test models train on, and the held-out prompts (tests/gpu/learned/README.md).

The text is the Python source present on the GPU machine (the standard library and the site-packages of the
Python that runs there): real code, docstrings and comments that nobody here wrote, and nothing fetched.
Test folders are left out. Files are split by a digest of their path, so the held-out files never reach the
tokenizer, the target or the drafter, and the split is the same on every machine that has the same files.

Prompts come from held-out files only, of two kinds: ``code`` (from a ``def`` line on) and ``prose`` (from the
start of a docstring or of a run of ``#`` comments), each cut to the same number of tokens.
"""

from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from pathlib import Path

HELD_OUT_EVERY = 20  # one file in 20 (by path digest) is held out
SKIP_PARTS = {"test", "tests", "testing", "idlelib", "__pycache__"}
_DOCSTRING = re.compile(r'^[ \t]*(?:"""|\'\'\')[A-Z][a-z]+(?: [a-z,]+){4,}', re.MULTILINE)
_COMMENT = re.compile(r"^[ \t]*# [A-Z][a-z]+(?: [a-z,]+){4,}.*\n[ \t]*# \w", re.MULTILINE)
_DEF = re.compile(r"^[ \t]*def [a-z_][a-z0-9_]*\(", re.MULTILINE)


def roots() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["stdlib"], paths["purelib"]})


def held_out(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % HELD_OUT_EVERY == 0


def source_files(dirs: list[str]) -> list[tuple[str, Path]]:
    """(relative name, path) of every .py file under ``dirs``, test folders left out, in a fixed order."""
    out = []
    for d in dirs:
        base = Path(d)
        for f in sorted(base.rglob("*.py")):
            rel = f.relative_to(base).as_posix()
            if SKIP_PARTS & set(Path(rel).parts):
                continue
            out.append((rel, f))
    return out


def load(dirs: list[str], max_chars: int, seed: int = 0) -> tuple[list[str], list[str], dict]:
    """(training texts, held-out texts, facts). Training files are shuffled with ``seed`` and cut at ``max_chars``."""
    train, held, names = [], [], []
    files = source_files(dirs)
    rng = random.Random(seed)
    rng.shuffle(files)
    size = 0
    for rel, f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.strip():
            continue
        if held_out(rel):
            held.append(text)
            names.append(rel)
        elif size < max_chars:
            train.append(text)
            size += len(text)
    facts = {"roots": dirs, "train_files": len(train), "train_chars": size, "held_out_files": len(held),
             "held_out_chars": sum(map(len, held)), "held_out_every": HELD_OUT_EVERY}
    return train, held, facts


def prompt_starts(text: str) -> dict[str, list[int]]:
    """Character offsets where a prompt of each kind may start."""
    prose = [m.start() for m in _DOCSTRING.finditer(text)] + [m.start() for m in _COMMENT.finditer(text)]
    return {"code": [m.start() for m in _DEF.finditer(text)], "prose": sorted(prose)}


def prompts(held: list[str], encode, per_kind: int, tokens: int, seed: int = 1) -> list[dict]:
    """``per_kind`` prompts of each kind, each exactly ``tokens`` token ids long, from distinct held-out places.

    ``encode(text) -> list[int]``. Returns dicts with ``kind``, ``ids`` and ``text`` (the first characters)."""
    rng = random.Random(seed)
    cands: dict[str, list[tuple[int, int]]] = {"code": [], "prose": []}
    for i, text in enumerate(held):
        for kind, starts in prompt_starts(text).items():
            cands[kind] += [(i, s) for s in starts]
    out = []
    for kind in ("code", "prose"):
        pool = cands[kind]
        rng.shuffle(pool)
        taken = 0
        for i, s in pool:
            ids = encode(held[i][s:s + tokens * 12])
            if len(ids) < tokens:
                continue
            ids = ids[:tokens]
            out.append({"kind": kind, "ids": ids, "text": held[i][s:s + 160]})
            taken += 1
            if taken == per_kind:
                break
        if taken < per_kind:
            raise ValueError(f"only {taken} {kind} prompts of {tokens} tokens in the held-out files")
    return out
