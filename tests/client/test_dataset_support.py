"""Helpers shared by the dataset/loader/source tests: building MDS datasets on disk, and
one reusable resume check (in the spirit of torchdata.nodes' save/load test helper)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shardstream.mds import MDSIndex, MDSWriter

TOKENS = 8


def token_row(i: int) -> np.ndarray[Any, Any]:
    """The tokens of sample ``i``: derived from ``i`` so a batch can be checked by value."""
    return (np.arange(TOKENS, dtype=np.int64) * 7 + i * 3).astype(np.uint16)


def write_tokens(
    out: Path,
    n: int,
    *,
    size_limit: int = 2048,
    compression: str | None = None,
    first_id: int = 0,
    text: bool = False,
) -> MDSIndex:
    """An MDS dataset of ``n`` samples ``{"id": i, "tokens": token_row(i)}`` in small shards."""
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    if text:
        columns["text"] = "str"
    with MDSWriter(out, columns, size_limit=size_limit, compression=compression) as writer:
        for i in range(first_id, first_id + n):
            sample: dict[str, Any] = {"id": i, "tokens": token_row(i)}
            if text:
                sample["text"] = f"sample {i}" + "!" * (i % 5)
            writer.write(sample)
    return _load(out)


def write_documents(out: Path, source: int, rng: np.random.Generator, *, docs: int = 200) -> None:
    """``docs`` documents of 1-60 tokens (log-normal lengths) in ``out``, each token telling
    its source (``>= source * 10**6``), its document (``1000 * doc``) and its position."""
    with MDSWriter(out, {"tokens": "ndarray:uint32"}, size_limit=4 << 10) as writer:
        for doc in range(docs):
            n = int(np.clip(rng.lognormal(2.5, 0.7), 1, 60))
            writer.write({"tokens": (np.arange(n) + 1000 * doc + source * 10**6).astype(np.uint32)})


def _load(out: Path) -> MDSIndex:
    from shardstream.mds import load_index

    return load_index(out / "index.json")


def image_bytes(i: int, fmt: str) -> bytes:
    """A 6x4 RGB image whose pixels encode ``i`` (PNG exactly; JPEG approximately)."""
    from PIL import Image

    arr = np.full((4, 6, 3), i % 256, dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt.upper(), quality=95)
    return buf.getvalue()


def write_images(out: Path, n: int) -> MDSIndex:
    """An MDS dataset with ``png`` and ``jpeg`` columns holding raw encoded images."""
    with MDSWriter(out, {"id": "int", "png": "png", "jpeg": "jpeg"}, size_limit=1500) as writer:
        for i in range(n):
            writer.write({"id": i, "png": image_bytes(i, "png"), "jpeg": image_bytes(i, "jpeg")})
    return _load(out)


class Resumable(Protocol):
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...


def ids_of(batch: Mapping[str, Any]) -> list[int]:
    """The ``id`` column of a batch as a list."""
    return [int(x) for x in np.asarray(batch["id"]).reshape(-1)]


def run_epochs(
    reader: Resumable, epochs: Iterable[int], limit: int | None = None
) -> list[list[int]]:
    """Batches (as id lists) over ``epochs``, stopping after ``limit`` batches."""
    out: list[list[int]] = []
    for epoch in epochs:
        reader.set_epoch(epoch)
        for batch in reader:
            out.append(ids_of(batch))
            if limit is not None and len(out) >= limit:
                return out
    return out


def check_resume(
    make: Callable[[], Resumable], num_epochs: int, cuts: Iterable[int]
) -> list[list[int]]:
    """Save after ``cut`` batches, restore into a fresh reader, finish: must equal the
    uninterrupted run exactly (cuts at 0, mid-epoch, at the epoch boundary, the end).

    Returns the uninterrupted sequence of batches.
    """
    reference = run_epochs(make(), range(num_epochs))
    for cut in cuts:
        first = make()
        head = run_epochs(first, range(num_epochs), limit=cut) if cut else []
        state = first.state_dict()
        close = getattr(first, "close", None)
        if close:
            close()
        second = make()
        second.load_state_dict(state)
        start_epoch = int(state["epoch"])
        tail = run_epochs(second, range(start_epoch, num_epochs))
        close = getattr(second, "close", None)
        if close:
            close()
        assert head + tail == reference, f"resume after {cut} batches diverged"
    return reference


def write_image_tree(root: Path, n: int, *, classes: int) -> None:
    """An ImageNet-style folder ``root/classNN/*.jpg`` of ``n`` small JPEGs of assorted
    sizes; class ``k``'s images are brightest in channel ``k % 3`` (checkable after any
    crop)."""
    from PIL import Image

    rng = np.random.default_rng(n)
    for i in range(n):
        label = i % classes
        h, w = (int(x) for x in rng.integers(40, 72, 2))
        arr = rng.integers(0, 50, (h, w, 3))
        arr[..., label % 3] += 180
        folder = root / f"class{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr.astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)
