"""The build's progress bar: input read, with samples/s and MB/s of samples produced.

A build may add its own counters (documents, tokens, images, shards, MB written) with
:meth:`BuildProgress.count`; they are shown after the rates.
"""

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
        self.counts: dict[str, float] = {}
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

    def advance(self, input_bytes: int, samples: int, out_bytes: int, **counts: float) -> None:
        """Input worth ``input_bytes`` became ``samples`` samples of ``out_bytes`` bytes
        (and ``counts`` more of the named counters, see :meth:`count`)."""
        self.samples += samples
        self.out_bytes += out_bytes
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0) + value
        self._show()
        self._bar.update(input_bytes)

    def count(self, **increments: float) -> None:
        """Add to named counters shown in the bar, e.g. ``count(shards=1, mb_written=128)``."""
        for name, value in increments.items():
            self.counts[name] = self.counts.get(name, 0) + value
        self._show()  # drawn at the next update, at most every tqdm interval

    def _show(self) -> None:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        rate, mbps = self.samples / elapsed, self.out_bytes / _MB / elapsed
        shown = [f"{rate:,.0f} samples/s", f"{mbps:,.1f} MB/s out"]
        for name, value in self.counts.items():
            number = f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
            shown.append(f"{number} {name.replace('_', ' ')}")
        self._bar.set_postfix_str(", ".join(shown), refresh=False)

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
