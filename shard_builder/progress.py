"""The build's progress bar: input read, with samples/s and MB/s of samples produced."""

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

    def skip(self, input_bytes: int) -> None:
        """Input already handled by an interrupted run (moves the bar, not the rates)."""
        self._bar.update(input_bytes)

    def advance(self, input_bytes: int, samples: int, out_bytes: int) -> None:
        """Input worth ``input_bytes`` became ``samples`` samples of ``out_bytes`` bytes."""
        self.samples += samples
        self.out_bytes += out_bytes
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        rate, mbps = self.samples / elapsed, self.out_bytes / _MB / elapsed
        self._bar.set_postfix_str(f"{rate:,.0f} samples/s, {mbps:,.1f} MB/s out", refresh=False)
        self._bar.update(input_bytes)

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
