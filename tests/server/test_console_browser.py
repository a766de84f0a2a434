"""The web console in a real browser: Debian's chromium driven by Selenium against a live
server (uvicorn on loopback).

Signs in, walks datasets -> versions -> shards -> runs -> a run, sees a new checkpoint
after a commit, creates a read-only token in the tokens page, and signs in with it to
find no admin page. Every page is photographed into ``$SHARDSTREAM_CONSOLE_SCREENSHOTS``
(default: the test's temporary folder); docs/console.md shows the committed set.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from fastapi.testclient import TestClient
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path / "live", migrate_on_start=True) as live:
        yield live


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
        # Nothing but loopback: no update checks, sync, prefetching or name lookups.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    service = Service(shutil.which("chromedriver") or "chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("SHARDSTREAM_CONSOLE_SCREENSHOTS", tmp_path / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def seed(server: LiveServer) -> int:
    """Two datasets, a run with checkpoints from two launches (2 then 4 ranks)."""
    with httpx.Client(base_url=server.url, headers=server.headers) as api:
        for name, shards in (("wiki-tokens", 24), ("code-tokens", 6)):
            make_published(
                cast(TestClient, api), name, server.storage_root / name, shards=shards, size=4096
            )
        body = {
            "name": "llama-8b-pretrain",
            "sources": [{"dataset": "wiki-tokens", "version": 1}],
            "global_batch_size": 6,
        }
        run: dict[str, Any] = api.post("/v1/runs", json=body).json()
        for step in range(1, 9):
            world, session = (2, "first") if step <= 5 else (4, "second")
            done = step * 6
            plan = {"world_size": world, "session": session}
            commit = {"step": step, "epoch": done // 72, "sample_in_epoch": done % 72, "plan": plan}
            assert api.post(f"/v1/runs/{run['id']}/checkpoints", json=commit).status_code == 201
    return int(run["id"])


def test_console_in_a_real_browser(server: LiveServer, browser: WebDriver, shots: Path) -> None:
    run_id = seed(server)

    def shot(name: str) -> None:
        assert browser.save_screenshot(str(shots / f"{name}.png"))

    def go(by: str, value: str) -> None:
        """Click a link or button and wait for the page it loads (a click returns before
        the navigation is done: reading at once could read the old page)."""
        old = browser.find_element(By.TAG_NAME, "html")
        browser.find_element(by, value).click()
        WebDriverWait(browser, 30).until(expected_conditions.staleness_of(old))

    def text(element_id: str) -> str:
        return str(browser.find_element(By.ID, element_id).text)

    # Sign in: any console page sends an anonymous visitor to the sign-in form first.
    browser.get(f"{server.url}/ui/runs")
    assert "/ui/login" in browser.current_url
    browser.find_element(By.ID, "token").send_keys("ss_wrong")
    go(By.ID, "sign-in")
    assert "does not know that token" in text("sign-in-error").lower()
    browser.find_element(By.ID, "token").send_keys(server.token)
    shot("sign-in")
    go(By.ID, "sign-in")
    assert browser.current_url.endswith("/ui/runs")
    cookie = browser.get_cookie("shardstream_console")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert cookie["value"] != server.token  # a session id, never the token
    # The content security policy leaves the page's own styles working.
    header = browser.find_element(By.TAG_NAME, "header")
    assert header.value_of_css_property("background-color") == "rgba(29, 42, 58, 1)"

    # Datasets -> a dataset's versions -> a version's shards, sorted and paged.
    go(By.ID, "nav-datasets")
    assert "wiki-tokens" in text("datasets") and "code-tokens" in text("datasets")
    shot("datasets")
    go(By.LINK_TEXT, "wiki-tokens")
    assert "published" in text("versions")
    shot("dataset")
    go(By.LINK_TEXT, "v1")
    assert "shard.00023.mds" in text("shards")
    go(By.ID, "sort-idx")  # descending
    rows = browser.find_elements(By.CSS_SELECTOR, "#shards tr")
    assert "shard.00023.mds" in rows[1].text
    shot("version")

    # Runs -> a run: progress, the chart with its resume and rank change, checkpoints.
    go(By.ID, "nav-runs")
    assert "llama-8b-pretrain" in text(f"run-{run_id}")
    shot("runs")
    go(By.PARTIAL_LINK_TEXT, "llama-8b-pretrain")
    chart = browser.find_element(By.ID, "chart")
    assert len(chart.find_elements(By.CSS_SELECTOR, "circle.point")) == 8
    assert "4 ranks" in chart.text
    assert text("samples-consumed") == "48"
    shot("run")
    with httpx.Client(base_url=server.url, headers=server.headers) as api:
        commit = {"step": 9, "epoch": 0, "sample_in_epoch": 54, "plan": {"world_size": 4}}
        assert api.post(f"/v1/runs/{run_id}/checkpoints", json=commit).status_code == 201
    browser.refresh()
    assert "54" in text("checkpoint-9") and text("samples-consumed") == "54"

    # Tokens (admin): create a read-only token; its secret is shown once.
    go(By.ID, "nav-tokens")
    browser.find_element(By.ID, "token-name").send_keys("dashboard-viewer")
    browser.find_element(By.ID, "token-datasets").send_keys("wiki-tokens")
    go(By.ID, "create")
    secret = text("new-secret")
    assert secret.startswith("ss_")
    shot("tokens")

    # The read-only token: no tokens page in the menu, and none behind its address.
    go(By.ID, "sign-out")
    assert "/ui/login" in browser.current_url
    browser.find_element(By.ID, "token").send_keys(secret)
    go(By.ID, "sign-in")
    assert browser.find_elements(By.ID, "nav-tokens") == []
    assert "dashboard-viewer (read)" in text("signed-in-as")
    go(By.ID, "nav-datasets")
    assert "code-tokens" not in text("datasets")  # outside its datasets: not shown
    browser.get(f"{server.url}/ui/tokens")
    assert "403" in browser.title and "admin" in text("error-message")
    shot("read-only-token")

    pictures = sorted(p.name for p in shots.glob("*.png"))
    assert pictures == sorted(
        f"{n}.png"
        for n in (
            "sign-in",
            "datasets",
            "dataset",
            "version",
            "runs",
            "run",
            "tokens",
            "read-only-token",
        )
    )
    assert all((shots / p).stat().st_size > 5_000 for p in pictures)


@pytest.fixture
def other_site(server: LiveServer) -> Iterator[str]:
    """Another origin on loopback (another port) serving a page that frames the console's
    sign-in form and, as a control, the server's health check."""
    page = (
        f"<iframe id='control' src='{server.url}/healthz'></iframe>"
        f"<iframe id='console' src='{server.url}/ui/login'></iframe>"
    ).encode()

    class Framer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Framer)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()
        thread.join()


def test_no_other_page_can_frame_the_console(
    server: LiveServer, browser: WebDriver, other_site: str
) -> None:
    """The control frame loads; the console refuses to be framed (Chrome's error page)."""
    browser.get(other_site)

    def loaded(frame: str) -> str:
        """The frame's address once its navigation has ended (about:blank before)."""
        browser.switch_to.default_content()
        browser.switch_to.frame(frame)
        href = browser.execute_script(
            "return document.readyState === 'complete' ? location.href : 'about:blank'"
        )
        return "" if href == "about:blank" else str(href)

    assert WebDriverWait(browser, 30).until(lambda _: loaded("control")).endswith("/healthz")
    assert '"ok"' in browser.find_element(By.TAG_NAME, "body").text.lower()
    refused = WebDriverWait(browser, 30).until(lambda _: loaded("console"))
    assert refused.startswith("chrome-error://"), refused
    assert browser.find_elements(By.ID, "token") == []
