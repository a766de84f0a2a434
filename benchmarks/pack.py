"""Read-time packing: padding and truncation of group packing beside whole-stream references.

Documents with log-normal lengths (median ``exp(mu)``, long tail, clipped to ``--max-len``),
uint32 tokens, rows of ``--seq-len``. For each packer we print:

* ``rows``: rows produced; ``pad %``: share of row positions without a token;
* ``trunc %``: share of the documents' tokens cut (fixed row counts only);
* ``Mtok/s``: tokens packed per second, layout plus filling ``input_ids``, ``position_ids``,
  ``doc_ids``, ``cu_seqlens`` (one process, this machine).

Packers: shardstream's group packing (:mod:`shardstream.client.batches.packing`, the rows a
``PackOptions(group=G)`` reader yields: each group of ``G`` consecutive documents alone;
``rows=auto`` as many rows as needed, ``rows=R`` a fixed count, ``R`` = the group's mean
tokens / seq_len rounded up), and references over the whole stream with no group
boundary: greedy (next-fit) and first-fit with unbounded bins (the best a single-pass
first-fit can do), and a first-fit with ``--bins`` open bins, the fullest flushed when a
piece fits none. Grain's own packer (a dev dependency) is measured beside them:
``grain.experimental.FirstFitPackIterDataset(num_packing_bins=--bins, shuffle_bins=False)``
over the documents cut into ``seq_len`` pieces first, as ours are (Grain refuses longer
inputs); when a piece fits none of its bins it emits all of them, so it pads more than the
bounded reference. ``--no-grain`` leaves it out.
LanceDB (a dev dependency) is measured through its own loader: the documents as a
``list<uint32>`` column of a local LanceDB table (written before the clock starts) read by
``lancedb.streaming.StreamingDataset(pack_sequences=seq_len, eos_id=, pad_id=,
blocks_per_epoch=)`` in this process, once with ``num_splits=1`` and once per
``--lance-splits``. It joins the documents of each split with ``eos_id`` (one token more per
document: its rows count those as placed) and cuts every ``seq_len`` tokens, so a document
continues in the next row; ``blocks_per_epoch`` is the fewest rows that hold every token,
rounded up to a multiple of the splits, and each split emits exactly its share: a short
split is padded, a long one loses its surplus (``trunc %``). Its ``Mtok/s`` includes reading
the table, ours and the references pack documents already in memory. Run:
``python benchmarks/pack.py`` (``--docs 2000`` for a quick look; ``--lance-splits ''`` to
leave LanceDB out).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shardstream.client.batches.packing import Layout, fill, pack_lengths


def _lengths(n: int, mu: float, sigma: float, max_len: int, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mu, sigma, n).astype(np.int64), 1, max_len)


def _docs(lengths: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 50_000, int(n), dtype=np.uint32) for n in lengths]


def _grouped(
    docs: list[np.ndarray[Any, Any]], seq_len: int, group: int, rows: int | None, method: str
) -> tuple[int, int, int]:
    """(rows, tokens placed, tokens truncated) of group packing, filling every group."""
    total_rows = placed = cut = 0
    for first in range(0, len(docs), group):
        part = docs[first : first + group]
        layout = pack_lengths([len(d) for d in part], seq_len, rows=rows, method=method)
        fill(layout, part, pad_id=0)
        total_rows += layout.rows
        placed += layout.tokens
        cut += layout.truncated
    return total_rows, placed, cut


def _whole(docs: list[np.ndarray[Any, Any]], seq_len: int, method: str) -> tuple[int, int, int]:
    layout: Layout = pack_lengths([len(d) for d in docs], seq_len, method=method)
    fill(layout, docs, pad_id=0)
    return layout.rows, layout.tokens, layout.truncated


def _bounded_first_fit(
    docs: list[np.ndarray[Any, Any]], seq_len: int, bins: int
) -> tuple[int, int, int]:
    """First-fit over at most ``bins`` open rows; when none fits and all are open, the
    fullest is emitted (Grain's packer emits all of them then). Layout only, plus a fill."""
    open_free: list[int] = []
    rows = placed = 0
    for doc in docs:
        for start in range(0, len(doc), seq_len):
            piece = min(seq_len, len(doc) - start)
            for i, room in enumerate(open_free):
                if room >= piece:
                    open_free[i] -= piece
                    break
            else:
                if len(open_free) == bins:
                    open_free.pop(int(np.argmin(open_free)))
                    rows += 1
                open_free.append(seq_len - piece)
            placed += piece
    rows += len(open_free)
    out = np.zeros((1, seq_len), np.uint32)  # the copies a real packer makes
    for doc in docs:
        for start in range(0, len(doc), seq_len):
            piece = doc[start : start + seq_len]
            out[0, : len(piece)] = piece
    return rows, placed, 0


def _grain(docs: list[np.ndarray[Any, Any]], seq_len: int, bins: int) -> tuple[int, int, int]:
    import grain

    pieces = [
        {"tokens": d[s : s + seq_len].astype(np.int64)}
        for d in docs
        for s in range(0, len(d), seq_len)
    ]
    ds = grain.MapDataset.source(pieces).to_iter_dataset()
    packed = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct={"tokens": seq_len}, num_packing_bins=bins, shuffle_bins=False
    )
    rows = placed = 0
    for example in packed:
        rows += 1
        placed += int((np.asarray(example["tokens_segment_ids"]) > 0).sum())
    return rows, placed, sum(len(d) for d in docs) - placed


