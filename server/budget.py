"""A per-token request budget: one token cannot take a server process for itself.

A server process is one event loop and a thread pool sharing one GIL: a single read
token sending expensive requests back to back (``index.json`` of a large version costs
about 245 ms of CPU) on many connections took the whole process, and every other
caller's latency rose about tenfold (a flood of cheap requests on many connections did
the same). :class:`TokenBudgetGuard` (pure ASGI, in front of the body guard) keeps an
account per credential, per process:

* **in flight**: at most ``concurrency`` requests of one token at once
  (``SHARDSTREAM_TOKEN_CONCURRENCY``);
* **server time**: each request is charged its share of the process while it was in
  the server (see :class:`TokenAccounts`); the account refills at ``busy_s`` seconds per
  second (``SHARDSTREAM_TOKEN_BUSY_S``: the share of the process a token may keep, 0.5 is
  half) up to ``burst_s`` seconds (``SHARDSTREAM_TOKEN_BURST_S``). A token in debt is
  refused while other tokens' requests are in the server, until its debt is repaid;
  alone, it may keep :data:`DEBT_IN_FLIGHT` requests in flight, since refusing it then
  would only leave the server idle.

Refusals are ``429`` with ``Retry-After`` (whole seconds) and a message naming the
setting, sent after a wait of up to :data:`REFUSAL_DELAY_S` (which ``Retry-After`` then
counts), so a client that ignores ``Retry-After`` cannot make the server parse thousands
of refused requests per connection; the SDK waits and retries them. Checkpoint commits
are never refused for time (only for the in-flight bound): they are on the training
loop's path and cost little.

The account is keyed by the credential as sent (a hash of the ``Authorization`` header,
or of the console's cookie), before any lookup, so the check costs no database work;
requests without a credential (health checks, metrics, the sign-in page) are not
counted, and bogus credentials get their 401 from the routes as before. Accounts that
are full and idle are dropped, so their number stays bounded.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from shardstream.server.priority import PRIORITY_WRITES

_EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
_MAX_ACCOUNTS = 10_000


@dataclass(frozen=True)
class TokenBudget:
    """How much of a server process one token may use (0 turns a bound off)."""

    concurrency: int = 64
    busy_s: float = 0.5
    burst_s: float = 10.0

    @property
    def enabled(self) -> bool:
        """Whether any bound applies."""
        return self.concurrency > 0 or self.busy_s > 0


REFUSAL_DELAY_S = 1.0
"""How long a 429 answer waits before it is sent."""

DEBT_IN_FLIGHT = 4
"""Requests a token in debt may keep in flight while no other token's are in the server."""


@dataclass
class _Account:
    balance: float  # seconds of server time the token may still use (negative: debt)
    updated: float  # monotonic time of the last refill
    in_flight: int = 0


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused and when to come back."""

    retry_after_s: int
    detail: str


@dataclass(frozen=True)
class Ticket:
    """An admitted request: the server's shared clock when it came in."""

    started: float


