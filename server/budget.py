"""A per-token request budget: one token cannot take a server process for itself.

A server process is one event loop and a thread pool sharing one GIL: a single read
token sending expensive requests back to back (``index.json`` of a large version costs
about 245 ms of CPU) on many connections took the whole process, and every other
caller's latency rose about tenfold (a flood of cheap requests on many connections did
the same). :class:`TokenBudgetGuard` (pure ASGI, in front of the body guard) keeps an
account per caller, per process:

* **in flight**: at most ``concurrency`` requests of one caller at once
  (``SHARDSTREAM_TOKEN_CONCURRENCY``);
* **server time**: each request is charged its share of the process while it was in
  the server (see :class:`TokenAccounts`) plus :data:`REQUEST_S` for the work no clock
  in the application sees (reading and parsing the request, writing the answer), whatever
  its answer: refused (401, 403, 404, 429) and cached answers pay too. The account
  refills at ``busy_s`` seconds per second (``SHARDSTREAM_TOKEN_BUSY_S``: the share of
  the process a caller may keep, 0.5 is half) up to ``burst_s`` seconds
  (``SHARDSTREAM_TOKEN_BURST_S``). A caller in debt is refused while another caller has
  been served within :data:`SHARED_WINDOW_S`, until its debt is repaid; alone, it may
  keep :data:`DEBT_IN_FLIGHT` requests in flight, since refusing it then would only leave
  the server idle.

Whose account: the authenticated principal (``token:<id>``, or ``admin``), found by the
same cached authentication the routes use (the answer is remembered on the request, so it
costs no second lookup). However a credential is spelled (``bearer``, ``BEARER``, extra
spaces) and whichever console session carries it, one token has one account. A request
that does not authenticate (no credential, an unknown or revoked token, a junk or ended
console cookie) is charged to its client address, and so is every sign-in before its
token is known; the sign-in route then charges the token itself (:data:`SIGN_IN_S` each,
see :meth:`TokenAccounts.charge`): a session is a row that lives for hours, so a token or
an address in debt opens none, alone or not. Health checks and ``/metrics`` are answered
ahead of this guard (see :mod:`.health_gate`); ``/metrics`` is not counted.

Refusals are ``429`` with ``Retry-After`` (whole seconds) and a message naming the
setting, sent after a wait of up to :data:`REFUSAL_DELAY_S` (which ``Retry-After`` then
counts), so a client that ignores ``Retry-After`` cannot make the server parse thousands
of refused requests per connection; the SDK waits and retries them. Checkpoint commits
pay like every request: a token's commits are refused only when that token is itself in
debt (see :mod:`.priority` for which commits go ahead of reads). Accounts that are full
and idle are dropped, so their number stays bounded.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from sqlalchemy import exc as sa_exc
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from shardstream.errors import APIError
from shardstream.server.auth import Principal
from shardstream.server.limits import SIGN_IN_PATH

_MAX_ACCOUNTS = 10_000
_EXEMPT_PATHS = frozenset({"/metrics"})  # a scraper's load is bounded by its interval
IN_BUDGET = "shardstream.in_budget"
"""Scope key: whether the request's caller had credit left when it was admitted (what
:mod:`.priority` asks before letting a commit go ahead of reads)."""


@dataclass(frozen=True)
class TokenBudget:
    """How much of a server process one caller may use (0 turns a bound off)."""

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
"""Requests a caller in debt may keep in flight while no other caller is being served."""

REQUEST_S = 0.002
"""Server time every request is charged on top of its measured share (refusals too): the
HTTP parsing and socket work around the application, which no clock inside it sees. A
flood of cheap or refused requests (3,289 refused commits in 15 s) costs its sender."""

SIGN_IN_S = 0.25
"""Server time a console sign-in is charged (to the client address, then to the token):
at the default budget a burst of 40 sign-ins, then 2 a second."""

SHARED_WINDOW_S = 1.0
"""A caller in debt shares the server with another caller admitted or finished within
this many seconds: a request of another caller is in the server only for milliseconds of
each second even while it waits behind a flood, so "in flight now" alone would almost
never see it."""


@dataclass
class _Account:
    balance: float  # seconds of server time the caller may still use (negative: debt)
    updated: float  # monotonic time of the last refill
    in_flight: int = 0


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused and when to come back."""

    retry_after_s: int
    detail: str


