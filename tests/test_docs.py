"""Every code example in README.md and docs/ runs.

Each Markdown file becomes one bash script, its examples in document order: ``bash``/``sh``
blocks verbatim, ``python`` blocks through ``python - <<'EOF'``, so each python example must
be complete on its own (as a reader would paste it). The script runs in a fresh directory with
this environment's ``shardstream`` on ``PATH``, in its own session, killed whole at the end;
the documents' scripts run side by side (see ``doc_runs``).

Each example has its own deadline (:data:`EXAMPLE_DEADLINE_S`), counted from the moment
the script reached it (the script records when each example starts): a slow document, or
the documents tested before it, never eat into a later example's time. A failure, a
timeout included, names the example and shows the output before it.

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
from typing import Any

import pytest

from tests.fixtures.netns import STARTS_DISTRIBUTED, STARTS_RAY, wrapped

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


EXAMPLE_DEADLINE_S = 300.0
"""How long one example may run (a fresh interpreter importing torch, on a loaded machine)."""


def as_script(path: Path, blocks: list[Example], progress: Path | None = None) -> str:
    """The document's runnable examples as one bash script; with ``progress``, each
    example first appends ``<label> <start time>`` to that file (for its deadline)."""
    parts = ["set -euo pipefail"]
    for block in blocks:
        if block.skip_reason is not None:
            continue
        label = f"{path.name}:{block.line} ({block.lang})"
        parts.append(f"echo '--- {label}' >&2")
        if progress is not None:
            parts.append(f"echo \"{label} $EPOCHREALTIME\" >> '{progress}'")
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


def needs_private_netns(doc: Path) -> bool:
    """True when one of the document's runnable examples starts Ray or torch.distributed
    (tests/fixtures/netns.py says why both run only where loopback is the only interface)."""
    return starts_ray(doc) or any(
        e.skip_reason is None and STARTS_DISTRIBUTED.search(e.body) is not None
        for e in examples(doc)
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
    progress: Path
    started: float

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # background servers it started
        self.process.wait()

    def current(self) -> tuple[str, float]:
        """(label, start time) of the example running now (the script's preamble before
        the first)."""
        try:
            last = self.progress.read_text().splitlines()[-1]
        except (OSError, IndexError):
            return f"{self.doc.name} (before its first example)", self.started
        label, _, at = last.rpartition(" ")
        return label, float(at)

    def finish(self, example_deadline_s: float = EXAMPLE_DEADLINE_S) -> str:
        """Wait for the script; ``""`` when every example passed, else what went wrong
        (the failing or overdue example) followed by the output. Stops the run."""
        try:
            while True:
                try:
                    code = self.process.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    label, since = self.current()
                    if time.time() - since > example_deadline_s:
                        self.stop()
                        return self._failure(
                            f"example {label} ran past its own {example_deadline_s:g} s "
                            "deadline (killed)"
                        )
        finally:
            self.stop()
        if code == 0:
            return ""
        return self._failure(f"example {self.current()[0]} failed (exit status {code})")

    def _failure(self, what: str) -> str:
        out = self.log.read_text(errors="replace")
        return f"{self.doc.name}: {what}; its output:\n{out[-6000:]}"


def _start(doc: Path, tmp: Path) -> _DocRun:
    script = tmp / "examples.sh"
    progress = tmp / "progress"
    script.write_text(as_script(doc, examples(doc), progress))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["SHARDSTREAM_CACHE_DIR"] = str(tmp / "cache")
    env["SHARDSTREAM_DOCS_REPO"] = str(REPO)
    work = tmp / "work"
    work.mkdir()
    log = tmp / "output.log"  # a file, not a pipe: nobody reads it until the script ends
    with log.open("wb") as out:
        process = subprocess.Popen(
            # A document whose examples start Ray or torch.distributed runs in a private
            # network namespace (tests/fixtures/netns.py): Ray's dashboard probes a cloud
            # metadata address, torch's TCPStore asks DNS for its loopback peers' names.
            wrapped(["bash", str(script)]) if needs_private_netns(doc) else ["bash", str(script)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _DocRun(doc, process, log, progress, time.time())


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


def _with_its_time(doc: Path) -> Any:
    """The document as a test parameter whose pytest timeout covers all its examples."""
    runnable = sum(e.skip_reason is None for e in examples(doc))
    limit = int(runnable * EXAMPLE_DEADLINE_S) + 120
    return pytest.param(doc, marks=pytest.mark.timeout(limit), id=doc.name)


@pytest.mark.slow
@pytest.mark.parametrize("doc", [_with_its_time(d) for d in _docs_with_examples()])
def test_examples_run(doc: Path, doc_runs: dict[Path, _DocRun]) -> None:
    failure = doc_runs[doc].finish()
    assert not failure, failure


def _doc_of(tmp: Path, *bodies: str) -> Path:
    """A Markdown document whose bash examples are ``bodies``, in order."""
    doc = tmp / "example.md"
    doc.write_text("# Example\n\n" + "".join(f"```bash\n{body}\n```\n\n" for body in bodies))
    (tmp / "run").mkdir()
    return doc


def test_each_example_has_its_own_deadline(tmp_path: Path) -> None:
    # 6 s of examples in all, none near its 5 s: a deadline shared by the document (or
    # by every document started together) would have run out.
    doc = _doc_of(tmp_path, "sleep 2", "sleep 2", "sleep 2; echo done")
    run = _start(doc, tmp_path / "run")
    assert run.finish(example_deadline_s=5.0) == ""
    assert "done" in run.log.read_text()


def test_an_overdue_example_is_named_with_the_output_before_it(tmp_path: Path) -> None:
    doc = _doc_of(tmp_path, "echo first example ran", "echo second started; sleep 600")
    run = _start(doc, tmp_path / "run")
    failure = run.finish(example_deadline_s=2.0)
    assert failure.startswith(
        "example.md: example example.md:7 (bash) ran past its own 2 s deadline (killed); "
        "its output:\n"
    ), failure
    assert "first example ran" in failure and "second started" in failure
    assert run.process.poll() is not None  # the whole session was killed


def test_a_failing_example_is_named_with_its_output(tmp_path: Path) -> None:
    doc = _doc_of(tmp_path, "echo one", "echo two; false", "echo three")
    failure = _start(doc, tmp_path / "run").finish()
    assert failure.startswith("example.md: example example.md:7 (bash) failed (exit status 1)")
    assert "two" in failure and "three" not in failure
