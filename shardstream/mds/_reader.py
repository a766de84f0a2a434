""":class:`ShardReader`: O(1), memory-mapped access to the samples of one raw MDS shard.

Opening a shard checks its header once (sample count, monotonic offsets that end at the
file size, the embedded config) so that a truncated or garbled file fails here with
:class:`CorruptShardError` instead of returning wrong samples later.

When every column has a fixed size, samples sit at a constant stride and each column is
exposed as one strided numpy view of the mapping: ``reader[i]["tokens"]`` is a view (no
copy) and :meth:`ShardReader.gather` is one numpy fancy-index. When some columns are
variable-size, fixed-size columns are located through the offsets array, still with whole
arrays rather than a Python loop per sample.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.errors import ConfigError, CorruptShardError, FormatError
from shardstream.hashing import verify_file
from shardstream.mds._encodings import Codec, get_codec
from shardstream.mds._index import ShardInfo


def _corrupt(path: Path, problem: str) -> CorruptShardError:
    return CorruptShardError(f"{path}: {problem}; the shard is truncated or corrupt")


def _config_json(raw: memoryview) -> Any:
    """The config JSON object at the start of ``raw`` (a piece table may follow it)."""
    text = bytes(raw).decode("utf-8", errors="surrogateescape")
    obj, _ = json.JSONDecoder().raw_decode(text)
    return obj


class ShardReader:
    """Random access to one uncompressed MDS shard on local disk (memory-mapped).

    ``info`` is the shard's index entry; without it the columns are read from the config
    that MosaicML embeds in every shard. ``verify=True`` checks the file against the
    index's hashes first (:class:`HashMismatchError`). Arrays returned are read-only
    views of the mapping where the format allows it. ``offsets`` holds the ``num_samples + 1``
    sample offsets (int64); ``info`` the shard's index entry.

    >>> reader = ShardReader(Path("out/shard.00000.mds"))          # doctest: +SKIP
    >>> reader[0]["tokens"], reader.gather("tokens", np.arange(8))  # doctest: +SKIP
    """

    def __init__(self, path: Path, info: ShardInfo | None = None, *, verify: bool = False) -> None:
        self.path = path = Path(path)
        if verify and info is None:
            raise ConfigError(f"{path}: verify=True needs the shard's index entry (info)")
        if verify and info is not None:
            verify_file(path, info.raw_data.hashes, what=str(path))
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise _corrupt(path, f"file has {size} bytes, too short for an MDS header")
            self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self._mv = memoryview(self._mmap)
        self._buf = np.frombuffer(self._mmap, np.uint8)
        n = int.from_bytes(self._mv[:4], "little")
        head_end = 4 * (n + 2)
        if head_end > size:
            raise _corrupt(path, f"header says {n} samples, which cannot fit in {size} bytes")
        self.offsets: npt.NDArray[np.int64] = np.frombuffer(self._mmap, "<u4", n + 1, 4).astype(
            np.int64
        )
        steps = np.diff(self.offsets)
        if self.offsets[0] < head_end or self.offsets[-1] != size or (steps < 0).any():
            raise _corrupt(
                path,
                f"sample offsets (first {self.offsets[0]}, last {self.offsets[-1]}) do not fit "
                f"the file size {size} and header size {head_end}",
            )
        if info is None:
            info = self._info_from_config(head_end, size, n)
        else:
            self._check_header_columns(head_end, info)
        self.info = info
        if self.info.samples != n:
            raise _corrupt(path, f"file has {n} samples, the index records {self.info.samples}")
        if self.info.raw_data.bytes not in (0, size):
            raise _corrupt(
                path, f"file has {size} bytes, the index records {self.info.raw_data.bytes}"
            )
        self._num = n
        self._cols: list[tuple[str, Codec]] = [
            (name, get_codec(enc)) for name, enc in self.info.columns.items()
        ]
        self._codecs = dict(self._cols)
        self._nvar = sum(codec.size is None for _, codec in self._cols)
        self._unpack = struct.Struct(f"<{self._nvar}I").unpack_from
        self._views: dict[str, np.ndarray[Any, Any]] = {}
        if self._nvar == 0:
            stride = sum(codec.size or 0 for _, codec in self._cols)
            if (steps != stride).any():
                raise _corrupt(path, f"fixed-size samples must be {stride} bytes apart")
            self._views = self._strided_views(int(self.offsets[0]), stride)
        self._fixed = [(n, v, self._codecs[n].encoding == "int") for n, v in self._views.items()]

    def _info_from_config(self, head_end: int, size: int, n: int) -> ShardInfo:
        try:
            obj = _config_json(self._mv[head_end : int(self.offsets[0])])
            compression = obj.get("compression")
        except (ValueError, AttributeError, RecursionError):
            raise _corrupt(
                self.path, "the config JSON in the shard header does not parse"
            ) from None
        obj["raw_data"] = {"basename": self.path.name, "bytes": size, "hashes": {}}
        obj["samples"] = n
        ext = str(compression).partition(":")[0]
        obj["zip_data"] = (
            None if compression is None else dict(obj["raw_data"], basename=f"x.{ext}")
        )
        try:
            return ShardInfo.from_dict(obj, where=f"{self.path} (header config)")
        except FormatError as exc:
            raise type(exc)(str(exc)) from None

    def _check_header_columns(self, head_end: int, info: ShardInfo) -> None:
        """Refuse a shard whose own header lists other columns than its index entry."""
        try:
            obj = _config_json(self._mv[head_end : int(self.offsets[0])])
            header = dict(zip(obj["column_names"], obj["column_encodings"], strict=True))
        except (ValueError, KeyError, TypeError, RecursionError):
            return  # not a MosaicML-style header; the index entry is authoritative
        if header != info.columns:
            raise _corrupt(
                self.path,
                f"its header lists columns {header}, the index entry {info.columns}; "
                "the shard does not belong to this index",
            )

    def _strided_views(self, start: int, stride: int) -> dict[str, np.ndarray[Any, Any]]:
        views: dict[str, np.ndarray[Any, Any]] = {}
        pos = start
        for name, codec in self._cols:
            assert codec.dtype is not None and codec.shape is not None and codec.size is not None
            if self._num == 0:  # numpy refuses a view that starts at the end of the buffer
                views[name] = np.empty((0, *codec.shape), codec.dtype)
                continue
            inner = tuple(int(s) for s in np.empty(codec.shape, codec.dtype).strides)
            views[name] = np.ndarray(
                (self._num, *codec.shape),
                codec.dtype,
                buffer=self._mmap,
                offset=pos,
                strides=(stride, *inner),
            )
            pos += codec.size
        return views

    def __len__(self) -> int:
        return self._num

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding."""
        return self.info.columns

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as a dict; fixed-shape arrays are views into the mapping."""
        i = int(index)
        if i < 0:
            i += self._num
        if not 0 <= i < self._num:
            raise IndexError(f"{self.path}: sample {index} out of range (0..{self._num - 1})")
        if self._views:
            return {name: int(view[i]) if as_int else view[i] for name, view, as_int in self._fixed}
        return self._decode(i)

    def _decode(self, i: int) -> dict[str, Any]:
        pos, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if pos + 4 * self._nvar > end:
            raise _corrupt(
                self.path, f"sample {i} has {end - pos} bytes, too few for its column sizes"
            )
        sizes = iter(self._unpack(self._mmap, pos))
        pos += 4 * self._nvar
        sample: dict[str, Any] = {}
        for name, codec in self._cols:
            size = codec.size or next(sizes)
            if pos + size > end:
                raise _corrupt(self.path, f"sample {i} column {name!r} runs past the sample end")
            try:
                sample[name] = codec.decode(self._mv[pos : pos + size])
            # UnicodeDecodeError and JSONDecodeError are ValueErrors; deep JSON recurses.
            except (ValueError, IndexError, TypeError, RecursionError) as exc:
                raise _corrupt(
                    self.path,
                    f"sample {i} column {name!r} ({codec.encoding}) does not decode: {exc}",
                ) from None
            pos += size
        if pos != end:
            raise _corrupt(self.path, f"sample {i} has {end - pos} bytes after its last column")
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self._num))

    def column(self, name: str) -> np.ndarray[Any, Any]:
        """The whole column as one read-only strided view (shards of fixed-size columns only)."""
        self._fixed_codec(name)
        if not self._views:
            return self.gather(name, np.arange(self._num))
        return self._views[name]

    def _fixed_codec(self, name: str) -> Codec:
        codec = self._codecs.get(name)
        if codec is None:
            raise ConfigError(f"{self.path}: no column {name!r}; columns are {list(self._codecs)}")
        if codec.size is None:
            raise ConfigError(
                f"{self.path}: column {name!r} ({codec.encoding}) is variable-size; "
                "gather works on fixed-size columns, read samples with reader[i]"
            )
        return codec

    def gather(self, column: str, indices: npt.ArrayLike) -> np.ndarray[Any, Any]:
        """Samples ``indices`` of a fixed-size column as one array of shape ``(n, *shape)``.

        One vectorized gather (no Python loop per sample). When the shard's columns are all
        fixed-size and ``indices`` is an ascending contiguous run, the result is a
        zero-copy, read-only view of the mapping; otherwise it is a fresh array.
        """
        codec = self._fixed_codec(column)
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" and idx.size:
            raise ConfigError(f"{self.path}: gather indices must be integers, got {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self._num):
            raise IndexError(f"{self.path}: gather index out of range (0..{self._num - 1})")
        if self._views:
            view = self._views[column]
            result: np.ndarray[Any, Any]
            if idx.size and idx[-1] - idx[0] == idx.size - 1 and (np.diff(idx) == 1).all():
                result = view[idx[0] : idx[-1] + 1]
            else:
                result = view[idx]
            return result
        return self._gather_by_offsets(column, codec, idx)

    def _gather_by_offsets(
        self, column: str, codec: Codec, idx: npt.NDArray[np.int64]
    ) -> np.ndarray[Any, Any]:
        assert codec.dtype is not None and codec.shape is not None and codec.size is not None
        begins = self.offsets[idx]
        starts = begins + 4 * self._nvar
        if idx.size and (starts > self.offsets[idx + 1]).any():
            raise _corrupt(self.path, "a sample is too short for its column sizes")
        var_k = 0
        for name, other in self._cols:
            if name == column:
                break
            if other.size is None:
                starts = starts + self._read_u32(begins + 4 * var_k)
                var_k += 1
            else:
                starts = starts + other.size
        if idx.size and (starts + codec.size > self.offsets[idx + 1]).any():
            raise _corrupt(self.path, f"column {column!r} runs past the end of a sample")
        raw = self._windows(codec.size)[starts]
        out: np.ndarray[Any, Any] = raw.view(codec.dtype).reshape(idx.size, *codec.shape)
        return out

    def _windows(self, width: int) -> np.ndarray[Any, Any]:
        """Row ``j`` is bytes ``j .. j + width`` of the file (a zero-copy strided view).

        Fancy-indexing its rows copies one whole column value per index, so a gather costs
        one index per sample rather than one per byte.
        """
        windows: np.ndarray[Any, Any] = np.lib.stride_tricks.as_strided(
            self._buf, (max(len(self._buf) - width + 1, 0), width), (1, 1), writeable=False
        )
        return windows

    def _read_u32(self, positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        quads = np.ascontiguousarray(self._windows(4)[positions])
        return quads.view("<u4")[:, 0].astype(np.int64)

    def __reduce__(self) -> tuple[type[ShardReader], tuple[Path, ShardInfo]]:
        # A mapping cannot be pickled; a DataLoader worker re-opens the file instead.
        return (ShardReader, (self.path, self.info))

    def close(self) -> None:
        """Drop this reader's references to the mapping; it closes once no view uses it."""
        self._views = {}
        self._fixed = []
        self._cols = []

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
