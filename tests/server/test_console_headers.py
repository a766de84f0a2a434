"""Security headers on every console response: no framing, no sniffing, no referrer to
other origins, nothing cached.

The routes are read from the app's router, so a new console page is checked without
anyone remembering to add it here (a new path parameter needs an example value below).
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from shardstream.server.console.session import PREFIX
from tests.fixtures.console import browser, csrf_of, mint, run_with_checkpoints, sign_in
from tests.server.conftest import ADMIN

PARAMETER = re.compile(r"{(\w+)(?::\w+)?}")


def console_routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path template) the app serves under the console's prefix, through
    included routers too (``iter_route_contexts`` is how FastAPI's OpenAPI walks them)."""
    found: set[tuple[str, str]] = set()
    for route in iter_route_contexts(app.routes):
        path = route.path or ""
        if path == PREFIX or path.startswith(PREFIX + "/"):
            found.update((method, path) for method in route.methods or ())
    return sorted(found)


def example(values: dict[str, str], match: re.Match[str]) -> str:
    """The example value of a path parameter."""
    return values[match.group(1)]


def assert_protected(response: httpx.Response, what: str) -> None:
    headers = response.headers
    assert headers.get("x-frame-options") == "DENY", what
    policy = headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy, what
    assert "script-src" not in policy and "default-src 'none'" in policy, what  # no scripts
    assert headers.get("x-content-type-options") == "nosniff", what
    assert headers.get("referrer-policy") in ("no-referrer", "same-origin"), what
    assert "no-store" in headers.get("cache-control", ""), what


def test_every_console_route_sends_the_security_headers(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    routes = console_routes(app)
    assert ("GET", "/ui/login") in routes and ("POST", "/ui/tokens") in routes
    run_id = run_with_checkpoints(api, tmp_path)
    examples = {"name": "corpus", "number": "1", "run_id": str(run_id)}
    for method, template in routes:
        client = sign_in(app, ADMIN)
        values = dict(examples)
        if "{token_id}" in template:
            mint(api, f"victim-{len(values)}", ["read"])
            values["token_id"] = str(api.get("/v1/tokens").json()["items"][-1]["id"])
        missing = [p for p in PARAMETER.findall(template) if p not in values]
        assert not missing, f"{template}: give this test an example value for {missing}"
        path = PARAMETER.sub(partial(example, values), template)
        what = f"{method} {path}"
        if method == "GET":
            assert_protected(browser(app).get(path), f"{what} (signed out)")
            answer = client.get(path)
            assert answer.status_code in (200, 303), what
        else:
            form = {"csrf": csrf_of(client.get("/ui/datasets").text), "name": "made-here"}
            if path == "/ui/login":
                form = {"token": ADMIN}
            answer = client.post(path, data=form)
            assert answer.status_code in (200, 303), f"{what}: {answer.text[:300]}"
            assert_protected(browser(app).post(path, data=form), f"{what} (signed out)")
        assert_protected(answer, what)


def test_the_page_showing_a_new_secret_is_not_stored(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, ADMIN)
    csrf = csrf_of(client.get("/ui/tokens").text)
    made = client.post("/ui/tokens", data={"csrf": csrf, "name": "fresh", "scope": "read"})
    assert made.status_code == 200 and 'id="new-secret"' in made.text
    assert made.headers["cache-control"] == "no-store"
    assert_protected(made, "the new token's page")


def test_answers_before_any_page_carry_them_too(api: TestClient, app: FastAPI) -> None:
    anonymous = browser(app)
    assert_protected(anonymous.get("/ui/no-such-page"), "an unknown console path")
    assert_protected(anonymous.post("/ui/tokens", data={"name": "x"}), "a post with no session")
    huge = b"token=" + b"a" * (70 << 10)
    kind = {"Content-Type": "application/x-www-form-urlencoded"}
    assert_protected(anonymous.post("/ui/login", content=huge, headers=kind), "a 413")
    # The API is not a page: its answers are left as they were.
    assert "x-frame-options" not in api.get("/v1/datasets").headers
