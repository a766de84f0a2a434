"""Storage location parsing: one canonical form, no way out of a root however encoded."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest

from shardstream.server.storage.locations import (
    LocationError,
    check_shard_key,
    parse_location,
    parse_roots,
)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("s3://bucket/a/b/", "s3://bucket/a/b"),
        ("s3://bucket", "s3://bucket"),
        ("/data/x", "file:///data/x"),
        ("file://localhost/data/a%20b", "file:///data/a%20b"),
        ("file:///data/%41", "file:///data/A"),  # decoded once, then canonical
    ],
)
def test_canonical_form(text: str, url: str) -> None:
    assert parse_location(text).url == url


@pytest.mark.parametrize(
    "text",
    [
        "http://host/x",
        "https://host/x",
        "ftp://host/x",
        "relative/dir",
        "s3://bucket/a/../b",
        "s3://bucket/a/%2e%2e/b",
        "s3://bucket/a/%2E%2E",
        "s3://bucket/a/%252e%252e",  # double encoding is refused, not guessed
        "file:///a/./b",
        "file:///a//b",
        "file://otherhost/a",
        "s3://bucket/a\\b",
        "s3://bucket/a\x00",
        "s3://bucket/a?x=1",
        "s3://bucket/a#f",
        "s3://Bucket/a",
        "s3://user@bucket/a",
        "s3://bucket:99/a",
        "s3://[::1/a",
        "s3://bucket/%ff",
        "s3://bucket/\ud800",
        "",
    ],
)
def test_refused(text: str) -> None:
    with pytest.raises(LocationError):
        parse_location(text)


def test_containment_is_on_segment_boundaries() -> None:
    root = parse_location("s3://bucket/teams")
    assert root.contains(parse_location("s3://bucket/teams/a/v1"))
    assert root.contains(root)
    assert not root.contains(parse_location("s3://bucket/teams2/a"))
    assert not root.contains(parse_location("s3://bucket"))
    assert not root.contains(parse_location("s3://other/teams/a"))
    assert not root.contains(parse_location("file:///teams/a"))
    with pytest.raises(LocationError):
        parse_roots("s3://b1/x,file:///")  # the file system's root is never a storage root


@pytest.mark.parametrize(
    "key",
    ["../x", "a/../../x", "%2e%2e/x", "a/%2E%2E/x", "/etc/passwd", "s3://b/k", "http:x",
     "a\\b", "a\x00", "a//b", "./a", "a?b", "a#b", "\ud800"],
)  # fmt: skip
def test_shard_keys_that_could_leave_are_refused(key: str) -> None:
    assert check_shard_key(key) is not None


@hypothesis.given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6))
def test_a_parsed_child_never_escapes_its_root(segments: list[str]) -> None:
    """Whatever text follows a root, if it parses at all it is inside that root."""
    root = parse_location("s3://bucket/teams")
    try:
        child = parse_location("s3://bucket/teams/" + "/".join(segments))
    except LocationError:
        return
    assert root.contains(child)
    assert ".." not in child.parts and "." not in child.parts
