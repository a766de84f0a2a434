"""The build's progress bar: input read, with samples/s and MB/s of samples produced.

A build may add its own counters (documents, tokens, images, shards, MB written) with
:meth:`BuildProgress.count`; they are shown after the rates.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from types import TracebackType

from tqdm import tqdm

_MB = 1 << 20
_PLANNING = contextvars.ContextVar("shardstream_planning_progress", default=False)


@contextlib.contextmanager
def planning_progress(enabled: bool) -> Iterator[None]:
    """Let :func:`planning_bar` show bars while a build plans its input (``enabled``: the
    build's ``progress`` option). Planning runs before the build's own bar exists, in
    format code that takes no options, so the switch is held here for its duration."""
    token = _PLANNING.set(enabled)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def planning_bar(total: int, desc: str, *, long: bool = True) -> tqdm:  # type: ignore[type-arg]
    """A bar over ``total`` bytes for a step of planning that takes long (``long``: reading
    a big index, say), shown only inside :func:`planning_progress` with progress on; it
    disappears when closed."""
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not (long and _PLANNING.get()),
        dynamic_ncols=True,
        leave=False,
    )


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