def _lance_table(docs: list[np.ndarray[Any, Any]], folder: str) -> Any:
    """The documents as a LanceDB table with one ``list<uint32>`` row per document."""
    import lancedb
    import lancedb.streaming  # imported here, outside the clock (it takes a second or two)
    import pyarrow as pa

    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(docs)))
    return lancedb.connect(folder).create_table("docs", pa.table({"tokens": tokens}))


def _lancedb(
    table: Any, wanted: int, seq_len: int, splits: int, pad_id: int
) -> tuple[int, int, int]:
    """(rows, positions holding a token, tokens left out) of LanceDB's packing loader over
    ``table``, whose documents hold ``wanted`` tokens with their EOS."""
    from lancedb.streaming import StreamingDataset

    fewest = -(-wanted // seq_len)
    blocks = -(-fewest // splits) * splits
    ds = StreamingDataset(
        table,
        num_splits=splits,
        columns=["tokens"],
        pack_sequences=seq_len,
        eos_id=0,
        pad_id=pad_id,
        blocks_per_epoch=blocks,
        shuffle_seed=0,
    )
    rows = placed = 0
    for item in ds:
        rows += 1
        placed += int((item["input_ids"] != pad_id).sum())
    return rows, placed, wanted - placed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--mu", type=float, default=6.0, help="log of the median length")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-len", type=int, default=16_384)
    parser.add_argument("--groups", default="64,256,1024")
    parser.add_argument("--bins", type=int, default=8)
    parser.add_argument("--no-grain", action="store_true", help="leave Grain's packer out")
    parser.add_argument(
        "--lance-splits", default="8", help="LanceDB num_splits besides 1 ('' for no LanceDB)"
    )
    args = parser.parse_args()
    if not args.no_grain:
        try:
            import grain  # noqa: F401  (imported outside the clock)
        except ImportError as exc:
            parser.error(
                f"{exc}: Grain is a dev dependency (pip install -e '.[dev]'), or --no-grain"
            )

    lengths = _lengths(args.docs, args.mu, args.sigma, args.max_len, seed=0)
    docs = _docs(lengths)
    total = int(lengths.sum())
    print(
        f"{args.docs:,} documents, {total:,} tokens, median {int(np.median(lengths))}, "
        f"mean {lengths.mean():.0f}, p99 {int(np.percentile(lengths, 99))}, seq_len {args.seq_len}"
    )
    runs: list[tuple[str, Callable[[], tuple[int, int, int]]]] = []
    for method in ("greedy", "first_fit"):
        runs.append((f"stream {method} (ref)", lambda m=method: _whole(docs, args.seq_len, m)))
    runs.append(
        (
            f"first-fit {args.bins} bins (ref)",
            lambda: _bounded_first_fit(docs, args.seq_len, args.bins),
        )
    )
    if not args.no_grain:
        runs.append(
            (f"grain first-fit {args.bins} bins", lambda: _grain(docs, args.seq_len, args.bins))
        )
    folder = tempfile.TemporaryDirectory(prefix="pack-lancedb-")
    if args.lance_splits:
        table = _lance_table(docs, folder.name)
        pad_id = 1 << 32  # no uint32 token: LanceDB needs a pad id that is no token
        wanted = total + len(docs)  # with the EOS that joins every document to the next
        for splits in sorted({1, *(int(n) for n in args.lance_splits.split(","))}):
            runs.append(
                (
                    f"lancedb pack_sequences splits={splits}",
                    lambda n=splits: _lancedb(table, wanted, args.seq_len, n, pad_id),
                )
            )
    for group in (int(g) for g in args.groups.split(",")):
        fixed = -(-int(lengths.mean() * group) // args.seq_len)
        for method in ("greedy", "first_fit"):
            for rows in (None, fixed):
                name = f"ours G={group} {method} rows={'auto' if rows is None else rows}"
                runs.append(
                    (name, lambda g=group, m=method, r=rows: _grouped(docs, args.seq_len, g, r, m))
                )
    print(f"{'packer':<40} {'rows':>8} {'pad %':>7} {'trunc %':>8} {'Mtok/s':>8}")
    for name, run in runs:
        started = time.perf_counter()
        rows, placed, cut = run()
        secs = time.perf_counter() - started
        pad = 100 * (rows * args.seq_len - placed) / max(rows * args.seq_len, 1)
        print(
            f"{name:<40} {rows:>8,} {pad:>7.2f} {100 * cut / total:>8.2f} "
            f"{placed / secs / 1e6:>8.1f}"
        )
    folder.cleanup()


if __name__ == "__main__":
    main()