class TokenAccounts:
    """The accounts of one process (the policy, apart from ASGI; ``clock`` for tests).

    Server time is shared: while ``N`` requests are in the server, each gets ``1/N`` of
    it, so a request is charged the integral of ``1/N`` over its stay (a shared clock that
    advances at ``1/N`` seconds per second, as in processor-sharing schedulers). A token
    alone is charged 1 s per second however many requests it sends at once, and the
    charges of all tokens add up to the time the server was busy: what a token pays is
    its share of the process, not its requests' waiting behind each other.
    """

    def __init__(self, budget: TokenBudget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.clock = clock
        self._accounts: dict[str, _Account] = {}
        self._in_flight = 0  # requests of every token in the server now
        self._shared = 0.0  # the shared clock (seconds of one request's share)
        self._shared_at = clock()

    def admit(self, key: str, *, time_exempt: bool = False) -> Refusal | Ticket:
        """Count a request of ``key`` in (its ticket), or say why not (nothing counted)."""
        now = self.clock()
        account = self._refilled(key, now)
        budget = self.budget
        if budget.concurrency > 0 and account.in_flight >= budget.concurrency:
            return Refusal(
                1,
                f"this token has {account.in_flight} requests in the server already, its "
                f"limit per server process (SHARDSTREAM_TOKEN_CONCURRENCY); retry after one "
                "finishes",
            )
        if budget.busy_s > 0 and account.balance <= 0 and not time_exempt:
            # In debt. Alone in the process, the token may go on with a few requests at a
            # time (refusing it would only leave the server idle); beside other callers'
            # requests it waits until its debt is repaid.
            others = self._in_flight - account.in_flight
            if others > 0 or account.in_flight >= DEBT_IN_FLIGHT:
                wait = max(1, math.ceil(-account.balance / budget.busy_s))
                return Refusal(
                    wait,
                    f"this token used its share of the server's time ({budget.busy_s:g} s "
                    f"per second, bursts up to {budget.burst_s:g} s: SHARDSTREAM_TOKEN_BUSY_S,"
                    f" SHARDSTREAM_TOKEN_BURST_S); retry in {wait} s",
                )
        self._advance(now)
        account.in_flight += 1
        self._in_flight += 1
        return Ticket(self._shared)

    def release(self, key: str, ticket: Ticket) -> None:
        """A request of ``key`` admitted with ``ticket`` ended: charge its share."""
        now = self.clock()
        account = self._refilled(key, now)
        self._advance(now)
        if account.in_flight > 0:
            account.in_flight -= 1
            self._in_flight -= 1
        if self.budget.busy_s > 0:
            account.balance -= self._shared - ticket.started

    def _advance(self, now: float) -> None:
        if self._in_flight > 0:
            self._shared += (now - self._shared_at) / self._in_flight
        self._shared_at = now

    def in_flight(self, key: str) -> int:
        """Requests of ``key`` in the server now."""
        account = self._accounts.get(key)
        return 0 if account is None else account.in_flight

    def _refilled(self, key: str, now: float) -> _Account:
        account = self._accounts.get(key)
        if account is None:
            if len(self._accounts) >= _MAX_ACCOUNTS:
                self._forget_idle(now)
            account = self._accounts[key] = _Account(self.budget.burst_s, now)
            return account
        rate = self.budget.busy_s
        if rate > 0:
            earned = (now - account.updated) * rate
            account.balance = min(self.budget.burst_s, account.balance + earned)
        account.updated = now
        return account

    def _forget_idle(self, now: float) -> None:
        """Drop accounts with nothing in flight that would be full by now (a fresh
        account starts full: forgetting them changes nothing)."""
        rate, burst = self.budget.busy_s, self.budget.burst_s
        for key, account in list(self._accounts.items()):
            full = rate <= 0 or account.balance + (now - account.updated) * rate >= burst
            if account.in_flight == 0 and full:
                del self._accounts[key]


def credential_key(headers: Headers) -> str | None:
    """Whose account a request is charged to: a hash of its credential, if it has one."""
    credential = headers.get("authorization") or headers.get("cookie")
    if not credential:
        return None
    return hashlib.sha256(credential.encode("utf-8", "surrogateescape")).hexdigest()


class TokenBudgetGuard:
    """Pure ASGI middleware applying a :class:`TokenBudget` to every credentialed request."""

    def __init__(self, app: ASGIApp, *, budget: TokenBudget) -> None:
        self.app = app
        self.accounts = TokenAccounts(budget)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.accounts.budget.enabled
            or scope.get("path") in _EXEMPT_PATHS
        ):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        key = credential_key(headers)
        if key is None:
            await self.app(scope, receive, send)
            return
        commit = scope.get("method") == "POST" and bool(
            PRIORITY_WRITES.match(str(scope.get("path", "")))
        )
        admitted = self.accounts.admit(key, time_exempt=commit)
        if isinstance(admitted, Refusal):
            # The answer waits (a coroutine, no thread): a client that ignores Retry-After
            # and asks again at once gets at most one refusal per connection per
            # REFUSAL_DELAY_S, not thousands that each cost the server a request's parsing.
            delay = min(admitted.retry_after_s, REFUSAL_DELAY_S)
            await anyio.sleep(delay)
            may_have_body = "content-length" in headers or "transfer-encoding" in headers
            await _too_many(send, admitted, waited_s=delay, close=may_have_body)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.accounts.release(key, admitted)


async def _too_many(send: Send, refused: Refusal, *, waited_s: float, close: bool) -> None:
    body = json.dumps({"detail": refused.detail}).encode()
    retry_after = max(0, refused.retry_after_s - math.ceil(waited_s))  # the wait counts
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after).encode()),
    ]
    if close:  # the body stays unread: end the connection rather than drain it
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
