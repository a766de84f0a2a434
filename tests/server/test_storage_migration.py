"""Migration 0003_storage_locations on a database at 0002 with existing rows.

Datasets whose versions all sit at ``<P>/v<number>`` get ``P`` as their location; any
other dataset (client-placed versions, nested or shared parents, no versions) gets none
and is placed under the server's default root at its next draft. Versions are untouched.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from shardstream.server.db import make_engine
from shardstream.server.migrate import upgrade
from tests.fixtures.server import start_server

# dataset -> storage roots of its versions 1, 2, ...
OLD_ROWS = {
    "placed": ["{root}/placed/v1", "{root}/placed/v2"],  # the old default layout
    "anywhere": ["s3://some-bucket/anything"],  # chosen by a client
    "mixed": ["{root}/mixed/v1", "s3://some-bucket/x/v2"],
    "outer": ["s3://shared/p/v1"],  # outer's parent contains inner's: both unset
    "inner": ["s3://shared/p/q/v1"],
    "empty": [],
}


def _at_0002_with_rows(url: str, root: str) -> None:
    engine = make_engine(url)
    upgrade(engine, "0002")
    with engine.begin() as conn:
        for name, roots in OLD_ROWS.items():
            conn.execute(
                text(
                    "INSERT INTO datasets (name, description, owner, created_at) "
                    "VALUES (:name, '', 'me', CURRENT_TIMESTAMP)"
                ),
                {"name": name},
            )
            for number, storage_root in enumerate(roots, start=1):
                conn.execute(
                    text(
                        "INSERT INTO versions (dataset_id, number, status, columns, "
                        "storage_root, builder_config, lineage, created_by, created_at, "
                        "num_shards, total_samples, total_bytes, total_raw_bytes) SELECT id, "
                        ":number, 'draft', '{}', :root, '{}', '{}', 'me', CURRENT_TIMESTAMP, "
                        "0, 0, 0, 0 FROM datasets WHERE name = :name"
                    ),
                    {"number": number, "root": storage_root.format(root=root), "name": name},
                )
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_existing_rows_get_locations_safely(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    old_root = (tmp_path / "old-root").as_uri()
    _at_0002_with_rows(url, old_root)
    engine = make_engine(url)
    upgrade(engine)
    with closing(engine.connect()) as conn:
        locations = dict(conn.execute(text("SELECT name, location FROM datasets")).all())
        version_roots = conn.execute(text("SELECT count(*) FROM versions")).scalar()
    engine.dispose()
    assert locations == {
        "placed": f"{old_root}/placed",
        "anywhere": None,
        "mixed": None,
        "outer": None,
        "inner": None,
        "empty": None,
    }
    assert version_roots == sum(len(r) for r in OLD_ROWS.values())  # no row lost

    # A server whose roots include the old one keeps "placed" where it was; the others
    # get fresh locations under its default root.
    default = tmp_path / "new-root"
    with start_server(
        tmp_path / "srv",
        database_url=url,
        storage_root=default.as_uri(),
        storage_roots=old_root,
    ) as live:
        api = httpx.Client(base_url=live.url, headers=live.headers, timeout=30)
        placed = api.post("/v1/datasets/placed/versions", json={"columns": {}}).json()
        assert placed["storage_root"] == f"{old_root}/placed/v3"
        for name in ("anywhere", "outer", "empty"):
            draft = api.post(f"/v1/datasets/{name}/versions", json={"columns": {}}).json()
            assert draft["storage_root"].startswith(f"{default.as_uri()}/{name}-"), draft
