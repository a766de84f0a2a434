"""The build's progress bar: input read, with samples/s and MB/s of shards written."""

from __future__ import annotations

import time
from types import TracebackType

from tqdm import tqdm

_MB = 1 << 20


class BuildProgress:
    """A tqdm bar over input bytes with samples/s and output MB/s in its postfix.

    ``enabled=False`` keeps the counters (for :class:`BuildResult` timings) without output.
    """

    def __init__(self, total_input_bytes: int, *, desc: str, enabled: bool) -> None:
        self.samples = 0
        self.out_bytes = 0
        self._start = time.perf_counter()
        self._bar = tqdm(
            total=total_input_bytes,
            desc=desc,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            disable=not enabled,
            dynamic_ncols=True,
        )

    def advance(self, input_bytes: int) -> None:
        """Input worth ``input_bytes`` has been read and tokenized/decoded."""
        self._bar.update(input_bytes)

    def shard_written(self, samples: int, nbytes: int) -> None:
        """A shard of ``samples`` samples and ``nbytes`` bytes is done."""
        self.samples += samples
        self.out_bytes += nbytes
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix_str(
            f"{self.samples / elapsed:,.0f} samples/s, {self.out_bytes / _MB / elapsed:,.1f} MB/s",
            refresh=False,
        )

    @property
    def elapsed(self) -> float:
        """Seconds since the bar was created."""
        return time.perf_counter() - self._start

    def close(self) -> None:
        """Finish the bar."""
        self._bar.close()

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
