"""Every code example in README.md and docs/ runs.

Each Markdown file becomes one bash script, its examples in document order: ``bash``/``sh``
blocks verbatim, ``python`` blocks through ``python - <<'EOF'``, so each python example must
be complete on its own (as a reader would paste it). The script runs in a fresh directory with
this environment's ``shardstream`` on ``PATH``, in its own session, killed whole at the end.

A block that cannot run here (Docker, a real cluster) is preceded by a comment saying why,
``<!-- not-run: needs a Docker engine -->``; the reason is required.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE = {"python", "bash", "sh"}
_FENCE = re.compile(
    r"(?:<!--\s*not-run:(?P<reason>[^>]*)-->\s*\n)?^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```\s*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class Example:
    lang: str
    body: str
    line: int
    skip_reason: str | None


def examples(path: Path) -> list[Example]:
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        lang = match["lang"].lower()
        if lang not in RUNNABLE:
            continue
        reason = match["reason"]
        found.append(
            Example(
                lang=lang,
                body=match["body"],
                line=text.count("\n", 0, match.start("body")),
                skip_reason=reason.strip() if reason is not None else None,
            )
        )
    return found


def as_script(path: Path, blocks: list[Example]) -> str:
    parts = ["set -euo pipefail"]
    for block in blocks:
        if block.skip_reason is not None:
            continue
        parts.append(f"echo '--- {path.name}:{block.line} ({block.lang})' >&2")
        if block.lang == "python":
            parts.append(f"python - <<'SHARDSTREAM_DOC_EOF'\n{block.body}SHARDSTREAM_DOC_EOF")
        else:
            parts.append(block.body)
    return "\n".join(parts) + "\n"


def _docs_with_examples() -> list[Path]:
    return [p for p in DOC_FILES if any(e.skip_reason is None for e in examples(p))]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_every_skipped_example_says_why(doc: Path) -> None:
    for block in examples(doc):
        assert block.skip_reason != "", f"{doc.name}:{block.line}: not-run needs a reason"


@pytest.mark.slow
@pytest.mark.parametrize("doc", _docs_with_examples(), ids=lambda p: p.name)
def test_examples_run(doc: Path, tmp_path: Path) -> None:
    script = tmp_path / "examples.sh"
    script.write_text(as_script(doc, examples(doc)))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["SHARDSTREAM_CACHE_DIR"] = str(tmp_path / "cache")
    env["SHARDSTREAM_DOCS_REPO"] = str(REPO)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # background servers the examples started
    assert proc.returncode == 0, f"{doc.name} examples failed:\n{out[-6000:]}"
