""":class:`MDSWriter`: samples in, MDS shards and ``index.json`` out.

Given the same samples, columns, compression, hashes and size limit, and
``block_size=None, piece_size=None``, the shards and the index are byte-identical to
``streaming.MDSWriter``'s (one difference: a sample bigger
than ``size_limit`` gets a shard of its own, where MosaicML first writes an empty shard).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Unpack

from shardstream.errors import ConfigError
from shardstream.mds._format import DEFAULT_FORMAT, ShardFormat, ShardFormatKeywords
from shardstream.mds._index import INDEX_BASENAME, MDSIndex
from shardstream.mds._sample import make_parts_encoder, parse_columns
from shardstream.mds._shard import config_bytes, format_template, write_samples


class MDSWriter:
    """Write samples as MDS v2 shards into ``out_dir``, then ``index.json`` last.

    Each shard reaches disk complete (temp file + rename) and ``index.json`` is written
    atomically by :meth:`finish`, so a crashed or failed write never looks complete.
    Used as a context manager it finishes on a clean exit and writes no index on error::

        with MDSWriter(Path("out"), {"tokens": "ndarray:uint16:2048", "id": "int"}) as w:
            for i, toks in enumerate(sequences):
                w.write({"tokens": toks, "id": i})

    The shards are written as ``fmt`` (:class:`~shardstream.mds.ShardFormat`: ``compression``,
    ``hashes``, ``size_limit``, ``block_size``, ``piece_size``, each documented there), with
    the settings given as keywords (``compression="zstd"``) in its place.
    ``exist_ok=False`` refuses a folder that already holds an ``index.json``.
    """

    def __init__(
        self,
        out_dir: Path,
        columns: Mapping[str, str],
        *,
        fmt: ShardFormat = DEFAULT_FORMAT,
        exist_ok: bool = False,
        **keywords: Unpack[ShardFormatKeywords],
    ) -> None:
        self.out_dir = Path(out_dir)
        self.format = fmt.with_keywords(keywords)
        """How each shard is written."""
        self.block_size = self.format.block_size
        self.piece_size = self.format.piece_size
        self.columns = dict(columns)
        parse_columns(columns)
        self._template = format_template(columns, self.format)
        self._encode = make_parts_encoder(columns)
        if (self.out_dir / INDEX_BASENAME).exists() and not exist_ok:
            raise ConfigError(
                f"{self.out_dir} already holds a dataset ({INDEX_BASENAME}); choose an empty "
                "folder or pass exist_ok=True to overwrite it"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # MosaicML's size accounting: the header costs 8 bytes plus the config, each
        # sample its bytes plus its 4-byte offset.
        self._empty_size = 8 + len(config_bytes(self._template))
        # Pending samples are kept as their separate parts: no per-sample copy.
        self._pending: list[bytes] = []
        self._pending_sizes: list[int] = []
        self._pending_size = self._empty_size
        self._index = MDSIndex()
        self._finished = False

    @property
    def index(self) -> MDSIndex:
        """The shards flushed so far."""
        return self._index

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encode one sample and add it, flushing a shard first if it would overflow.

        Raises :class:`InputError` naming the column for a missing column or a bad value.
        """
        if self._finished:
            raise ConfigError(f"MDSWriter for {self.out_dir} is already finished")
        parts, size = self._encode(sample)
        limit = self._template.size_limit
        if limit is not None and self._pending_sizes and self._pending_size + size + 4 > limit:
            self.flush_shard()
        self._pending.extend(parts)
        self._pending_sizes.append(size)
        self._pending_size += size + 4

    def flush_shard(self) -> None:
        """Write the pending samples as the next shard (no-op when none are pending)."""
        if not self._pending_sizes:
            return
        basename = f"shard.{len(self._index.shards):05}.mds"
        info = write_samples(
            self.out_dir,
            basename,
            self._template,
            self._pending_sizes,
            self._pending,
            block_size=self.block_size,
            piece_size=self.piece_size,
        )
        self._index.shards.append(info)
        self._pending = []
        self._pending_sizes = []
        self._pending_size = self._empty_size

    def finish(self) -> MDSIndex:
        """Flush the last shard, write ``out_dir/index.json`` atomically, return the index."""
        if not self._finished:
            self.flush_shard()
            self._index.write(self.out_dir / INDEX_BASENAME)
            self._finished = True
        return self._index

    def __enter__(self) -> MDSWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.finish()
        else:
            # Leave no index: the partial output must not look like a finished dataset.
            self._pending, self._pending_sizes = [], []
            self._finished = True
