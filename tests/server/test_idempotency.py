"""``Idempotency-Key`` on ``POST /v1/datasets/{name}/versions``: a retried request after a
lost answer opens one draft, not two; and migration 0002, which stores the key."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from shardstream.api_client import APIClient
from shardstream.cli import main
from shardstream.server.app import create_app
from shardstream.server.config import Settings
from shardstream.server.db import make_engine
from shardstream.server.migrate import current_revision, head_revision, upgrade
from tests.fixtures.server import LiveServer

DRAFT = {"columns": {"tokens": "ndarray:uint16:2048"}, "lineage": {"source": "wiki dump"}}
VERSIONS = "/v1/datasets/wiki/versions"


@pytest.fixture
def wiki(api: TestClient) -> TestClient:
    assert api.post("/v1/datasets", json={"name": "wiki"}).status_code == 201
    return api


def _create(api: TestClient, key: str | None, body: dict[str, Any] = DRAFT) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return api.post(VERSIONS, json=body, headers=headers)


def _drafts(api: TestClient) -> list[int]:
    return [v["number"] for v in api.get(VERSIONS).json()["items"]]


def test_a_replayed_key_returns_the_first_draft(wiki: TestClient) -> None:
    key = str(uuid.uuid4())
    first = _create(wiki, key)
    assert first.status_code == 201, first.text
    again = _create(wiki, key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert _drafts(wiki) == [1]
    # A replay answers with the draft as it is now, whatever happened to it since.
    assert wiki.post(f"{VERSIONS}/1/abort").status_code == 200
    late = _create(wiki, key)
    assert (late.status_code, late.json()["status"], _drafts(wiki)) == (200, "aborted", [1])


def test_another_body_under_a_used_key_is_a_422(wiki: TestClient) -> None:
    key = str(uuid.uuid4())
    assert _create(wiki, key).status_code == 201
    other = _create(wiki, key, {**DRAFT, "columns": {"text": "str"}})
    assert other.status_code == 422
    detail = other.json()["detail"]
    assert "Idempotency-Key" in detail and key in detail and "version 1 of 'wiki'" in detail
    # Omitted fields and their defaults are the same request.
    assert _create(wiki, key, {**DRAFT, "builder_config": {}}).status_code == 200
    assert _drafts(wiki) == [1]


def test_new_keys_and_no_key_open_new_drafts(wiki: TestClient) -> None:
    assert _create(wiki, str(uuid.uuid4())).status_code == 201
    assert _create(wiki, str(uuid.uuid4())).status_code == 201
    assert _create(wiki, None).status_code == 201
    assert _create(wiki, None).status_code == 201
    assert _drafts(wiki) == [1, 2, 3, 4]


def test_a_key_belongs_to_one_dataset(wiki: TestClient) -> None:
    key = str(uuid.uuid4())
    assert _create(wiki, key).status_code == 201
    assert wiki.post("/v1/datasets", json={"name": "books"}).status_code == 201
    books = wiki.post("/v1/datasets/books/versions", json=DRAFT, headers={"Idempotency-Key": key})
    assert (books.status_code, books.json()["number"]) == (201, 1)
    assert _drafts(wiki) == [1]


@pytest.mark.parametrize("bad", ["", "has space", "x" * 256])
def test_a_malformed_key_is_a_422(wiki: TestClient, bad: str) -> None:
    r = _create(wiki, bad)
    assert r.status_code == 422
    assert "Idempotency-Key" in r.json()["detail"]
    assert _drafts(wiki) == []


def _concurrently(live: LiveServer, keys: list[str]) -> list[httpx.Response]:
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=60) as client:
        assert client.post("/v1/datasets", json={"name": "wiki"}).status_code == 201
        start = threading.Barrier(len(keys))
        answers: list[httpx.Response] = []

        def create(key: str) -> None:
            start.wait()
            answers.append(client.post(VERSIONS, json=DRAFT, headers={"Idempotency-Key": key}))

        threads = [threading.Thread(target=create, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return answers


def test_concurrent_replays_open_one_draft(live: LiveServer) -> None:
    answers = _concurrently(live, [str(uuid.uuid4())] * 12)
    statuses = Counter(r.status_code for r in answers)
    assert statuses == {201: 1, 200: 11}, [r.text for r in answers]
    assert {r.json()["number"] for r in answers} == {1}


def test_concurrent_new_keys_open_one_draft_each(live: LiveServer) -> None:
    answers = _concurrently(live, [str(uuid.uuid4()) for _ in range(12)])
    assert [r.status_code for r in answers] == [201] * 12, [r.text for r in answers]
    assert sorted(r.json()["number"] for r in answers) == list(range(1, 13))


class LoseFirstDraftAnswer(httpx.BaseTransport):
    """Deliver every request, but drop the answer to the first draft creation (which the
    server carried out), as a timeout or a dropped connection would."""

    def __init__(self) -> None:
        self._inner = httpx.HTTPTransport()
        self.keys: list[str | None] = []  # Idempotency-Key of each draft creation sent

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/versions"):
            self.keys.append(request.headers.get("Idempotency-Key"))
            if len(self.keys) == 1:
                response.read()
                response.close()
                raise httpx.ReadTimeout("answer lost on the way back", request=request)
        return response


def test_client_retry_after_a_lost_answer_reuses_the_key(live: LiveServer) -> None:
    transport = LoseFirstDraftAnswer()
    with APIClient(live.url, live.token, backoff_s=0.01, transport=transport) as api:
        api.create_dataset("wiki")
        version = api.create_version("wiki", DRAFT["columns"], lineage=DRAFT["lineage"])
        assert version.number == 1
        assert [v.number for v in api.list_versions("wiki")] == [1]
        # One key per call, the same on its retry; the next call gets a fresh one.
        assert api.create_version("wiki", DRAFT["columns"]).number == 2
    first, retry, later = transport.keys
    assert first is not None and retry == first and later not in (None, first)
    uuid.UUID(first)


def test_client_replays_an_explicit_key(live: LiveServer) -> None:
    with APIClient(live.url, live.token) as api:
        api.create_dataset("wiki")
        key = str(uuid.uuid4())
        first = api.create_version("wiki", DRAFT["columns"], idempotency_key=key)
        again = api.create_version("wiki", DRAFT["columns"], idempotency_key=key)
        assert again == first
        assert [v.number for v in api.list_versions("wiki")] == [1]


def _at_0001_with_a_version(url: str) -> None:
    engine = make_engine(url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO datasets (name, description, owner, created_at) "
                "VALUES ('wiki', '', 'me', CURRENT_TIMESTAMP)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO versions (dataset_id, number, status, columns, storage_root, "
                "builder_config, lineage, created_by, created_at, num_shards, total_samples, "
                "total_bytes, total_raw_bytes) SELECT id, 1, 'draft', '{}', 'file:///w', '{}', "
                "'{}', 'me', CURRENT_TIMESTAMP, 1, 3, 10, 10 FROM datasets"
            )
        )
        conn.execute(
            text(
                "INSERT INTO shards (version_id, idx, key, samples, raw_bytes, stored_bytes, "
                "hashes) SELECT id, 0, 'shard.00000.mds', 3, 10, 10, '{}' FROM versions"
            )
        )
    engine.dispose()


def _check_upgraded(url: str) -> None:
    engine = make_engine(url)
    assert current_revision(engine) == head_revision()
    with closing(engine.connect()) as conn:
        # No table was copied: the shard that points at the version is still there.
        assert conn.execute(text("SELECT count(*) FROM shards")).scalar() == 1
        assert conn.execute(text("SELECT idempotency_key FROM versions")).all() == [(None,)]
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrate_command_adds_the_key_column(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    _at_0001_with_a_version(url)
    assert main(["server", "migrate", "--database-url", url]) == 0
    assert "0001 -> " in capsys.readouterr().out  # to the newest shipped revision
    _check_upgraded(url)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migrate_on_start_adds_the_key_column(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    _at_0001_with_a_version(url)
    app = create_app(Settings(database_url=url, data_dir=tmp_path, log_level="WARNING"))
    app.state.engine.dispose()
    _check_upgraded(url)