@dataclass(frozen=True)
class Ticket:
    """An admitted request: the server's shared clock when it came in, and whether its
    caller had credit left."""

    started: float
    in_budget: bool = True


class TokenAccounts:
    """The accounts of one process (the policy, apart from ASGI; ``clock`` for tests).

    Server time is shared: while ``N`` requests are in the server, each gets ``1/N`` of
    it, so a request is charged the integral of ``1/N`` over its stay (a shared clock that
    advances at ``1/N`` seconds per second, as in processor-sharing schedulers). A caller
    alone is charged 1 s per second however many requests it sends at once, and the
    charges of all callers add up to the time the server was busy: what a caller pays is
    its share of the process, not its requests' waiting behind each other.
    """

    def __init__(self, budget: TokenBudget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.clock = clock
        self._accounts: dict[str, _Account] = {}
        self._in_flight = 0  # requests of every caller in the server now
        self._shared = 0.0  # the shared clock (seconds of one request's share)
        self._shared_at = clock()
        # The two callers seen last (admitted or finished), most recent first, with when.
        self._recent: list[tuple[str, float]] = []

    def admit(self, key: str, *, cost_s: float = 0.0, strict: bool = False) -> Refusal | Ticket:
        """Count a request of ``key`` in (its ticket), or say why not (then only
        :data:`REQUEST_S` is charged). ``cost_s`` is charged at once on admission;
        ``strict`` refuses a caller in debt even when it is alone in the server."""
        now = self.clock()
        account = self._refilled(key, now)
        budget = self.budget
        if budget.concurrency > 0 and account.in_flight >= budget.concurrency:
            self._charge(account, REQUEST_S)
            return Refusal(
                1,
                f"this token has {account.in_flight} requests in the server already, its "
                f"limit per server process (SHARDSTREAM_TOKEN_CONCURRENCY); retry after one "
                "finishes",
            )
        if budget.busy_s > 0 and account.balance <= 0:
            # In debt. Alone in the process, the caller may go on with a few requests at a
            # time (refusing it would only leave the server idle); beside other callers it
            # waits until its debt is repaid.
            shared = self._in_flight > account.in_flight or self._others_recent(key, now)
            if strict or shared or account.in_flight >= DEBT_IN_FLIGHT:
                self._charge(account, REQUEST_S)
                wait = max(1, math.ceil(-account.balance / budget.busy_s))
                return Refusal(
                    wait,
                    f"this token used its share of the server's time ({budget.busy_s:g} s "
                    f"per second, bursts up to {budget.burst_s:g} s: SHARDSTREAM_TOKEN_BUSY_S,"
                    f" SHARDSTREAM_TOKEN_BURST_S); retry in {wait} s",
                )
        in_budget = budget.busy_s <= 0 or account.balance > 0
        self._charge(account, cost_s)
        self._advance(now)
        self._seen(key, now)
        account.in_flight += 1
        self._in_flight += 1
        return Ticket(self._shared, in_budget)

    def release(self, key: str, ticket: Ticket) -> None:
        """A request of ``key`` admitted with ``ticket`` ended: charge its share."""
        now = self.clock()
        account = self._refilled(key, now)
        self._advance(now)
        self._seen(key, now)
        if account.in_flight > 0:
            account.in_flight -= 1
            self._in_flight -= 1
        self._charge(account, REQUEST_S + self._shared - ticket.started)

    def charge(self, key: str, cost_s: float) -> Refusal | None:
        """Charge ``key`` for work done outside a request of its own (a sign-in, charged
        to the token it signed in with): refused, charging nothing, when it is in debt."""
        admitted = self.admit(key, cost_s=cost_s, strict=True)
        if isinstance(admitted, Refusal):
            return admitted
        account = self._accounts[key]
        account.in_flight -= 1
        self._in_flight -= 1
        return None

    def _charge(self, account: _Account, seconds: float) -> None:
        if self.budget.busy_s > 0:
            account.balance -= seconds

    def _seen(self, key: str, now: float) -> None:
        recent = [(key, now)] + [(k, t) for k, t in self._recent if k != key]
        self._recent = recent[:2]

    def _others_recent(self, key: str, now: float) -> bool:
        return any(k != key and now - t <= SHARED_WINDOW_S for k, t in self._recent)

    def _advance(self, now: float) -> None:
        if self._in_flight > 0:
            self._shared += (now - self._shared_at) / self._in_flight
        self._shared_at = now

    def in_flight(self, key: str) -> int:
        """Requests of ``key`` in the server now."""
        account = self._accounts.get(key)
        return 0 if account is None else account.in_flight

    def balance(self, key: str) -> float:
        """Seconds of server time ``key`` may still use now (negative: its debt)."""
        return self._refilled(key, self.clock()).balance

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
        """Make room for new accounts: drop those with nothing in flight that would be
        full by now (a fresh account starts full: forgetting them changes nothing); if
        that frees less than a tenth, also the idle ones nearest to full (forgiving the
        least debt), so the next thousand new callers cost no scan."""
        rate, burst = self.budget.busy_s, self.budget.burst_s

        def due(account: _Account) -> float:
            return account.balance + (now - account.updated) * rate if rate > 0 else burst

        idle = [(due(a), key) for key, a in self._accounts.items() if a.in_flight == 0]
        room = max(1, _MAX_ACCOUNTS // 10)
        idle.sort(reverse=True)  # the fullest first: full ones, then the nearest to full
        full = sum(1 for balance, _ in idle if balance >= burst)
        for _, key in idle[: max(room, full)]:
            del self._accounts[key]


def principal_key(principal: Principal) -> str:
    """The account of an authenticated caller."""
    return f"principal:{principal.principal_id}"


def address_key(scope: Scope) -> str:
    """The account of a caller not (yet) authenticated: its client address."""
    client = scope.get("client")
    return f"address:{client[0] if client else 'unknown'}"


Authenticate = Callable[[Request], Awaitable[Principal]]


class TokenBudgetGuard:
    """Pure ASGI middleware applying the budget of ``accounts`` to every request.

    ``authenticate`` is the routes' own (cached, remembered on the request): the caller
    is known before the request is admitted, so every spelling of a token and every
    console session it opened share its account.
    """

    def __init__(
        self, app: ASGIApp, *, accounts: TokenAccounts, authenticate: Authenticate
    ) -> None:
        self.app = app
        self.accounts = accounts
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.accounts.budget.enabled
            or scope.get("path") in _EXEMPT_PATHS
        ):
            await self.app(scope, receive, send)
            return
        sign_in = scope.get("method") == "POST" and scope.get("path") == SIGN_IN_PATH
        key = address_key(scope) if sign_in else await self._account_of(scope)
        admitted = self.accounts.admit(key, cost_s=SIGN_IN_S if sign_in else 0.0, strict=sign_in)
        if isinstance(admitted, Refusal):
            # The answer waits (a coroutine, no thread): a client that ignores Retry-After
            # and asks again at once gets at most one refusal per connection per
            # REFUSAL_DELAY_S, not thousands that each cost the server a request's parsing.
            delay = min(admitted.retry_after_s, REFUSAL_DELAY_S)
            await anyio.sleep(delay)
            headers = Headers(scope=scope)
            may_have_body = "content-length" in headers or "transfer-encoding" in headers
            await too_many(send, admitted, waited_s=delay, close=may_have_body)
            return
        scope[IN_BUDGET] = admitted.in_budget
        try:
            await self.app(scope, receive, send)
        finally:
            self.accounts.release(key, admitted)

    async def _account_of(self, scope: Scope) -> str:
        try:
            principal = await self.authenticate(Request(scope))
        except (APIError, sa_exc.SQLAlchemyError):
            # Not authenticated: its answer (401, 503) comes from the routes or the body
            # guard, which see the same remembered failure; the address pays for it.
            return address_key(scope)
        return principal_key(principal)


async def too_many(send: Send, refused: Refusal, *, waited_s: float, close: bool) -> None:
    """Answer 429 for ``refused`` (after ``waited_s``, which ``Retry-After`` counts)."""
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
