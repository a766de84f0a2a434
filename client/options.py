"""Grouped, validated options of :class:`~shardstream.client.StreamingDataset`.

Each group is a small frozen dataclass, so a configuration reads as a few named values
and can be shared between runs: ``PlanOptions`` (sample order), ``CacheOptions`` (the
node's disk cache), ``ReadOptions`` (how a process reads shard bytes from storage),
``DecodeOptions`` (what a batch holds), ``ServerOptions`` (the metadata server for named
datasets and checkpoints), and ``Source`` (one dataset of a mixture).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardstream.errors import ConfigError
from shardstream.plan import MixtureSchedule

__all__ = [
    "CacheOptions",
    "DecodeOptions",
    "PackOptions",
    "PlanOptions",
    "ReadOptions",
    "ServerOptions",
    "Source",
    "read_options",
]

MAX_PACKED_POSITIONS = 2**31 - 1
"""The most positions a packed batch holds (rows x seq_len): ``position_ids`` and
``cu_seqlens`` are int32."""
MAX_TOKEN_ID = 2**63 - 1
"""The largest ``pad_id``/``eos_id`` (int64); a token column's dtype may bound it lower."""

TailPolicy = Literal["drop", "pad"]
UnverifiedBlocks = Literal["whole_shard", "verify_on_completion", "refuse"]


@dataclass(frozen=True)
class Source:
    """One dataset of a (possibly one-element) mixture, and how much of it an epoch takes.

    ``uri`` is a dataset on the server (``"name"`` or ``"name@version"``) or the URL of an
    MDS ``index.json`` (``s3://bucket/prefix/index.json``, ``https://...``, a local path;
    a folder means its ``index.json``). Set at most one of:

    * nothing: every sample once per epoch;
    * ``weight``: a proportion; weighted sources share what the other sources leave of
      ``PlanOptions.epoch_size`` (default: their own total) in proportion to their
      weights, repeating or subsampling;
    * ``repeat``: ``round(repeat x samples)`` per epoch (0.5 = half, 2 = twice);
    * ``samples``: exactly this many samples per epoch.

    >>> Source("s3://bucket/tokens/index.json", weight=0.7)
    Source(uri='s3://bucket/tokens/index.json', weight=0.7, repeat=None, samples=None)
    """

    uri: str
    weight: float | None = None
    repeat: float | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        if not self.uri:
            raise ConfigError("Source.uri is empty: give a dataset name or an index.json URL")
        modes = [m for m in ("weight", "repeat", "samples") if getattr(self, m) is not None]
        if len(modes) > 1:
            raise ConfigError(f"Source({self.uri!r}): set only one of {', '.join(modes)}")
        for mode in ("weight", "repeat"):
            value = getattr(self, mode)
            if value is not None and not value > 0:
                raise ConfigError(f"Source({self.uri!r}).{mode} must be > 0, got {value}")
        if self.samples is not None and self.samples < 1:
            raise ConfigError(f"Source({self.uri!r}).samples must be >= 1, got {self.samples}")

    @property
    def is_url(self) -> bool:
        """True for an ``index.json`` URL or path, False for a server dataset name."""
        return "://" in self.uri or "/" in self.uri or self.uri.endswith(".json")


