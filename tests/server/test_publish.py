"""Publishing through the server: DraftVersion (build -> register -> publish / abort) and
``shardstream register URL/index.json`` (in place, no copy), on local disk and moto S3."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream.api_client import APIClient
from shardstream.cli import main
from shardstream.errors import ConflictError
from shardstream.mds import MDSIndex, MDSWriter, load_index
from shardstream.shard_builder.publish import DraftVersion
from shardstream.shard_builder.result import BuildResult
from shardstream.storage import open_store
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer


def _write_mds(out: Path, n: int = 200) -> MDSIndex:
    with MDSWriter(out, {"x": "int", "t": "str"}, compression="zstd", size_limit=1 << 10) as w:
        for i in range(n):
            w.write({"x": i, "t": f"sample {i} " * (i % 7)})
    return load_index(out / "index.json")


def test_draft_version_publishes_a_build(live: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "build"
    with APIClient(live.url, live.token) as api:
        with DraftVersion(api, "corpus", lineage={"source": "unit"}) as draft:
            index = _write_mds(out)
            result = BuildResult(
                kind="text",
                output=str(out),
                index=index,
                columns={"x": "int", "t": "str"},
                samples=index.num_samples,
                raw_bytes=sum(s.raw_data.bytes for s in index.shards),
                stored_bytes=sum(s.stored.bytes for s in index.shards),
                config={"output": out, "compression": "zstd"},
                lineage=[{"path": "in.txt", "sha256": "ab"}],
                metadata={"tokenizer": None},
            )
            draft.add_build(result)
            assert draft.version.status == "draft"
        version = draft.version
        assert version.status == "published"
        assert version.storage_root == out.as_uri()
        assert version.columns == {"x": "int", "t": "str"}
        assert version.builder_config["compression"] == "zstd"
        assert version.lineage["inputs"] == [{"path": "in.txt", "sha256": "ab"}]
        assert version.total_samples == 200
        assert load_index(api.index_json("corpus", version.number)) == index


def test_failed_build_leaves_an_aborted_draft(live: LiveServer, tmp_path: Path) -> None:
    with APIClient(live.url, live.token) as api:
        with (
            pytest.raises(RuntimeError, match="tokenizer exploded"),
            DraftVersion(api, "c") as draft,
        ):
            raise RuntimeError("tokenizer exploded")
        assert api.get_version("c", draft.number).status == "aborted"
        # shards registered but missing from storage: publish refuses, draft is aborted
        out = tmp_path / "gone"
        index = _write_mds(out, 50)
        (out / index.shards[-1].stored.basename).unlink()
        with (
            pytest.raises(ConflictError, match="missing"),
            DraftVersion(
                live.url, "c", token=live.token, columns={"x": "int"}, storage_root=str(out)
            ) as draft2,
        ):
            draft2.add_index(index)
        assert api.get_version("c", draft2.number).status == "aborted"
        with pytest.raises(Exception, match="no published version"):
            api.latest_version("c")


def test_register_local_in_place(
    live: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = _write_mds(tmp_path / "existing")
    before = sorted(p.name for p in (tmp_path / "existing").iterdir())
    code = main(
        [
            "register",
            str(tmp_path / "existing" / "index.json"),
            "--dataset",
            "old",
            "--server",
            live.url,
            "--token",
            live.token,
        ]
    )
    assert code == 0
    assert "published old version 1" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == before  # nothing copied
    with APIClient(live.url, live.token) as api:
        version = api.get_version("old", 1)
        assert version.storage_root == (tmp_path / "existing").as_uri()
        assert [s.key for s in api.iter_shards("old", 1)] == [
            s.stored.basename for s in index.shards
        ]
    assert (
        main(
            [
                "register",
                str(tmp_path / "nothing.txt"),
                "--dataset",
                "x",
                "--server",
                live.url,
                "--token",
                live.token,
            ]
        )
        == 1
    )


def test_register_s3_in_place(live: LiveServer, tmp_path: Path, s3_bucket: S3Bucket) -> None:
    index = _write_mds(tmp_path / "mds")
    store = open_store(f"{s3_bucket.url}/datasets/wiki")
    for path in sorted((tmp_path / "mds").iterdir()):
        store.upload(path, path.name)
    url = f"{s3_bucket.url}/datasets/wiki/index.json"
    assert (
        main(["register", url, "--dataset", "wiki", "--server", live.url, "--token", live.token])
        == 0
    )
    with APIClient(live.url, live.token) as api:
        version = api.latest_version("wiki")
        assert version.storage_root == f"{s3_bucket.url}/datasets/wiki"
        assert version.num_shards == len(index.shards)
        first = index.shards[0].stored.basename
        presigned = api.presign("wiki", version.number, [first])[first]
        import httpx

        assert httpx.get(presigned).content == (tmp_path / "mds" / first).read_bytes()
