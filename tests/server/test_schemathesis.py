"""Property-based API test: schemathesis against the live OpenAPI spec, every endpoint.

Fails on any 5xx, any response that violates the documented schema, or an undocumented
content type. Seeded data (a published version, a run with a checkpoint) and fixed path
parameters let generated requests reach the core logic, not only 404s.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from shardstream.api_client import APIClient
from shardstream.wire import ShardRecord
from tests.fixtures.server import LiveServer

MAX_EXAMPLES = 6


def _seed(server: LiveServer, root: Path) -> None:
    root.mkdir()
    with APIClient(server.url, server.token) as api:
        api.create_dataset("wiki")
        draft = api.create_version("wiki", {"x": "int"}, storage_root=root.as_uri())
        records = []
        for i in range(3):
            (root / f"s{i}.mds").write_bytes(b"z" * 8)
            records.append(
                ShardRecord(index=i, key=f"s{i}.mds", samples=1, raw_bytes=8, stored_bytes=8)
            )
        api.add_shards("wiki", draft.number, records)
        api.publish_version("wiki", draft.number)
        api.create_version("wiki", {"x": "int"})  # a draft as version 2
        run = api.create_run([("wiki", 1)], global_batch_size=4)
        api.commit_checkpoint(run.id, step=1, epoch=0, sample_in_epoch=4)


def test_no_server_errors_and_schema_conformance(live: LiveServer, tmp_path: Path) -> None:
    _seed(live, tmp_path / "shards")
    config = tmp_path / "schemathesis.toml"
    config.write_text('[parameters]\n"path.name" = "wiki"\n"path.run_id" = 1\n"path.step" = 1\n')
    # the CLI installed beside this interpreter (CI runs pytest without activating the venv)
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert exe is not None
    result = subprocess.run(
        [
            exe,
            "--config-file",
            str(config),
            "run",
            f"{live.url}/openapi.json",
            "-H",
            f"Authorization: Bearer {live.token}",
            "--checks",
            "not_a_server_error,response_schema_conformance,content_type_conformance",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "7",
            "--generation-database",
            "none",
            "--no-color",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert "31 selected" in output or "Operations:" in output
    assert "passed" in output
