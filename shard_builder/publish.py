"""Publishing shards through the metadata server.

:class:`DraftVersion` wraps one version's lifecycle: on entry it creates the dataset if
missing and opens a draft; the builder writes shards under ``draft.storage_root`` and
registers them (``add_index``); on a clean exit the draft is published (the server checks
every shard in storage first), on any exception it is aborted, so a failed build never
leaves a published half version::

    from shardstream.api_client import APIClient
    from shardstream.shard_builder.publish import DraftVersion

    with DraftVersion(APIClient(), "wiki", columns={"tokens": "ndarray:uint16:2048"}) as draft:
        index = build_shards(out=draft.storage_root)        # where the server put it
        draft.add_index(index)
    print(draft.version.number, draft.version.status)      # published

The server decides where a version's shards live (``<dataset location>/v<N>`` under a
storage root its operator configured); a client only learns it from ``draft.storage_root``.
``shardstream register URL/index.json --dataset NAME`` publishes an existing MDS dataset in
place (no copy): the shards stay where they are and the version's storage root points
there. That needs an admin token and a location inside one of the server's storage
roots. Only :mod:`argparse` is imported at module level (the CLI contract); the client
and codec are imported when used.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream.api_client import APIClient
    from shardstream.mds import MDSIndex, ShardInfo
    from shardstream.wire import ShardRecord, VersionPublic

log = logging.getLogger("shardstream.shard_builder.publish")


def shard_record(index: int, info: ShardInfo, *, prefix: str = "") -> ShardRecord:
    """The server's record of one MDS shard (the stored file: compressed if compressed).

    ``prefix`` is prepended to the basename when the shards sit in a sub-folder of the
    version's storage root.
    """
    from shardstream.wire import ShardRecord

    stored = info.stored
    key = f"{prefix.strip('/')}/{stored.basename}" if prefix.strip("/") else stored.basename
    return ShardRecord(
        index=index,
        key=key,
        samples=info.samples,
        raw_bytes=info.raw_data.bytes,
        stored_bytes=stored.bytes,
        compression=info.compression,
        hashes=stored.file_hashes,  # block digests stay in `mds` (too long for this field)
        mds=info.to_dict(),
    )


class DraftVersion:
    """A draft version that publishes on success and aborts on error (context manager).

    ``api`` is an :class:`~shardstream.api_client.APIClient`, or a server URL (None:
    ``SHARDSTREAM_SERVER``) for which one is opened with ``token`` (None:
    ``SHARDSTREAM_TOKEN``) and closed at exit. The draft is opened on entry, so a build
    that fails leaves an aborted draft behind; columns and storage root may be given
    later, by :meth:`add_build` or :meth:`update`, before the first shard is added.
    A ``storage_root`` other than the one the server assigns needs an admin token (it
    registers shards that already exist in place, inside the server's storage roots).
    ``resume_key`` names the logical build (``shardstream build`` derives it from the
    command): a re-run after a kill continues the draft the killed run left open.
    """

    def __init__(
        self,
        api: APIClient | str | None,
        dataset: str,
        *,
        columns: Mapping[str, str] | None = None,
        storage_root: str | None = None,
        builder_config: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        description: str = "",
        token: str | None = None,
        resume_key: str | None = None,
    ) -> None:
        if api is None or isinstance(api, str):
            from shardstream.api_client import APIClient

            self.api = APIClient(api, token)
            self._owns_api = True
        else:
            self.api = api
            self._owns_api = False
        self.dataset = dataset
        self._columns = dict(columns or {})
        self._storage_root = storage_root
        self._builder_config = dict(builder_config or {})
        self._lineage = dict(lineage or {})
        self._description = description
        self._resume_key = resume_key
        self._version: VersionPublic | None = None
        self._next_index = 0

    @property
    def version(self) -> VersionPublic:
        """The version as last seen (draft, then published or aborted)."""
        if self._version is None:
            from shardstream.errors import ConfigError

            raise ConfigError("DraftVersion is not open: use it in a 'with' block")
        return self._version

    @property
    def number(self) -> int:
        """The version number within the dataset."""
        return self.version.number

    @property
    def storage_root(self) -> str:
        """Where this version's shards must be written (URL; chosen by the server if unset)."""
        return self.version.storage_root

    def open(self) -> VersionPublic:
        """Create the dataset if missing and open the draft.

        With a ``resume_key``, a draft that an earlier run with the same key opened and
        left open (it was killed) is continued: same version, same storage root, so the
        build finds its journal there and reuses the finished shards.
        """
        self.api.ensure_dataset(self.dataset, description=self._description)
        version = self._create(self._resume_key) if self._resume_key is not None else None
        if version is None or version.status != "draft":  # published or aborted: a new one
            version = self._create(None)
        self._version = version
        # Where the shards go is logged once known (a build may write them elsewhere).
        log.info("opened draft %s v%d", self.dataset, self.number)
        return self._version

    def _create(self, key: str | None) -> VersionPublic:
        return self.api.create_version(
            self.dataset,
            self._columns,
            storage_root=storage_url(self._storage_root) if self._storage_root else None,
            builder_config=self._builder_config,
            lineage=self._lineage,
            idempotency_key=key,
        )

    def update(
        self,
        *,
        columns: Mapping[str, str] | None = None,
        storage_root: str | None = None,
        builder_config: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> VersionPublic:
        """Fill in the draft's columns, storage root (before any shard), config, lineage."""
        self._version = self.api.update_version(
            self.dataset,
            self.number,
            columns=columns,
            storage_root=storage_url(storage_root) if storage_root is not None else None,
            builder_config=builder_config,
            lineage=lineage,
        )
        return self._version

    def add_shards(self, records: Sequence[ShardRecord]) -> None:
        """Register shard records (indexes must continue from the shards added so far)."""
        if records:
            result = self.api.add_shards(self.dataset, self.number, records)
            self._next_index = result.num_shards

    def add_index(self, index: MDSIndex, *, prefix: str = "") -> None:
        """Register every shard of an MDS index after those already added."""
        start = self._next_index
        self.add_shards(
            [shard_record(start + i, info, prefix=prefix) for i, info in enumerate(index.shards)]
        )

    def add_build(self, result: Any) -> None:
        """Register a finished build (a ``BuildResult``): its columns, config and lineage
        are recorded, then its shards are added. A build written somewhere other than
        ``storage_root`` moves the draft there (admins only, see :class:`DraftVersion`)."""
        import json

        def plain(value: Any) -> Any:  # Paths, tuples, dataclasses -> JSON values
            return json.loads(json.dumps(value, default=str))

        output = storage_url(str(result.output))
        self.update(
            columns=dict(result.columns),
            storage_root=output if output != self.storage_root else None,
            builder_config=plain({"kind": result.kind, **dict(result.config)}),
            lineage=plain({"inputs": result.lineage, "metadata": result.metadata}),
        )
        self.add_index(result.index)
        log.info(
            "draft %s v%d: %d shards at %s",
            self.dataset,
            self.number,
            len(result.index.shards),
            self.storage_root,
        )

    def publish(self) -> VersionPublic:
        """Publish the draft now (the server checks every shard's size in storage)."""
        self._version = self.api.publish_version(self.dataset, self.number)
        log.info("published %s v%d (%d shards)", self.dataset, self.number, self.version.num_shards)
        return self._version

    def abort(self) -> None:
        """Abort the draft (never raises: it runs while another error propagates)."""
        if self._version is None or self._version.status != "draft":
            return
        try:
            self._version = self.api.abort_version(self.dataset, self.number)
        except Exception as exc:  # the original error matters more than this one
            log.warning("could not abort draft %s v%d: %s", self.dataset, self.number, exc)

    def close(self) -> None:
        """Close the HTTP client if this object opened it."""
        if self._owns_api:
            self.api.close()

    def __enter__(self) -> DraftVersion:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is not None:
                self.abort()
            elif self.version.status == "draft":
                try:
                    self.publish()
                except BaseException:
                    self.abort()
                    raise
        finally:
            self.close()


def storage_url(root: str) -> str:
    """A storage root as a URL: local paths become absolute ``file://`` URLs.

    >>> storage_url("s3://bucket/data/")
    's3://bucket/data'
    """
    if "://" in root:
        return root.rstrip("/")
    from pathlib import Path

    return Path(root).expanduser().resolve().as_uri()


def register_index(
    api: APIClient,
    index_url: str,
    dataset: str,
    *,
    description: str = "",
    digests: bool = True,
    block_size: int | None = None,
    piece_size: int | None = None,
) -> VersionPublic:
    """Publish the MDS dataset whose ``index.json`` is at ``index_url``, in place.

    With ``digests`` (the default), shards without the digests a fast cold start needs
    (MosaicML's writer records none) are read once each and the version records them
    (:mod:`~shardstream.shard_builder.fast_start`); the shard files and their
    ``index.json`` stay as they are. ``block_size`` and ``piece_size`` (bytes) default to
    the builder's 4 MiB and 64 KiB (pieces grow with the shard: at most 1,024 a shard)."""
    from shardstream.errors import ConfigError
    from shardstream.mds import load_index
    from shardstream.storage import open_store

    root, _, name = index_url.rstrip("/").rpartition("/")
    if not name.endswith(".json") or not root:
        raise ConfigError(
            f"{index_url!r} is not an index.json URL; give e.g. s3://bucket/data/index.json "
            "or /abs/path/index.json"
        )
    store = open_store(storage_url(root))
    index = load_index(store.read_bytes(name))
    if not index.shards:
        raise ConfigError(f"{index_url} lists no shards; nothing to register")
    if digests:
        from shardstream.shard_builder.fast_start import with_fast_start

        index = with_fast_start(store, index, block_size=block_size, piece_size=piece_size)
    with DraftVersion(
        api,
        dataset,
        columns=index.shards[0].columns,
        storage_root=store.url(""),
        builder_config={"registered_from": index_url},
        lineage={"index": index_url, "samples": index.num_samples},
        description=description,
    ) as draft:
        draft.add_index(index)
    return draft.version


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``shardstream register URL/index.json --dataset NAME``."""
    parser = subparsers.add_parser(
        "register",
        help="publish an existing MDS dataset in place (no copy)",
        description="Register the shards listed in an MDS index.json as a new published "
        "version of a dataset. The shards stay where they are; the server checks that each "
        "exists with its recorded size. Shards without block, header and piece digests "
        "(MosaicML's writer records none) are read once each, and the version records them, "
        "so that a cold reader's first batch fetches only its samples' pieces.",
    )
    parser.add_argument("index_url", metavar="URL/index.json", help="s3://, file:// or a path")
    parser.add_argument("--dataset", required=True, help="dataset name (created if missing)")
    parser.add_argument("--description", default="", help="description for a new dataset")
    parser.add_argument(
        "--no-digests",
        dest="digests",
        action="store_false",
        help="do not read the shards to record the block, header and piece digests a fast "
        "cold start needs (shards without them are then fetched whole before use)",
    )
    parser.add_argument("--server", help="server URL (default: SHARDSTREAM_SERVER)")
    parser.add_argument("--token", help="API token (default: SHARDSTREAM_TOKEN)")
    parser.set_defaults(handler=_register_command)


def _register_command(args: argparse.Namespace) -> int:
    from shardstream.api_client import APIClient

    with APIClient(args.server, args.token) as api:
        version = register_index(
            api, args.index_url, args.dataset, description=args.description, digests=args.digests
        )
    print(
        f"published {args.dataset} version {version.number}: {version.num_shards} shards, "
        f"{version.total_samples} samples at {version.storage_root}"
    )
    return 0
