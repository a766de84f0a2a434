"""An MDS dataset whose samples say who they are.

Sample ``i`` (its global id: the order it was written in) has an ``int64`` column ``id``
equal to ``i`` and a small ``tokens`` array derived from ``i``, so a training loop can log
which samples it consumed and check that each one decoded to the right bytes. Shard sizes
vary (seeded), so partitions and batches straddle shard boundaries unevenly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardstream.mds import MDSIndex, MDSWriter

TOKENS_PER_SAMPLE = 8
COLUMNS = {"id": "int64", "tokens": f"ndarray:uint16:{TOKENS_PER_SAMPLE}"}


def expected_tokens(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.uint16]:
    """The ``tokens`` of samples ``ids``: row ``k`` is ``(ids[k] * 31 + j) mod 65521``."""
    j = np.arange(TOKENS_PER_SAMPLE, dtype=np.int64)
    return ((ids[:, None] * 31 + j[None, :]) % 65521).astype(np.uint16)


def write_id_dataset(
    out_dir: Path,
    num_samples: int,
    *,
    min_shard: int = 40,
    max_shard: int = 400,
    seed: int = 7,
    compression: str | None = None,
) -> MDSIndex:
    """Write ``num_samples`` id samples into ``out_dir`` (shards of ``min..max_shard``)."""
    rng = np.random.default_rng(seed)
    ids = np.arange(num_samples, dtype=np.int64)
    tokens = expected_tokens(ids)
    with MDSWriter(out_dir, COLUMNS, compression=compression, size_limit=None) as writer:
        # size_limit=None: shards are cut here, at seeded uneven sizes, not by bytes.
        next_cut = int(rng.integers(min_shard, max_shard + 1))
        for i in range(num_samples):
            writer.write({"id": int(ids[i]), "tokens": tokens[i]})
            if i + 1 == next_cut:
                writer.flush_shard()
                next_cut += int(rng.integers(min_shard, max_shard + 1))
    return writer.index
