"""Every code example in README.md and docs/ runs.

Each Markdown file becomes one bash script, its examples in document order: ``bash``/``sh``
blocks verbatim, ``python`` blocks through ``python - <<'EOF'``, so each python example must
be complete on its own (as a reader would paste it). The script runs in a fresh directory with
this environment's ``shardstream`` on ``PATH``, in its own session, killed whole at the end;
the documents' scripts run side by side (see ``doc_runs``).

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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.netns import STARTS_RAY, wrapped

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


def starts_ray(doc: Path) -> bool:
    """True when one of the document's runnable examples starts or joins Ray."""
    return any(
        e.skip_reason is None and STARTS_RAY.search(e.body) is not None for e in examples(doc)
    )


def _docs_with_examples() -> list[Path]:
    return [p for p in DOC_FILES if any(e.skip_reason is None for e in examples(p))]


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_every_skipped_example_says_why(doc: Path) -> None:
    for block in examples(doc):
        assert block.skip_reason != "", f"{doc.name}:{block.line}: not-run needs a reason"


@dataclass
class _DocRun:
    """One document's examples running as a script in their own directory and session."""

    doc: Path
    process: subprocess.Popen[bytes]
    log: Path
    deadline: float

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # background servers it started
        self.process.wait()


def _start(doc: Path, tmp: Path) -> _DocRun:
    script = tmp / "examples.sh"
    script.write_text(as_script(doc, examples(doc)))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["SHARDSTREAM_CACHE_DIR"] = str(tmp / "cache")
    env["SHARDSTREAM_DOCS_REPO"] = str(REPO)
    work = tmp / "work"
    work.mkdir()
    log = tmp / "output.log"  # a file, not a pipe: nobody reads it until the script ends
    with log.open("wb") as out:
        process = subprocess.Popen(
            # A document whose examples start Ray runs in a private network namespace
            # (tests/fixtures/netns.py): Ray's dashboard probes a cloud metadata address.
            wrapped(["bash", str(script)]) if starts_ray(doc) else ["bash", str(script)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _DocRun(doc, process, log, time.monotonic() + 300)


@pytest.fixture(scope="module")
def doc_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Path, _DocRun]]:
    """The examples of every document this session tests, all started at once.

    Each python example is a fresh interpreter importing torch (about 1.5 s of CPU) and
    most documents have several; run one after another they took minutes. Documents share
    nothing (own directory, own session, servers on their own ports), so they run side by
    side and the slowest one, not their sum, sets the time.
    """
    docs = [
        item.callspec.params["doc"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_examples_run"
    ]
    runs = {doc: _start(doc, tmp_path_factory.mktemp(doc.stem)) for doc in docs}
    try:
        yield runs
    finally:
        for run in runs.values():
            run.stop()


@pytest.mark.slow
@pytest.mark.parametrize("doc", _docs_with_examples(), ids=lambda p: p.name)
def test_examples_run(doc: Path, doc_runs: dict[Path, _DocRun]) -> None:
    run = doc_runs[doc]
    try:
        returncode = run.process.wait(timeout=max(run.deadline - time.monotonic(), 0))
    finally:
        run.stop()
    out = run.log.read_text(errors="replace")
    assert returncode == 0, f"{doc.name} examples failed:\n{out[-6000:]}"
