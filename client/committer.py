"""Checkpoint commits off the training loop: ordered, bounded, flushed, never lost silently.

A checkpoint commit is a small POST, but it sits on the training loop's path: with every
rank committing at once (4,096 ranks: a burst of 4,096 requests), any server latency would
stall every rank's step. :class:`CheckpointCommitter` sends commits from one background
thread per process and server, over one reused connection pool:

* ``submit`` puts a commit on a bounded queue and returns at once; only a full queue
  (``max_pending`` commits not yet durable, e.g. a server down for many checkpoint
  intervals) makes it wait, so a training loop cannot run unboundedly ahead of what is
  durable;
* commits are sent one at a time in submission order (a run's steps only increase, and
  the server refuses a step below its latest: sending out of order would refuse good ones);
* a commit is retried with backoff on connection errors, timeouts, 429 and 502/503/504
  until ``retry_for_s`` has passed, because a server restart should not cost a
  checkpoint: the API client does the retrying, under the project's one retry policy with
  that deadline (:meth:`~shardstream.api_client.APIClient.with_retry`), so there is one
  loop, not one nested in another; any other refusal (409, 403, 404, 422) is final;
* a failure is logged when it happens and raised by the next ``submit`` or ``flush``
  (once), so the training loop learns about it at its next checkpoint at the latest;
* ``flush`` waits until every commit submitted so far is durable; each process flushes
  its committers at exit (``atexit``), logging what failed.

>>> committer = committer_for("http://127.0.0.1:8470", token)   # doctest: +SKIP
>>> committer.submit(run, step=100, epoch=0, sample_in_epoch=25_600, plan={})  # doctest: +SKIP
>>> committer.flush()          # every commit so far is on the server  # doctest: +SKIP
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from shardstream.api_client import APIClient
from shardstream.errors import APIError, ServerUnavailableError, ShardstreamError
from shardstream.retry import RetryPolicy

__all__ = ["CheckpointCommitter", "committer_for", "existing_committer"]

log = logging.getLogger("shardstream.client")

MAX_PENDING = 64
"""Commits submitted but not yet durable, per committer, before ``submit`` waits."""

RETRY_FOR_S = 120.0
"""How long a commit keeps being retried while the server is unreachable or answers 5xx:
long enough to ride out a server restart, short enough that a failure surfaces."""

PAUSE_CAP_S = 10.0
"""The longest wait between two attempts of a commit (before jitter): a server back up is
noticed within seconds, without a restarting server being asked every few milliseconds."""


@dataclass
class _Commit:
    run: int
    step: int
    epoch: int
    sample_in_epoch: int
    plan: dict[str, Any]
    attempt: int | None = None
    stats: dict[str, Any] | None = None
    done: Future[None] = field(default_factory=Future)


class CheckpointCommitter:
    """Sends one server's checkpoint commits from a background thread (see the module)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        max_pending: int = MAX_PENDING,
        retry_for_s: float = RETRY_FOR_S,
        client: Callable[[], APIClient] | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        if not retry_for_s >= 0:
            raise ValueError(f"retry_for_s must be >= 0 seconds, got {retry_for_s}")
        self.url = url
        self.api = client() if client is not None else APIClient(url, token)
        """The client for everything but commits (its own, shorter, retries)."""
        self._commits = self.api.with_retry(commit_policy(self.api.retry, retry_for_s))
        self._queue: queue.Queue[_Commit | None] = queue.Queue(max_pending)
        self._lock = threading.Lock()
        self._last: Future[None] | None = None  # the newest commit submitted
        self._failure: APIError | ShardstreamError | None = None  # not yet raised to anyone
        self._closed = False
        self._thread = threading.Thread(
            target=self._send_all, name="shardstream-committer", daemon=True
        )
        self._thread.start()

    def submit(
        self,
        run: int,
        *,
        step: int,
        epoch: int,
        sample_in_epoch: int,
        plan: Mapping[str, Any],
        attempt: int | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> Future[None]:
        """Queue a commit; returns a future that is done once it is durable (or failed).

        Raises the failure of an earlier commit that nobody was told about yet.
        """
        self.raise_failure()
        commit = _Commit(
            run,
            step,
            epoch,
            sample_in_epoch,
            dict(plan),
            attempt,
            None if stats is None else dict(stats),
        )
        with self._lock:
            if self._closed:
                raise ShardstreamError(
                    f"the checkpoint committer for {self.url} is closed (the process is exiting)"
                )
            self._last = commit.done
        self._queue.put(commit)  # blocks only while max_pending commits are not durable
        return commit.done

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every commit submitted so far is durable; raise a failure if any."""
        last = self._last
        if last is not None:
            try:
                last.result(timeout)
            except TimeoutError:
                raise ServerUnavailableError(
                    f"checkpoint commits to {self.url} were not durable within {timeout:g} s",
                    0,
                ) from None
            except Exception:  # recorded in _failure, raised just below
                pass
        self.raise_failure()

    def raise_failure(self) -> None:
        """Raise (once) the failure of a commit that nobody was told about yet."""
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the thread and close the connection pool."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush(timeout)
        finally:
            self._queue.put(None)
            self._thread.join(timeout)
            self.api.close()

    # -- the background thread ------------------------------------------------------------

    def _send_all(self) -> None:
        while (commit := self._queue.get()) is not None:
            try:
                self._send(commit)
            except (APIError, ShardstreamError) as exc:
                failure = type(exc)(
                    f"checkpoint commit of run {commit.run} step {commit.step} to {self.url} "
                    f"failed: {exc}",
                    *([exc.status] if isinstance(exc, APIError) else []),
                )
                failure.__cause__ = exc
                log.error("%s", failure)
                with self._lock:
                    if self._failure is None:  # the first failure is the one to act on
                        self._failure = failure
                commit.done.set_exception(failure)
            except BaseException as exc:  # a bug: still surface it, never hang a flush
                log.exception("checkpoint commit of run %s step %s", commit.run, commit.step)
                with self._lock:
                    self._failure = self._failure or ShardstreamError(
                        f"checkpoint commit of run {commit.run} step {commit.step} failed: "
                        f"{type(exc).__name__}: {exc}"
                    )
                commit.done.set_exception(exc)
            else:
                commit.done.set_result(None)

    def _send(self, commit: _Commit) -> None:
        self._commits.commit_checkpoint(
            commit.run,
            step=commit.step,
            epoch=commit.epoch,
            sample_in_epoch=commit.sample_in_epoch,
            plan=commit.plan,
            attempt=commit.attempt,
            stats=commit.stats,
        )


def commit_policy(usual: RetryPolicy, retry_for_s: float) -> RetryPolicy:
    """``usual`` (the client's policy) bounded by ``retry_for_s`` seconds instead of a
    number of attempts, its waits capped at :data:`PAUSE_CAP_S`: a restarting server takes
    longer than a lookup's few retries, and a commit lost to it would cost a checkpoint."""
    return replace(usual, attempts=None, cap_s=PAUSE_CAP_S, within_s=retry_for_s)


class _Registry:
    """This process's committers, one per (server URL, token)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.committers: dict[tuple[str, str | None], CheckpointCommitter] = {}

    def forget(self) -> None:
        """Start empty, with a fresh lock (in a forked child)."""
        self.lock = threading.Lock()
        self.committers = {}


_registry = _Registry()


def committer_for(url: str, token: str | None) -> CheckpointCommitter:
    """This process's committer for ``url`` with ``token`` (created on first use)."""
    key = (url.rstrip("/"), token)
    with _registry.lock:
        committer = _registry.committers.get(key)
        if committer is None:
            committer = _registry.committers[key] = CheckpointCommitter(url, token)
        return committer


def existing_committer(url: str, token: str | None) -> CheckpointCommitter | None:
    """This process's committer for ``url`` with ``token``, if it ever committed."""
    with _registry.lock:
        return _registry.committers.get((url.rstrip("/"), token))


def _flush_at_exit() -> None:
    """Make every submitted commit durable before the process ends (failures are logged:
    an exception raised here would be printed without stopping the exit anyway)."""
    with _registry.lock:
        committers = list(_registry.committers.values())
        _registry.committers.clear()
    for committer in committers:
        try:
            committer.close(timeout=RETRY_FOR_S + 30)
        except Exception as exc:
            log.error("checkpoint commits to %s at exit: %s", committer.url, exc)


def _forget_in_child() -> None:
    # A forked child (a loader worker) has none of its parent's threads: it must never
    # wait on, or flush, the parent's committers (whose lock a parent thread may hold).
    _registry.forget()


atexit.register(_flush_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
