"""Options of a build, grouped in frozen dataclasses and validated on construction.

``TextBuildConfig`` and ``ImageBuildConfig`` share :class:`OutputOptions` (where and how the
shards are written) and carry the options of their input kind. Every check raises
:class:`~shardstream.errors.ConfigError` naming the setting and the accepted values.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardstream.errors import ConfigError
from shardstream.hashing import SUPPORTED_HASHES
from shardstream.mds import DEFAULT_BLOCK_SIZE, DEFAULT_PIECE_SIZE, ShardFormat, check_piece_size

MB = 1 << 20
MASK_COLUMN = "loss_mask"
"""Column of a document build's per-token loss mask (``prompt_field`` builds)."""
DEFAULT_SHARD_SIZE = 128 * MB
MIN_BLOCK_SIZE = 64 << 10
MAX_BLOCK_SIZE = 64 * MB
DEFAULT_CHUNK_BYTES = 2 * MB  # input bytes per unit of parallel work (small: balances the cores)
MIN_SHARD_SIZE = 64 * MB
MAX_SHARD_SIZE = 256 * MB
# Below this a shard cannot hold its own header and a sample of any real size.
_ABSOLUTE_MIN_SHARD_SIZE = 1024

BadImagePolicy = Literal["fail", "skip"]
ImageVerify = Literal["quick", "full"]
ImageFormat = Literal["auto", "jpeg", "png", "bytes"]


def _as_tuple(value: object) -> tuple[str, ...]:
    """Callers may pass one string or a list where a tuple of strings is expected."""
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)  # type: ignore[attr-defined]


def _default_workers() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    """Where the shards go and how they are written.

    ``output`` is a local directory or an object-store URL (``s3://bucket/prefix``).
    ``shard_size`` is the target raw size of a shard in bytes (64-256 MB; smaller only with
    ``allow_small_shards``, which tests use). ``compression`` is ``None`` or ``"zstd"`` /
    ``"zstd:<level>"``. ``workers`` is the number of worker processes; it never changes the
    bytes written. ``spread_prefixes`` writes each shard under a short hashed folder
    (``1f0c/shard.00003.mds``) so a busy dataset's reads spread over many S3 key prefixes.
    """

    output: str
    shard_size: int = DEFAULT_SHARD_SIZE
    compression: str | None = None
    hashes: tuple[str, ...] = ("sha1", "xxh3_64")
    workers: int = field(default_factory=_default_workers)
    progress: bool = True
    overwrite: bool = False
    allow_small_shards: bool = False
    spread_prefixes: bool = False
    block_size: int = DEFAULT_BLOCK_SIZE
    """Bytes per block digest (ranged readers fetch and verify whole blocks): smaller blocks
    make a cold first batch cheaper and the index longer (16 hex digits per block)."""
    piece_size: int | None = DEFAULT_PIECE_SIZE
    """Bytes per piece digest, kept in each shard's header (``None``: none): a cold reader
    verifies its first samples piece by piece instead of fetching whole blocks."""

    def shard_format(self) -> ShardFormat:
        """How each shard is written (the codec's ``fmt``: ``write_shard``,
        ``write_shard_arrays``)."""
        return ShardFormat(
            compression=self.compression,
            hashes=self.hashes,
            size_limit=self.shard_size,
            block_size=self.block_size,
            piece_size=self.piece_size,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "hashes", _as_tuple(self.hashes))
        if not isinstance(self.block_size, int) or not (
            MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE
        ):
            raise ConfigError(
                f"block size {self.block_size!r} is outside the accepted range "
                f"{MIN_BLOCK_SIZE // 1024} KiB-{MAX_BLOCK_SIZE // MB} MiB; pass e.g. "
                "--block-size 1MiB"
            )
        try:
            check_piece_size(self.piece_size)
        except ConfigError:
            raise ConfigError(
                f"piece size {self.piece_size!r} is outside the accepted range 4 KiB-4 GiB; "
                "pass e.g. --piece-size 64KiB, or none"
            ) from None
        if not self.output:
            raise ConfigError("output: give a local directory or an s3://bucket/prefix URL")
        low = _ABSOLUTE_MIN_SHARD_SIZE if self.allow_small_shards else MIN_SHARD_SIZE
        if not low <= self.shard_size <= MAX_SHARD_SIZE:
            raise ConfigError(
                f"shard size {self.shard_size} bytes is outside the accepted range "
                f"{MIN_SHARD_SIZE // MB}-{MAX_SHARD_SIZE // MB} MB; pass e.g. --shard-size 128MB"
            )
        if self.compression is not None:
            algo, _, level = self.compression.partition(":")
            if algo != "zstd" or (level and not level.lstrip("-").isdigit()):
                raise ConfigError(
                    f"compression {self.compression!r} is not supported; "
                    "use none, 'zstd' or 'zstd:<level>'"
                )
        if not self.hashes:
            raise ConfigError("hashes: give at least one of sha1, xxh3_64")
        for algo in self.hashes:
            if algo not in SUPPORTED_HASHES:
                raise ConfigError(
                    f"hash {algo!r} is not supported; choose from {', '.join(SUPPORTED_HASHES)}"
                )
        if self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")


