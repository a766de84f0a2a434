"""Import throughput: ``shardstream import`` beside reading the same source with its own library.

For each format a source is generated here with that format's own writer
(``webdataset.ShardWriter``, ``tfrecord.TFRecordWriter``, ``lmdb``, ``litdata.optimize``):
samples of a small JPEG-sized byte payload, an int label and a text caption. "library read"
iterates every record with the format's library alone (WebDataset without decoders,
``tfrecord_loader``, an LMDB cursor, LitData's ``StreamingDataset`` in order); "import" is
the whole ``build_import`` (read, schema check, encode, write shards with hashes) with 1
worker and with all cores. The ratio import / library read is what the issue asks to keep
at or above 0.8.

    python benchmarks/import_formats.py              # 20,000 samples of 4 KB
    python benchmarks/import_formats.py --samples 2000 --payload 1024
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _payload(rng: np.random.Generator, size: int) -> bytes:
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def _webdataset(root: Path, n: int, size: int) -> tuple[str, Callable[[], int]]:
    import webdataset as wds

    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=2000, verbose=0) as sink:
        for i in range(n):
            sink.write(
                {
                    "__key__": f"s{i:08d}",
                    "bin": _payload(rng, size),
                    "cls": i % 1000,
                    "txt": f"caption {i}",
                }
            )
    count = len(list(root.glob("*.tar")))
    pattern = str(root / f"shard-{{000000..{count - 1:06d}}}.tar")

    def read() -> int:
        return sum(1 for _ in wds.WebDataset(pattern, shardshuffle=False))

    return pattern, read


def _tfrecord(root: Path, n: int, size: int) -> tuple[str, Callable[[], int]]:
    from tfrecord.reader import tfrecord_loader
    from tfrecord.writer import TFRecordWriter

    rng = np.random.default_rng(0)
    files = []
    for f in range(max(1, n // 2000)):
        path = root / f"part-{f:04d}.tfrecord"
        writer = TFRecordWriter(str(path))
        for i in range(f * 2000, min(n, (f + 1) * 2000)):
            writer.write(
                {
                    "bin": (_payload(rng, size), "byte"),
                    "cls": (i % 1000, "int"),
                    "txt": (f"caption {i}".encode(), "byte"),
                }
            )
        writer.close()
        files.append(path)

    def read() -> int:
        return sum(1 for p in files for _ in tfrecord_loader(str(p), None))

    return str(root), read


def _lmdb(root: Path, n: int, size: int) -> tuple[str, Callable[[], int]]:
    import lmdb

    rng = np.random.default_rng(0)
    env = lmdb.open(str(root / "db"), map_size=1 << 34)
    with env.begin(write=True) as txn:
        for i in range(n):
            txn.put(f"s{i:08d}".encode(), _payload(rng, size))
    env.close()

    def read() -> int:
        db = lmdb.open(str(root / "db"), readonly=True, lock=False)
        with db.begin() as txn:
            count = sum(1 for _ in txn.cursor())
        db.close()
        return count

    return str(root / "db"), read


def _litdata_item(size: int, i: int) -> dict[str, object]:
    rng = np.random.default_rng(i)
    return {"bin": _payload(rng, size), "cls": i % 1000, "txt": f"caption {i}"}


def _litdata(root: Path, n: int, size: int) -> tuple[str, Callable[[], int]]:
    from litdata import StreamingDataset, optimize

    out = root / "optimized"
    optimize(fn=functools.partial(_litdata_item, size), inputs=list(range(n)), output_dir=str(out),
             chunk_bytes="64MB", num_workers=1, verbose=False)  # fmt: skip

    def read() -> int:
        ds = StreamingDataset(str(out), shuffle=False)
        return sum(1 for i in range(len(ds)) if ds[i] is not None)

    return str(out), read


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    count = fn()
    return time.perf_counter() - started, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=4096, help="bytes per sample payload")
    args = parser.parse_args()
    from shardstream.shard_builder.importers import ImportConfig, build_import

    cores = os.cpu_count() or 1
    print(f"{args.samples:,} samples of {args.payload} B, {cores} cores")
    print(f"{'format':<12}{'reader':<22}{'records/s':>12}{'MB/s':>9}{'vs library':>12}")
    formats = (
        ("webdataset", _webdataset),
        ("tfrecord", _tfrecord),
        ("lmdb", _lmdb),
        ("litdata", _litdata),
    )
    for name, make in formats:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "src"
            root.mkdir()
            source, read = make(root, args.samples, args.payload)
            mb = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / (1 << 20)
            rows = [("library read", *_timed(read))]
            for workers in sorted({1, cores}):
                out = Path(tmp) / f"out{workers}"

                def run(w: int = workers, o: Path = out, f: str = name, s: str = source) -> int:
                    config = ImportConfig(
                        format=f, inputs=(s,), output=str(o), workers=w, progress=False
                    )
                    return build_import(config).samples

                rows.append((f"import, {workers} worker(s)", *_timed(run)))
                shutil.rmtree(out)
            base = rows[0][1]
            for label, secs, count in rows:
                assert count == args.samples, (name, label, count)
                print(
                    f"{name:<12}{label:<22}{count / secs:>12,.0f}{mb / secs:>9.1f}"
                    f"{base / secs:>11.3g}x"
                )


if __name__ == "__main__":
    main()
