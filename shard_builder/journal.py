"""The build journal: what a killed build had finished, so a re-run can reuse it.

The journal lives in the output beside the shards, under ``.shardstream-build/``:

* ``build.json`` - the fingerprint of the build (content options + input lineage), written
  before the first shard. A re-run with another fingerprint refuses to mix outputs.
* ``done/<basename>.json`` - one small object per finished shard: its index entry and where
  the input stream stood after it (``resume``). One object per shard keeps every update
  O(1) on S3, where objects cannot be appended to.

A local build finishes shards in order, so its journal is a prefix of the shard list. On a
Ray cluster each worker records the shard it writes itself (:func:`record_done`, before the
shard appears under its name), so shards finish and are recorded in any order. On resume each
entry is checked against the stored shard (size, and hash where the shard is local) and the
build continues after the longest prefix that checks out; entries past a gap that check out
too are kept (:meth:`BuildJournal.reusable`), and the build, run on Ray again or locally,
takes those shards as they are instead of writing them again. The index is written last
and the journal is deleted after it, so a partial build never looks complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardstream.errors import ConfigError, ObjectNotFoundError, ShardstreamError
from shardstream.mds import ShardInfo
from shardstream.shard_builder.sink import ShardSink
from shardstream.storage import ObjectStore, spread_key

log = logging.getLogger(__name__)

JOURNAL_DIR = ".shardstream-build"
_BUILD_KEY = f"{JOURNAL_DIR}/build.json"
_DONE_PREFIX = f"{JOURNAL_DIR}/done/"


@dataclass(frozen=True)
class DoneShard:
    """A finished shard and the input position right after its last sample."""

    info: ShardInfo
    resume: dict[str, Any]


def fingerprint(obj: dict[str, Any]) -> str:
    """A stable hex digest of the build's content options and lineage."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


class BuildJournal:
    """Reads and writes the journal of one build in ``sink``'s store."""

    def __init__(self, sink: ShardSink, build_fingerprint: str) -> None:
        self._sink = sink
        self._fp = build_fingerprint
        self._later: dict[int, DoneShard] = {}  # verified entries past the prefix
        self.reused_later = 0  # of them, the shards a producer took as they are

    def start(self) -> list[DoneShard]:
        """Open the journal: the verified finished shards of an earlier run (maybe none).

        Raises :class:`ConfigError` when the output holds another build's shards.
        """
        store = self._sink.store
        try:
            existing = json.loads(store.read_bytes(_BUILD_KEY))
        except ObjectNotFoundError:
            existing = None
        if existing is not None and existing.get("fingerprint") != self._fp:
            raise ConfigError(
                f"{store.url()} holds a partial build made with other inputs or options; "
                "re-run the original command to finish it, or pass --overwrite to start over"
            )
        if existing is None:
            self._sink.check_empty()
            store.write_bytes(_BUILD_KEY, json.dumps({"fingerprint": self._fp}).encode())
            return []
        return self._verified_prefix()

    def _verified_prefix(self) -> list[DoneShard]:
        store = self._sink.store
        entries: dict[str, DoneShard] = {}
        for key in self._keys(_DONE_PREFIX):
            try:
                obj = json.loads(store.read_bytes(key))
                entries[key] = DoneShard(ShardInfo.from_dict(obj["info"]), obj["resume"])
            except (ShardstreamError, ValueError, KeyError) as exc:
                log.warning("ignoring unreadable journal entry %s: %s", key, exc)
        done: list[DoneShard] = []
        for position in range(len(entries)):
            entry = entries.get(f"{_DONE_PREFIX}{shard_basename(position)}.json")
            if entry is None or not self._sink.verify(entry.info):
                break
            done.append(entry)
        # Past the first gap (shards a killed cluster build finished out of order): kept
        # where the shard checks out, offered to the producer by position.
        self._later = {}
        for key, entry in entries.items():
            at = _position(key)
            if at is not None and at > len(done) and self._sink.verify(entry.info):
                self._later[at] = entry
        self.reused_later = 0
        if done or self._later:
            log.info(
                "resuming: reusing %d finished shards in %s (and %d more further on)",
                len(done),
                store.url(),
                len(self._later),
            )
        return done

    def reusable(self, position: int, resume: dict[str, Any]) -> ShardInfo | None:
        """Shard ``position`` as a killed run stored it, if its journal entry checked out and
        says the stream stood at ``resume`` after it (the same shard): the producer takes
        it instead of writing it again."""
        entry = self._later.pop(position, None)
        if entry is None or entry.resume != resume:
            return None
        self.reused_later += 1
        return entry.info

    def take_or_store(
        self, position: int, resume: dict[str, Any], write: Callable[[], ShardInfo]
    ) -> ShardInfo:
        """Shard ``position`` for a producer that writes shards here (the local builder):
        as a killed run stored it where :meth:`reusable` vouches for it (a Ray build left
        it past the first gap), else ``write()`` into the sink's staging, then stored and
        recorded. The Ray builder asks :meth:`reusable` itself: its workers write."""
        if (info := self.reusable(position, resume)) is not None:
            return info
        info = write()
        self._sink.stored(info, lambda: self.record(position, info, resume))
        return info

    def _keys(self, prefix: str) -> list[str]:
        # Listed by the folder name without its trailing "/" (then filtered): S3Store.list
        # doubles a trailing slash at the time of writing.
        listed = self._sink.store.list(prefix.rstrip("/"))
        return [key for key, _ in listed if key.startswith(prefix)]

    def record(self, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
        """Mark shard ``position`` finished (after its bytes are stored)."""
        record_done(self._sink.store, position, info, resume)

    def clear(self) -> None:
        """Delete the journal (after the index is written)."""
        store = self._sink.store
        keys = self._keys(f"{JOURNAL_DIR}/")
        for key in sorted(keys, key=lambda k: k == _BUILD_KEY):  # build.json last
            store.delete(key)
        self._sink.remove_local_dir(JOURNAL_DIR)  # and temp files a killed run left there


def record_done(store: ObjectStore, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
    """Write the journal entry of shard ``position`` into the output ``store`` (one small
    object, written whole): its index entry and where the input stood after it."""
    obj = {"info": info.to_dict(), "resume": resume}
    key = f"{_DONE_PREFIX}{shard_basename(position)}.json"
    store.write_bytes(key, json.dumps(obj, sort_keys=True).encode())


def _position(key: str) -> int | None:
    """The shard position of a journal entry's key (``.../shard.00012.mds.json``: 12)."""
    name = key.removeprefix(_DONE_PREFIX)
    number = name.removeprefix("shard.").removesuffix(".mds.json")
    return int(number) if number.isdigit() and name == f"shard.{number}.mds.json" else None


def shard_basename(position: int) -> str:
    """``shard.00000.mds``: MosaicML's shard naming."""
    return f"shard.{position:05d}.mds"


def shard_key(position: int, spread_prefixes: bool) -> str:
    """Where shard ``position`` is written: its basename, or under a hashed folder.

    The folder is a digest of the basename alone (``spread_key``), so every dataset puts
    shard ``n`` under the same folder and the index says where each shard is.
    """
    name = shard_basename(position)
    return spread_key(name) if spread_prefixes else name
