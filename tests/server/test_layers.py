"""The server's layers (docs/architecture.md): routes parse, call a use case and answer;
use cases (``services/``) never see HTTP; every query lives in ``data/``, which knows
nothing above it; console pages read through the data layer and hold no SQL of their own.

Checked over every import statement of the server's modules (lazy ones too), so a
shortcut through the layers fails here rather than in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shardstream.server

SERVER = Path(shardstream.server.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, and every ``module.name`` it imports from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


SESSION_TYPE = frozenset({"sqlalchemy.orm", "sqlalchemy.orm.Session"})
"""The session's type, which a layer above the data may name to hand a session on."""


def _modules(folder: str) -> list[Path]:
    return sorted((SERVER / folder).rglob("*.py"))


def _offending(
    folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()
) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in _modules(folder):
        bad = sorted(
            name
            for name in _imports(path)
            if name.startswith(forbidden)
            and not name.startswith(allowed)
            and name not in SESSION_TYPE
        )
        if bad:
            found[str(path.relative_to(SERVER))] = bad
    return found


def test_routes_hold_no_queries() -> None:
    """A route gets its session from the request (``api.deps``) and hands it on: it may
    name the session's type, never build a query."""
    assert _offending("api", ("sqlalchemy",)) == {}


def test_use_cases_never_see_http_nor_the_layers_above() -> None:
    """Only starlette's thread pool, never a request, a response or a route's helper."""
    above = ("shardstream.server.api", "shardstream.server.console", "shardstream.server.app")
    http = ("fastapi", "starlette")
    pool = ("fastapi.concurrency", "starlette.concurrency")
    assert _offending("services", above + http, pool) == {}


def test_the_data_layer_knows_nothing_above_it() -> None:
    above = (
        "shardstream.server.api",
        "shardstream.server.services",
        "shardstream.server.console",
        "shardstream.server.app",
        "fastapi",
        "starlette",
    )
    assert _offending("data", above) == {}


def test_console_pages_hold_no_sql() -> None:
    """Pages read through ``data/`` and the use cases, as the API does."""
    assert _offending("console", ("sqlalchemy",)) == {}


def test_the_rule_is_seen_failing(tmp_path: Path) -> None:
    """The scan finds a query import in a route (so the rules above can fail)."""
    route = tmp_path / "route.py"
    route.write_text("def f():\n    from sqlalchemy import select\n")
    assert "sqlalchemy.select" in _imports(route)


@pytest.mark.parametrize("folder", ["api", "services", "data", "console"])
def test_each_layer_exists(folder: str) -> None:
    assert _modules(folder), folder
