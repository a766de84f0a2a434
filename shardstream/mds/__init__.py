"""The MDS v2 shard codec, byte-compatible with mosaicml-streaming 0.13 both ways.

Writing (how each shard is written is one :class:`ShardFormat`, whose settings the
writers also take as keywords)::

    from shardstream.mds import MDSWriter
    with MDSWriter(out_dir, {"tokens": "ndarray:uint16:2048"}, compression="zstd") as w:
        w.write({"tokens": arr})

or, for all-fixed-size columns without per-sample Python, :func:`write_shard_arrays` with
:func:`samples_per_shard`. Reading: :func:`load_index`, then :class:`ShardReader` over an
uncompressed local shard (:func:`decompress_shard` first if the index lists ``zip_data``).

Ranged reads: uncompressed shards carry per-block digests (``ShardInfo.block_digests``);
:func:`blocks_for_range` aligns a byte range to blocks and :func:`verify_range` checks the
fetched bytes, so a reader can verify part of a shard without the whole file;
:func:`blocks_of_spans` names the blocks that cover many sample spans at once. Digests for
shards written elsewhere (the builder's ``register``) come from :class:`BlockHasher`,
:class:`HeaderHasher` and the piece table's :func:`index_piece_size` and
:func:`index_table_entry`; :func:`decompress_stream` decompresses bytes already in memory.

Tokens: :func:`token_column` names the column that holds a sample's tokens and
:func:`tokens_per_sample` counts them where the shape is fixed (one rule for the client's
schedules in tokens and the server's mixture figures).

Errors: :class:`~shardstream.errors.FormatError` and its subclasses (corrupt shards, hash
mismatches, unsupported encodings), :class:`~shardstream.errors.InputError` for bad samples,
:class:`~shardstream.errors.ConfigError` for bad settings. The format is documented in
``docs/format.md``.
"""

from shardstream.mds._blocks import (
    BLOCK_DIGEST_ALGO,
    DEFAULT_BLOCK_SIZE,
    BlockDigests,
    BlockHasher,
    BlockRange,
    HeaderDigest,
    HeaderHasher,
    blocks_for_range,
    blocks_of_spans,
    check_block_size,
    digests_key,
    is_digests_key,
    verify_range,
)
from shardstream.mds._compression import (
    check_compression,
    compress,
    decompress_shard,
    decompress_stream,
)
from shardstream.mds._encodings import ENCODINGS, Codec, encoded_size, get_codec
from shardstream.mds._format import ShardFormat
from shardstream.mds._index import (
    INDEX_BASENAME,
    FileInfo,
    MDSIndex,
    ShardInfo,
    index_from_json,
    load_index,
    write_atomic,
)
from shardstream.mds._pieces import (
    DEFAULT_PIECE_SIZE,
    PIECE_ALGO,
    PieceSpec,
    PieceTable,
    check_piece_size,
    index_piece_size,
    index_table_entry,
)
from shardstream.mds._reader import ShardReader
from shardstream.mds._sample import encode_sample, make_encoder, make_parts_encoder
from shardstream.mds._shard import (
    samples_per_shard,
    shard_config,
    write_samples,
    write_shard,
    write_shard_arrays,
)
from shardstream.mds._tokens import TOKEN_COLUMNS, fixed_shape, token_column, tokens_per_sample
from shardstream.mds._writer import MDSWriter

__all__ = [
    "BLOCK_DIGEST_ALGO",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_PIECE_SIZE",
    "ENCODINGS",
    "INDEX_BASENAME",
    "PIECE_ALGO",
    "TOKEN_COLUMNS",
    "BlockDigests",
    "BlockHasher",
    "BlockRange",
    "Codec",
    "FileInfo",
    "HeaderDigest",
    "HeaderHasher",
    "MDSIndex",
    "MDSWriter",
    "PieceSpec",
    "PieceTable",
    "ShardFormat",
    "ShardInfo",
    "ShardReader",
    "blocks_for_range",
    "blocks_of_spans",
    "check_block_size",
    "check_compression",
    "check_piece_size",
    "compress",
    "decompress_shard",
    "decompress_stream",
    "digests_key",
    "encode_sample",
    "encoded_size",
    "fixed_shape",
    "get_codec",
    "index_from_json",
    "index_piece_size",
    "index_table_entry",
    "is_digests_key",
    "load_index",
    "make_encoder",
    "make_parts_encoder",
    "samples_per_shard",
    "shard_config",
    "token_column",
    "tokens_per_sample",
    "verify_range",
    "write_atomic",
    "write_samples",
    "write_shard",
    "write_shard_arrays",
]