@dataclass(frozen=True, kw_only=True)
class TextBuildConfig(OutputOptions):
    """Options of ``shardstream build text``: tokenize documents into fixed-length sequences.

    ``inputs`` are JSONL or Parquet files, directories (searched recursively for ``*.jsonl``,
    ``*.json``, ``*.parquet``) or glob patterns, read in sorted order. ``tokenizer`` is a
    local ``tokenizer.json`` (HF ``tokenizers``) or ``None`` for the built-in byte-level
    tokenizer (ids 0-255, EOS 256). Documents are joined with the EOS id and cut into
    sequences of ``seq_len`` tokens; only the final remainder is dropped. ``chunk_bytes``
    is the input read per unit of parallel work (it shapes the work split, not the output).

    Example::

        cfg = TextBuildConfig(output="out/", inputs=("docs/*.jsonl",), seq_len=2048)
    """

    inputs: tuple[str, ...] = ()
    field: str = "text"
    tokenizer: Path | None = None
    eos_token: str | None = None
    seq_len: int = 2048
    column: str = "tokens"
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    documents: bool = False
    """Store each document as one variable-length token array (its EOS included) instead
    of cutting the stream into ``seq_len`` sequences: the reader packs them
    (``PackOptions``, docs/training.md "Packing and masks"). ``seq_len`` is unused."""
    prompt_field: str | None = None
    """With ``documents``: records are chat/SFT pairs, ``prompt_field`` then ``field`` (the
    response); a document is prompt + response + EOS, with a ``loss_mask`` column (uint8)
    that is 1 on the response and its EOS, 0 on the prompt."""
    skip_bad: bool = False
    """Leave out bad records (a line that is no JSON object, lacks ``field`` or holds no
    string there; a Parquet row whose field is null) instead of stopping at the first:
    they are counted, and the first few named (file:line, or file and row) in the result
    and ``shardstream.json``. Fixed-length local builds only so far."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "inputs", _as_tuple(self.inputs))
        if not self.inputs:
            raise ConfigError("inputs: give at least one JSONL/Parquet file, directory or glob")
        if self.seq_len < 1:
            raise ConfigError(f"seq-len must be at least 1, got {self.seq_len}")
        if isinstance(self.tokenizer, str):  # accept a plain string path from Python callers
            object.__setattr__(self, "tokenizer", Path(self.tokenizer))
        if self.chunk_bytes < 1:
            raise ConfigError(f"chunk_bytes must be positive, got {self.chunk_bytes}")
        if not self.field:
            raise ConfigError("field: name the JSON/Parquet field that holds the text")
        if self.prompt_field is not None and not self.documents:
            raise ConfigError(
                "prompt-field needs --documents: prompt/response pairs are stored as "
                "documents with a loss mask"
            )
        if self.prompt_field is not None and self.prompt_field in ("", self.field):
            raise ConfigError(
                f"prompt-field {self.prompt_field!r} must name another field than the "
                f"response field {self.field!r}"
            )
        if self.skip_bad and self.documents:
            raise ConfigError(
                "skip-bad works for fixed-length builds so far, not with --documents: fix "
                "or remove the bad lines (the error names the first), or leave out --documents"
            )
        if self.documents and self.column == MASK_COLUMN:
            raise ConfigError(f"column {MASK_COLUMN!r} is the loss mask's; name the tokens another")


@dataclass(frozen=True, kw_only=True)
class ImageBuildConfig(OutputOptions):
    """Options of ``shardstream build images``: encoded images with integer labels.

    ``inputs`` are either one ImageNet-style folder (``root/<class>/*.jpg|png``; classes
    sorted by name get labels 0..n-1) or Parquet files holding ``image_field`` (bytes, or a
    struct with a ``bytes`` field as HF datasets write it) and ``label_field`` (int or
    string; strings become label ids in sorted order). ``resize`` re-encodes each image so
    its shorter side is at most ``resize`` pixels. ``on_bad_image`` decides whether an
    undecodable image stops the build (``fail``) or is left out and reported (``skip``).
    ``verify_images`` is ``quick`` (structure check: SOI/EOI, PNG IEND; a full decode only
    for files that fail it) or ``full`` (decode every image).
    """

    inputs: tuple[str, ...] = ()
    image_field: str = "image"
    label_field: str = "label"
    image_format: ImageFormat = "auto"
    resize: int | None = None
    jpeg_quality: int = 90
    on_bad_image: BadImagePolicy = "fail"
    verify_images: ImageVerify = "quick"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "inputs", _as_tuple(self.inputs))
        if not self.inputs:
            raise ConfigError("inputs: give an image folder or Parquet files")
        if self.resize is not None and self.resize < 1:
            raise ConfigError(f"resize must be a positive pixel count, got {self.resize}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"jpeg-quality must be 1-100, got {self.jpeg_quality}")
        if self.on_bad_image not in ("fail", "skip"):
            raise ConfigError(f"on-bad-image must be 'fail' or 'skip', got {self.on_bad_image!r}")
        if self.verify_images not in ("quick", "full"):
            raise ConfigError(
                f"verify-images must be 'quick' or 'full', got {self.verify_images!r}"
            )
        if self.image_format not in ("auto", "jpeg", "png", "bytes"):
            raise ConfigError(
                f"image-format must be auto, jpeg, png or bytes, got {self.image_format!r}"
            )


# Options that never change the bytes written: left out of the fingerprint and of the
# dataset metadata, so a resumed build may use another worker count, and the same build
# written to two places is byte-identical in both.
_NON_CONTENT_OPTIONS = frozenset({"output", "workers", "progress", "overwrite", "chunk_bytes"})


def config_dict(config: OutputOptions) -> dict[str, Any]:
    """The config as plain JSON values (paths as strings, tuples as lists)."""
    out: dict[str, Any] = {}
    for key, value in asdict(config).items():
        if isinstance(value, Path):
            out[key] = str(value)
        elif isinstance(value, tuple):
            out[key] = list(value)
        else:
            out[key] = value
    return out


def content_options(config: OutputOptions) -> dict[str, Any]:
    """The options that decide the bytes of the output (used in the resume fingerprint)."""
    out = {k: v for k, v in config_dict(config).items() if k not in _NON_CONTENT_OPTIONS}
    if not out["spread_prefixes"]:
        # Absent when off: builds made before the option keep their fingerprint.
        del out["spread_prefixes"]
    if out["block_size"] == DEFAULT_BLOCK_SIZE:
        del out["block_size"]  # the same for builds made before the option
    if out.get("piece_size") == DEFAULT_PIECE_SIZE:
        out.pop("piece_size")  # the same for builds made before the option
    for name in ("documents", "prompt_field", "skip_bad"):
        if name in out and not out[name]:
            del out[name]  # the same for token builds made before document builds
    return out


def parse_size(text: str) -> int:
    """Parse ``128MB``, ``64MiB``, ``1GB`` or a plain byte count into bytes (binary units)."""
    units = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number = raw.rstrip("kmg")
    unit = raw[len(number) :]
    try:
        return int(float(number) * units[unit])
    except (ValueError, KeyError):
        raise ConfigError(f"cannot read size {text!r}; write e.g. 128MB or 134217728") from None
