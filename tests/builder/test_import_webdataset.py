"""``shardstream import webdataset``: tar shards written by ``webdataset.ShardWriter``."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.storage import open_store
from tests.builder.conftest import dir_bytes, read_with_ours, read_with_streaming
from tests.fixtures.foreign_shards import webdataset_samples, write_webdataset
from tests.fixtures.s3 import S3Bucket

SMALL = {"shard_size": 16 * 1024, "allow_small_shards": True, "progress": False}


def _check(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["__key__"] == want["__key__"]
    image = got["jpg"]
    if isinstance(image, bytes):  # shardstream's reader: the stored bytes, unchanged
        assert image == want["jpg"]
    else:  # MosaicML decodes jpeg columns to PIL images
        decoded = Image.open(io.BytesIO(want["jpg"]))
        assert np.array_equal(np.asarray(image), np.asarray(decoded))
    assert got["cls"] == want["cls"]
    assert got["txt"] == want["txt"]
    assert got["json"] == want["json"]
    assert got["npy"].dtype == want["npy"].dtype
    assert np.array_equal(got["npy"], want["npy"])


def test_every_sample_comes_back_field_by_field(tmp_path: Path) -> None:
    samples = webdataset_samples(150)
    pattern = write_webdataset(tmp_path / "wds", samples)
    result = build_import(
        ImportConfig(
            format="webdataset", inputs=(pattern,), output=str(tmp_path / "out"), workers=2, **SMALL
        )
    )
    assert result.columns == {
        "__key__": "str",  # each sample's identity, as WebDataset's loader names it
        "cls": "int",
        "jpg": "jpeg",
        "json": "json",
        "npy": "ndarray",
        "txt": "str",
    }
    assert result.samples == 150 and len(result.shards) > 3
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == 150
    for got, want in zip(ours, samples, strict=True):
        _check(got, want)
    theirs = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    for got, want in zip(theirs, samples, strict=True):
        _check(got, want)


def test_same_source_gives_byte_identical_output(tmp_path: Path) -> None:
    pattern = write_webdataset(tmp_path / "wds", webdataset_samples(90))
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        build_import(
            ImportConfig(
                format="webdataset", inputs=(pattern,), output=str(out), workers=workers, **SMALL
            )
        )
        outs.append(dir_bytes(out))
    assert outs[0] == outs[1]


def test_truncated_tar_is_one_clear_error_and_nothing_published(tmp_path: Path) -> None:
    write_webdataset(tmp_path / "wds", webdataset_samples(60))
    victim = tmp_path / "wds" / "shard-000001.tar"
    victim.write_bytes(victim.read_bytes()[:5000])
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"shard-000001\.tar.*truncated"):
        build_import(
            ImportConfig(
                format="webdataset",
                inputs=(str(tmp_path / "wds"),),
                output=str(out),
                workers=1,
                **SMALL,
            )
        )
    assert not (out / "index.json").exists()


def test_sample_missing_a_column_names_shard_and_key_or_is_skipped(tmp_path: Path) -> None:
    samples = webdataset_samples(50)
    del samples[33]["txt"]
    pattern = write_webdataset(tmp_path / "wds", samples)
    with pytest.raises(InputError, match=r"shard-000000\.tar key sample00033.*expected"):
        build_import(
            ImportConfig(
                format="webdataset", inputs=(pattern,), output=str(tmp_path / "out"), **SMALL
            )
        )
    result = build_import(
        ImportConfig(
            format="webdataset",
            inputs=(pattern,),
            skip_bad=True,
            output=str(tmp_path / "out2"),
            **SMALL,
        )
    )
    assert result.samples == 49
    assert [b.source for b in result.skipped] == [
        f"{tmp_path}/wds/shard-000000.tar key sample00033"
    ]


def test_s3_and_http_sources_import_like_local_files(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    import functools
    import http.server
    import threading

    pattern = write_webdataset(tmp_path / "src", webdataset_samples(100))
    names = sorted(p.name for p in (tmp_path / "src").glob("*.tar"))
    store = open_store(f"{s3_bucket.url}/wds")
    for name in names:
        store.upload(tmp_path / "src" / name, name)
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "src")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    last = len(names) - 1
    try:
        sources = {
            "local": (pattern,),
            "s3-braces": (f"{s3_bucket.url}/wds/shard-{{000000..{last:06d}}}.tar",),
            "s3-prefix": (f"{s3_bucket.url}/wds",),
            "http": (f"http://127.0.0.1:{server.server_port}/shard-{{000000..{last:06d}}}.tar",),
        }
        outputs = {}
        for label, inputs in sources.items():
            out = tmp_path / label
            build_import(ImportConfig(format="webdataset", inputs=inputs, output=str(out), **SMALL))
            outputs[label] = [s["txt"] for s in read_with_ours(out)]
        assert outputs["local"] == outputs["s3-braces"] == outputs["s3-prefix"] == outputs["http"]
        assert len(outputs["local"]) == 100
        with pytest.raises(InputError, match="no such object"):
            build_import(
                ImportConfig(
                    format="webdataset",
                    inputs=(f"{s3_bucket.url}/wds/missing.tar",),
                    output=str(tmp_path / "x"),
                    **SMALL,
                )
            )
    finally:
        server.shutdown()


def test_keys_can_be_left_out_and_a_member_cannot_shadow_them(tmp_path: Path) -> None:
    pattern = write_webdataset(tmp_path / "wds", webdataset_samples(10))
    result = build_import(
        ImportConfig(
            format="webdataset",
            inputs=(pattern,),
            output=str(tmp_path / "out"),
            keep_key=False,
            **SMALL,
        )
    )
    assert "__key__" not in result.columns and result.samples == 10
    clash = tmp_path / "clash.tar"
    with tarfile.open(clash, "w") as tar:
        for name in ("a.txt", "a.__key__"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(InputError, match=r"key a: member .__key__ clashes with the key column"):
        build_import(
            ImportConfig(
                format="webdataset", inputs=(str(clash),), output=str(tmp_path / "o2"), **SMALL
            )
        )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"text": "a line of JSON"}\n' * 40, "it starts like JSON text"),
        (b'{"text": "short"}\n', "it starts like JSON text"),
        (b"\x1f\x8b\x08\x00" + bytes(600), "gzip-compressed: decompress it first"),
        (b"plain words\n", "12 bytes, less than one 512-byte tar header"),
    ],
)
def test_a_file_that_is_not_a_tar_is_named_so(tmp_path: Path, content: bytes, why: str) -> None:
    # A .jsonl given by mistake was reported as a "truncated tar".
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"data\.jsonl: not a tar file \({re.escape(why)}\)"):
        build_import(
            ImportConfig(
                format="webdataset", inputs=(str(path),), output=str(tmp_path / "o"), **SMALL
            )
        )
