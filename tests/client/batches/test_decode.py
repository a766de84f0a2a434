"""Batches become tensors without a NumPy warning: variable-length ndarray values (views
of the shard's read-only mapping) are copied, writable batch arrays are shared."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from shardstream.client.batches.decode import to_torch

_READ = """
import sys
import numpy as np
from shardstream.client import CacheOptions, StreamingDataset

root = sys.argv[1]
ds = StreamingDataset(root + "/ds", 4, cache=CacheOptions(dir=root + "/cache"))
rows = 0
for batch in ds:
    for i, x in zip(batch["id"].tolist(), batch["x"], strict=True):
        assert x.tolist() == list(range(i + 1)), (i, x)
        x += 1  # a transform that works in place must not fault on the shard's mapping
        rows += 1
assert rows == 16, rows
print("ok")
"""


def test_variable_length_ndarrays_decode_without_a_warning(tmp_path: Path) -> None:
    from shardstream.mds import MDSWriter

    with MDSWriter(tmp_path / "ds", {"id": "int", "x": "ndarray:int32"}) as writer:
        for i in range(16):
            writer.write({"id": i, "x": np.arange(i + 1, dtype=np.int32)})
    # torch warns once per process: a fresh interpreter, every warning an error.
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(_READ), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr


def test_a_copy_only_where_the_array_is_read_only() -> None:
    mapped = np.arange(6, dtype=np.int32)
    mapped.flags.writeable = False
    batch_array = np.zeros((2, 3), dtype=np.int64)
    strided = np.arange(12, dtype=np.int16)[::2]
    out = to_torch({"fixed": batch_array, "var": [mapped, strided], "text": ["a"]})
    assert out["fixed"].data_ptr() == batch_array.ctypes.data  # shared, not copied
    copied, contiguous = out["var"]
    assert copied.data_ptr() != mapped.ctypes.data and copied.tolist() == mapped.tolist()
    assert contiguous.is_contiguous() and contiguous.tolist() == strided.tolist()
    assert out["text"] == ["a"]
    assert isinstance(out["fixed"], torch.Tensor)
