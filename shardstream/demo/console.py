"""What ``shardstream demo`` prints: its messages, and progress bars that follow a job."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


def say(message: str) -> None:
    """One line of the demo's story, flushed at once (a job's bar may follow)."""
    print(f"[demo] {message}", flush=True)


def follow(
    done: Callable[[], int],
    label: str,
    *,
    total: int,
    start: int = 0,
    stop_at: int | None = None,
    proc: subprocess.Popen[bytes] | None = None,
    after_total: str = "",
) -> None:
    """A bar over a job's steps ``start + 1 ..`` while ``done()`` (the last step the job
    logged) grows; a resumed job's bar starts at its checkpoint. Says what the job does
    before its first step, and ``after_total`` while it still runs past the bar's end.
    Returns once ``done()`` reaches ``stop_at`` or ``proc`` has exited."""
    from tqdm import tqdm

    end = stop_at or total
    with tqdm(
        total=end, initial=start, desc=f"[demo] {label}", unit="step", mininterval=0.5
    ) as bar:
        bar.set_postfix_str("starting: importing torch, opening the dataset, first batch")
        shown = start
        while True:
            step = max(done(), start)
            if step > shown:
                if shown == start:
                    bar.set_postfix_str("")
                bar.update(min(step, end) - shown)
                shown = min(step, end)
                if shown == end and after_total:
                    bar.set_postfix_str(after_total)
            if stop_at is not None and step >= stop_at:
                return
            if proc is not None and proc.poll() is not None:
                return
            time.sleep(0.1)
