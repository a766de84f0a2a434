"""What ``shardstream server`` prints: text for people, JSON for collectors, no colour codes
or alembic chatter, "server ready" only once it answers, one line for a busy port."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from shardstream.server.logs import JSONFormatter, TextFormatter, resolve_format
from tests.fixtures.server import server_process


def test_a_busy_port_is_one_error_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "shardstream", "server", "--port", str(port)],
            env={
                **os.environ,
                "SHARDSTREAM_DATA_DIR": str(tmp_path),
                "SHARDSTREAM_LOG_LEVEL": "INFO",
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"shardstream: error: port {port} on 127.0.0.1 is in use"]
    assert not (tmp_path / "shardstream.db").exists()  # refused before migrating anything


def _startup_output(tmp_path: Path, *args: str) -> list[str]:
    """The log lines of a server that started, answered /readyz, and was stopped."""
    with server_process(tmp_path, env={"SHARDSTREAM_LOG_LEVEL": "INFO"}, args=args) as server:
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.url}/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.1)
    return (tmp_path / "server.log").read_text().splitlines()


def test_json_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    lines = _startup_output(tmp_path)
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert not any("color_message" in e for e in entries)
    assert not any("\x1b[" in line for line in lines)
    assert not any(e["logger"].startswith("alembic") for e in entries), lines
    messages = [e["message"] for e in entries]
    assert sum(m.startswith("database schema ") for m in messages) == 1, messages
    assert messages.index("server ready") > next(
        i for i, m in enumerate(messages) if m.startswith("listening on http://127.0.0.1:")
    )


def test_text_lines_on_request(tmp_path: Path) -> None:
    lines = _startup_output(tmp_path, "--log-format", "text")
    assert lines and not any(line.startswith("{") for line in lines), lines
    assert not any("\x1b[" in line or "alembic" in line for line in lines), lines
    ready = next(line for line in lines if "server ready" in line)
    assert " INFO shardstream.server: server ready database=sqlite:///" in ready


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    assert resolve_format("auto", _Terminal()) == "text"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("json", _Terminal()) == "json"


@pytest.mark.parametrize("formatter", [JSONFormatter(), TextFormatter()])
def test_uvicorn_colour_codes_never_reach_the_log(formatter: logging.Formatter) -> None:
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelname": "INFO",
            "msg": "Started server process [\x1b[36m%d\x1b[0m]",
            "args": (42,),
            "color_message": "Started server process [\x1b[36m%d\x1b[0m]",
        }
    )
    line = formatter.format(record)
    assert "color_message" not in line and "\x1b" not in line and "\\u001b" not in line
    assert "Started server process [42]" in line
