"""The public surface of shardstream.storage: names, URL dispatch, options, keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardstream.storage as storage
from shardstream.errors import ConfigError
from shardstream.storage import (
    HTTPStore,
    LocalStore,
    S3Store,
    StorageOptions,
    check_key,
    open_store,
)


def test_exported_names_change_only_on_purpose() -> None:
    assert storage.__all__ == [
        "HTTPStore",
        "LocalStore",
        "ObjectStore",
        "Resolver",
        "S3Store",
        "StorageOptions",
        "StoreCapabilities",
        "check_key",
        "open_store",
        "spread_key",
        "storage_counters",
    ]
    for name in storage.__all__:
        assert getattr(storage, name) is not None


def test_open_store_picks_backend_from_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = open_store("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix) == ("bucket", "some/prefix")
    assert s3.url("k/v.bin") == "s3://bucket/some/prefix/k/v.bin"
    assert open_store("s3://bucket").url() == "s3://bucket"

    local = open_store(tmp_path.as_uri())
    assert isinstance(local, LocalStore) and local.root == tmp_path
    assert open_store(str(tmp_path)).url("a b/c") == (tmp_path / "a b" / "c").as_uri()
    assert open_store(tmp_path).url() == tmp_path.as_uri()
    monkeypatch.chdir(tmp_path)
    relative = open_store("rel/dir")
    assert isinstance(relative, LocalStore) and relative.root == tmp_path / "rel" / "dir"

    http = open_store("https://data.example.com/sets/v1")
    assert isinstance(http, HTTPStore)
    assert http.url("a/b c.bin") == "https://data.example.com/sets/v1/a/b%20c.bin"


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("s3:///prefix", "names no bucket"),
        ("gs://bucket/x", "unknown scheme 'gs'"),
        ("file://otherhost/x", "must be local"),
        ("", "non-empty"),
        ("s3://bucket/../x", "'..'"),
    ],
)
def test_open_store_rejects_bad_urls(url: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        open_store(url)


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../outside", "'..'"),
        ("a/../../b", "'..'"),
        ("a/./b", "'.'"),
        ("a\\..\\b", "backslash"),
        ("a//b", "empty path component"),
        ("a/", "empty path component"),
        ("a\x00b", "NUL"),
    ],
)
def test_check_key_rejects_keys_that_could_escape(key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_key(key)
    assert problem in str(info.value) and repr(key) in str(info.value)


@given(st.lists(st.text(st.characters(blacklist_characters="/\\\x00"), min_size=1), min_size=1))
def test_check_key_accepts_exactly_the_safe_keys(parts: list[str]) -> None:
    key = "/".join(parts)
    if any(p in (".", "..") for p in parts):
        with pytest.raises(ConfigError):
            check_key(key)
    else:
        assert check_key(key) == key


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_connections", 0),
        ("part_size", 1000),
        ("retries", 0),
        ("read_timeout_s", 0),
        ("backoff_base_s", -1.0),
        ("addressing_style", "sideways"),
    ],
)
def test_storage_options_reject_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"StorageOptions.{field}"):
        StorageOptions(**{field: value})  # type: ignore[arg-type]


def test_storage_options_need_both_keys_and_hide_the_secret() -> None:
    with pytest.raises(ConfigError, match="both access_key_id and secret_access_key"):
        StorageOptions(access_key_id="AKIA")
    opts = StorageOptions(access_key_id="AKIA", secret_access_key="s3cr3t")
    assert "s3cr3t" not in repr(opts)
    with pytest.raises(AttributeError):
        opts.part_size = 1  # type: ignore[misc]