@dataclass(frozen=True)
class PlanOptions:
    """The epoch plan: order, tail policy and canonical partitions.

    ``num_partitions`` (``P``) and ``window`` must stay the same for a whole run; they are
    saved in the state, and a resumed reader that leaves them ``None`` adopts the saved
    values, so a run resumes on any world size that divides its global batch. The default
    for a fresh run is a multiple of the world size with a few partitions a rank, and a
    window that keeps each rank's mixing as wide as 8 shards a partition gave before (see
    ``docs/plan.md``, *Elastic resume*). ``window`` is the plan's mixing window in samples
    per partition (``None``: that default). ``epoch_size`` is the
    number of samples per epoch over all sources; the weighted ones share what the
    ``repeat``/``samples`` sources leave (``None``: the weighted sources' own total).
    ``schedule`` makes the sources' weights a function of the global step or of the
    tokens consumed (:class:`~shardstream.plan.MixtureSchedule`, one weight per
    source and phase; the sources then set no weight, repeat or samples of their own;
    phases in tokens need a fixed number of tokens a step: packing with fixed ``rows``, or
    fixed-length token rows); see docs/training.md "Mixture schedules" and docs/plan.md
    "Phases in tokens".
    """

    shuffle: bool = True
    seed: int = 0
    tail: TailPolicy = "drop"
    num_partitions: int | None = None
    window: int | None = None
    epoch_size: int | None = None
    schedule: MixtureSchedule | None = None

    def __post_init__(self) -> None:
        if self.tail not in ("drop", "pad"):
            raise ConfigError(f"PlanOptions.tail must be 'drop' or 'pad', got {self.tail!r}")
        if self.num_partitions is not None and self.num_partitions < 1:
            raise ConfigError(f"PlanOptions.num_partitions must be >= 1, got {self.num_partitions}")
        for name in ("window", "epoch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"PlanOptions.{name} must be >= 1, got {value}")
        if self.schedule is not None and not isinstance(self.schedule, MixtureSchedule):
            kind = type(self.schedule).__name__
            raise ConfigError(f"PlanOptions.schedule must be a MixtureSchedule, got {kind}")


@dataclass(frozen=True)
class PackOptions:
    """Pack variable-length documents into rows of ``seq_len`` tokens at read time.

    The dataset's ``column`` (default ``"tokens"``) holds one token array per document
    (``shardstream build text --documents``); each batch of ``batch_size`` documents per
    rank becomes rows of ``input_ids``, ``position_ids`` (restarting at 0 in every
    segment: a document, or each ``seq_len`` piece of a longer one), ``doc_ids`` (a
    document's index in its group, -1 on padding), ``cu_seqlens`` (int32 boundaries of
    every segment and padding run of the flattened rows, for varlen attention),
    ``truncated_tokens`` (per group, tokens of its documents that no row holds) and
    ``loss_mask`` when the dataset has ``mask_column`` (padding 0): a column of 0/1 values
    (uint8, int8 or bool), one per token of its document, else the batch is refused.

    Packing works on *groups* of ``group`` consecutive documents of the epoch's global
    order (default: the per-rank batch size): each group is packed alone into ``rows``
    rows (``None``: as many as it needs, so the batch's row count varies), with ``method``
    ``"greedy"`` (next-fit) or ``"first_fit"``. The rows are therefore a function of the
    global order only: a resume on any world size whose per-rank batch is a multiple of
    ``group`` and any worker count continues with exactly the same rows. With fixed
    ``rows``, tokens that do not fit are truncated: counted in the batch, the loader's
    ``stats()`` and the run's input figures, and warned about once past 1 %.
    ``eos_id``, when given, is appended to every document that does not already end with
    it (document builds store each document with its EOS). A document longer than
    ``seq_len`` is cut into pieces.
    See docs/training.md "Packing and masks" and docs/plan.md "Packing".
    """

    seq_len: int
    pad_id: int = 0
    eos_id: int | None = None
    method: str = "first_fit"
    rows: int | None = None
    group: int | None = None
    column: str = "tokens"
    mask_column: str | None = "loss_mask"

    def __post_init__(self) -> None:
        if not 1 <= self.seq_len <= MAX_PACKED_POSITIONS:
            raise ConfigError(
                f"PackOptions.seq_len must be 1..{MAX_PACKED_POSITIONS} (2**31 - 1: "
                f"position_ids and cu_seqlens are int32), got {self.seq_len}"
            )
        if self.method not in ("greedy", "first_fit"):
            raise ConfigError(
                f"PackOptions.method must be 'greedy' or 'first_fit', got {self.method!r}"
            )
        for name in ("rows", "group"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"PackOptions.{name} must be >= 1 or None, got {value}")
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_TOKEN_ID:
                raise ConfigError(
                    f"PackOptions.{name} must be a token id, 0..{MAX_TOKEN_ID} (2**63 - 1), "
                    f"got {value}"
                )
        if self.mask_column is not None and self.mask_column == self.column:
            raise ConfigError(
                f"PackOptions.mask_column {self.mask_column!r} is the token column: a loss "
                "mask is its own column of 0/1 values (uint8 or bool), one per token"
            )


def default_cache_dir() -> Path:
    """``$SHARDSTREAM_CACHE_DIR``, else ``<tmp>/shardstream-cache-<uid>`` (one per node)."""
    env = os.environ.get("SHARDSTREAM_CACHE_DIR")
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"shardstream-cache-{os.getuid()}"


@dataclass(frozen=True)
class ReadOptions:
    """How a process reads shard bytes from storage (``docs/storage.md``, "Reading from
    object storage at scale"); the node's disk cache itself is :class:`CacheOptions`.

    Its fields, by concern:

    * *Downloads* (how many at once, how far ahead): ``download_threads``,
      ``prefetch_shards``.
    * *Ranged reads* (what one read fetches): with ``ranged_reads`` the samples of the next
      ``read_ahead_batches`` batches are fetched first as block-aligned ranged reads of at
      most ``range_bytes``, verified against the index's per-block digests, and a batch
      waits only for its own blocks; the rest of each shard is filled into the cache in
      the background. ``piece_read_batches`` reads a cold process's first batches by
      64 KiB piece. ``unverified_blocks`` says how shards whose index records no block
      digests are read: ``"whole_shard"`` fetches them whole (verified against the file
      hash before use), ``"verify_on_completion"`` reads them by range too and checks the
      file hash only once the shard is complete (cache mode; batches may use bytes before
      that check), ``"refuse"`` raises :class:`ConfigError`. zstd shards are always
      fetched whole.
    * *Where the bytes go without a cache*: ``memory_only`` is the cacheless mode (no disk
      at all: :class:`CacheOptions` is then unused), blocks read by range into at most
      ``memory_budget_bytes`` per process.

    >>> ReadOptions(piece_read_batches=0).ranged_reads
    True
    """

    download_threads: int = 2
    """Downloads: parallel shard downloads (and at least this many ranged-read threads)
    per worker process."""
    prefetch_shards: int = 2
    """Downloads: shards after the one being read that are fetched ahead."""
    ranged_reads: bool = True
    """Ranged reads: read uncompressed remote shards by block range (``False``: whole)."""
    range_bytes: int = 8 << 20
    """Ranged reads: the largest coalesced ranged GET."""
    read_ahead_batches: int = 16
    """Ranged reads: batches whose blocks are requested ahead of the one being built."""
    piece_read_batches: int = 1
    """Ranged reads: the first batches a process builds read their samples by piece
    (64 KiB, checked against the digests in the shard header) instead of by block, so a
    cold first batch does not wait for 4 MiB blocks; 0 turns it off. More than 1 rarely
    helps: a later batch's pieces queue behind the blocks then in flight."""
    unverified_blocks: UnverifiedBlocks = "whole_shard"
    """Ranged reads: shards without block digests (see above)."""
    memory_only: bool = False
    """Cacheless: hold shards in memory only, never touching the node cache."""
    memory_budget_bytes: int = 2 << 30
    """Cacheless: bytes of blocks held per process; must cover the window's need
    (checked before the first read)."""

    def __post_init__(self) -> None:
        for name in ("download_threads", "range_bytes", "memory_budget_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ReadOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.read_ahead_batches < 1:
            raise ConfigError(
                f"ReadOptions.read_ahead_batches must be >= 1, got {self.read_ahead_batches}"
            )
        for name in ("piece_read_batches", "prefetch_shards"):
            if getattr(self, name) < 0:
                raise ConfigError(f"ReadOptions.{name} must be >= 0, got {getattr(self, name)}")
        if self.unverified_blocks not in ("whole_shard", "verify_on_completion", "refuse"):
            raise ConfigError(
                "ReadOptions.unverified_blocks must be 'whole_shard', 'verify_on_completion' "
                f"or 'refuse', got {self.unverified_blocks!r}"
            )


READ_KNOBS = tuple(f.name for f in dataclasses.fields(ReadOptions))
"""The fields of :class:`ReadOptions`, which :class:`CacheOptions` still accepts (deprecated)."""


@dataclass(frozen=True)
class CacheOptions:
    """The node-local shard cache: where it is, how large, what it keeps open.

    ``dir`` is shared by every rank and worker of a node (default
    :func:`default_cache_dir`); ``limit_bytes`` bounds it (LRU, never evicting a shard in
    use; it must hold at least the shards open at once); ``open_shards`` is how many
    shards a worker keeps leased and memory-mapped; ``require_hashes`` (below) decides
    which datasets may enter it.

    How shards are read into it (downloads, ranged and piece reads, the cacheless mode) is
    :class:`ReadOptions`, given to ``StreamingDataset(read=...)``. Its fields are still
    accepted here for a release, with a :class:`DeprecationWarning`, and take effect as if
    given in ``ReadOptions`` (setting them in both places is a :class:`ConfigError`); read
    back here, a field not given is ``None``.
    """

    dir: Path | None = None
    limit_bytes: int | None = None
    open_shards: int = 8
    require_hashes: bool = False
    """Refuse (:class:`ConfigError`) a dataset with shards whose index records no hash
    the client can compute; by default they are read with a warning once per dataset.
    Every shard that has one is verified whenever it enters the cache or may have changed."""
    # Deprecated: ReadOptions' fields, accepted here for a release (see read_options).
    download_threads: int | None = field(default=None, repr=False)
    prefetch_shards: int | None = field(default=None, repr=False)
    ranged_reads: bool | None = field(default=None, repr=False)
    range_bytes: int | None = field(default=None, repr=False)
    read_ahead_batches: int | None = field(default=None, repr=False)
    piece_read_batches: int | None = field(default=None, repr=False)
    memory_only: bool | None = field(default=None, repr=False)
    memory_budget_bytes: int | None = field(default=None, repr=False)
    unverified_blocks: UnverifiedBlocks | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.limit_bytes is not None and self.limit_bytes < 1:
            raise ConfigError(f"CacheOptions.limit_bytes must be >= 1, got {self.limit_bytes}")
        if self.open_shards < 1:
            raise ConfigError(f"CacheOptions.open_shards must be >= 1, got {self.open_shards}")
        knobs = self.read_knobs()
        if knobs:
            ReadOptions(**knobs)  # the values are checked now, as before
            given = ", ".join(f"{k}=..." for k in knobs)
            warnings.warn(
                f"CacheOptions({given}) is deprecated and will be removed in the next "
                f"release: pass StreamingDataset(..., read=ReadOptions({given})) instead",
                DeprecationWarning,
                stacklevel=3,
            )

    def read_knobs(self) -> dict[str, Any]:
        """The deprecated :class:`ReadOptions` fields given here, by name."""
        return {k: getattr(self, k) for k in READ_KNOBS if getattr(self, k) is not None}

    @property
    def root(self) -> Path:
        """The cache folder in force."""
        return self.dir if self.dir is not None else default_cache_dir()


def read_options(cache: CacheOptions, read: ReadOptions | None) -> ReadOptions:
    """The :class:`ReadOptions` in force: ``read``, else the deprecated read fields given
    to ``cache``, else the defaults; :class:`ConfigError` if both carry read settings."""
    knobs = cache.read_knobs()
    if knobs and read is not None:
        given = ", ".join(knobs)
        raise ConfigError(
            f"read settings given twice: CacheOptions({given}) (deprecated) and "
            f"read=ReadOptions(...); move {given} into ReadOptions and drop them from "
            "CacheOptions"
        )
    if knobs:
        return ReadOptions(**knobs)
    return read if read is not None else ReadOptions()


@dataclass(frozen=True)
class DecodeOptions:
    """What a batch holds.

    ``columns`` limits the batch to these columns (default all). ``decode_images`` turns
    ``jpeg``/``png`` columns into ``uint8`` tensors (else raw bytes). ``sample_ids`` adds
    ``"sample_id"``: the int64 global id of every sample (its position in the concatenated
    sources), handy to check order and exactly-once.

    Images: ``image_decoder`` is ``"auto"`` (the fastest installed: ``torchvision``, then
    ``simplejpeg``, then Pillow, which also decodes every non-JPEG), or one of them by
    name; ``image_layout`` ``"HWC"`` (default) or ``"CHW"`` (torchvision's); ``image_mode``
    ``None`` (as stored), ``"RGB"`` or ``"L"``; ``decode_min_size`` decodes JPEGs at the
    smallest DCT scale whose shorter side is still at least that many pixels (images
    stored much larger than the training resolution). A ``sample_transform`` always
    receives ``(C, H, W)`` tensors. See docs/vision.md.
    """

    columns: tuple[str, ...] | None = None
    decode_images: bool = True
    sample_ids: bool = False
    image_decoder: str = "auto"
    image_layout: str = "HWC"
    image_mode: str | None = None
    decode_min_size: int | None = None

    def __post_init__(self) -> None:
        check_image_options(
            self.image_decoder, self.image_layout, self.image_mode, self.decode_min_size
        )


IMAGE_DECODERS = ("auto", "torchcodec", "torchvision", "simplejpeg", "pillow")
"""Names accepted by ``DecodeOptions(image_decoder=...)``."""


def check_image_options(name: str, layout: str, mode: str | None, min_size: int | None) -> None:
    """:class:`ConfigError` naming the first image option that is wrong.

    Whether the named decoder is installed here is checked where it is built
    (:class:`~shardstream.client.batches.image_decode.ImageDecoder`), before the first batch.
    """
    if name not in IMAGE_DECODERS:
        raise ConfigError(f"image_decoder must be one of {IMAGE_DECODERS}, got {name!r}")
    if layout not in ("HWC", "CHW"):
        raise ConfigError(f"image_layout must be 'HWC' or 'CHW', got {layout!r}")
    if mode not in (None, "RGB", "L"):
        raise ConfigError(f"image_mode must be None, 'RGB' or 'L', got {mode!r}")
    if min_size is not None and min_size < 1:
        raise ConfigError(f"decode_min_size must be >= 1, got {min_size}")
    if name in ("torchcodec", "torchvision") and min_size is not None:
        raise ConfigError(
            f"{name} cannot decode at a reduced scale: use image_decoder="
            "'simplejpeg' or 'pillow' (or 'auto') with decode_min_size"
        )


@dataclass(frozen=True)
class ServerOptions:
    """The metadata server: ``url`` (default ``$SHARDSTREAM_SERVER``), ``token`` (default
    ``$SHARDSTREAM_TOKEN``), and an optional ``run`` id for checkpoint commits."""

    url: str | None = None
    token: str | None = None
    run: int | str | None = None

    def resolved_url(self) -> str:
        """The server URL in force; :class:`ConfigError` if none is configured."""
        url = self.url or os.environ.get("SHARDSTREAM_SERVER")
        if not url:
            raise ConfigError(
                "no shardstream server configured: set ServerOptions(url=...) or "
                "SHARDSTREAM_SERVER, or give the dataset as an index.json URL"
            )
        return url

    def resolved_token(self) -> str | None:
        """The token in force (``$SHARDSTREAM_TOKEN`` by default)."""
        return self.token or os.environ.get("SHARDSTREAM_TOKEN")
