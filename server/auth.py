"""Bearer-token authentication and scope checks.

Secrets are ``ss_`` + 43 URL-safe random characters (256 bits), so a plain sha256 of the
secret is a safe stored form (no salt or slow hash needed against guessing). The bootstrap
admin secret from ``SHARDSTREAM_ADMIN_TOKEN`` is never stored; requests carrying it are
compared by hash in constant time.

Least privilege: a caller's :class:`Principal` decides what it may mint
(:meth:`Principal.require_can_mint`: a subset of its own scopes, datasets and lifetime),
which tokens it may see and revoke (:meth:`Principal.within_rights`), and it is the owner
recorded on the runs it creates (:attr:`Principal.principal_id`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from shardstream.errors import AuthenticationError, PermissionDeniedError
from shardstream.server.models import TokenRow
from shardstream.wire import Scope

_RANK = {Scope.read: 0, Scope.write: 1, Scope.admin: 2}
SECRET_PREFIX = "ss_"
BOOTSTRAP_PRINCIPAL = "admin"  # the principal of the SHARDSTREAM_ADMIN_TOKEN secret
PRINCIPAL = "shardstream.principal"
"""ASGI scope key of the authenticated caller (set by ``api.deps.authenticate``, read by
the middleware that needs to know who is calling)."""


def new_secret() -> str:
    """A fresh high-entropy token secret."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The stored form of a secret (sha256 hex)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's name, its best scope and its dataset allow-list."""

    name: str
    scope: Scope
    datasets: frozenset[str] | None = None  # None: every dataset
    token_id: int | None = None  # None: the bootstrap admin secret
    expires_at: datetime | None = None

    def has(self, scope: Scope) -> bool:
        """Whether this token's scope includes ``scope``."""
        return _RANK[self.scope] >= _RANK[scope]

    def require(self, scope: Scope) -> None:
        """Raise 403 unless this token's scope includes ``scope``."""
        if _RANK[self.scope] < _RANK[scope]:
            raise PermissionDeniedError(
                f"token {self.name!r} has scope {self.scope.value!r}; this request needs "
                f"{scope.value!r}",
                403,
            )

    def can_see(self, dataset: str) -> bool:
        """Whether the allow-list admits ``dataset``."""
        return self.datasets is None or dataset in self.datasets

    def require_dataset(self, dataset: str) -> None:
        """Raise 403 if ``dataset`` is outside this token's allow-list."""
        if not self.can_see(dataset):
            raise PermissionDeniedError(
                f"token {self.name!r} is not allowed to access dataset {dataset!r}", 403
            )

    @property
    def principal_id(self) -> str:
        """The stable identity that owns what this caller creates (runs).

        ``token:<id>`` for a stored token (names are not unique, ids are), ``admin`` for
        the bootstrap admin secret, which is its own principal.
        """
        return f"token:{self.token_id}" if self.token_id is not None else BOOTSTRAP_PRINCIPAL

    def covers(self, datasets: Iterable[str]) -> bool:
        """Whether the allow-list admits every one of ``datasets``."""
        return self.datasets is None or all(d in self.datasets for d in datasets)

    def is_admin_over(self, datasets: Iterable[str]) -> bool:
        """Whether this is an admin whose rights cover all of ``datasets``."""
        return _RANK[self.scope] >= _RANK[Scope.admin] and self.covers(datasets)

    def within_rights(self, scopes: Iterable[Scope], datasets: Iterable[str] | None) -> bool:
        """Whether a token with ``scopes`` and ``datasets`` (None: all) reaches nothing
        this caller cannot: the tokens a restricted admin may see and revoke."""
        if any(_RANK[s] > _RANK[self.scope] for s in scopes):
            return False
        if self.datasets is None:
            return True
        return datasets is not None and all(d in self.datasets for d in datasets)

    def require_can_mint(
        self, scopes: Iterable[Scope], datasets: list[str] | None, expires_at: datetime | None
    ) -> None:
        """Raise 403 unless a token with these rights is a subset of this caller's own:
        scopes it holds (admin ⊇ write ⊇ read), datasets within its allow-list (a
        restricted caller must restrict), an expiry no later than its own."""
        above = sorted(s.value for s in scopes if _RANK[s] > _RANK[self.scope])
        if above:
            raise PermissionDeniedError(
                f"token {self.name!r} has scope {self.scope.value!r} and cannot mint a token "
                f"with scope {above[0]!r}",
                403,
            )
        if self.datasets is not None:
            if datasets is None:
                raise PermissionDeniedError(
                    f"token {self.name!r} is restricted to datasets "
                    f"{sorted(self.datasets)}; the new token must be restricted to a subset "
                    "of them (set 'datasets')",
                    403,
                )
            outside = sorted(set(datasets) - self.datasets)
            if outside:
                raise PermissionDeniedError(
                    f"token {self.name!r} is not allowed to access dataset {outside[0]!r}, so "
                    "it cannot mint a token for it",
                    403,
                )
        if self.expires_at is not None and (expires_at is None or expires_at > self.expires_at):
            raise PermissionDeniedError(
                f"token {self.name!r} expires at {self.expires_at.isoformat()}; the new "
                "token's expires_at must be set and no later",
                403,
            )


# Whoever runs the server CLI against the database holds every right already.
OPERATOR = Principal(name="server operator (CLI)", scope=Scope.admin)
# Whoever presents SHARDSTREAM_ADMIN_TOKEN (a bearer header, or a console session it opened).
BOOTSTRAP_ADMIN = Principal(name="admin (SHARDSTREAM_ADMIN_TOKEN)", scope=Scope.admin)


def best_scope(scopes: str) -> Scope:
    """The highest scope in a comma-separated scope list."""
    found = [Scope(s) for s in scopes.split(",") if s]
    return max(found, key=lambda s: _RANK[s]) if found else Scope.read


def bearer_secret(header: str | None) -> str:
    """Extract the secret from an ``Authorization: Bearer ...`` header, or raise 401."""
    if not header:
        raise AuthenticationError(
            "missing token: send 'Authorization: Bearer <token>' (set SHARDSTREAM_TOKEN)", 401
        )
    kind, _, secret = header.partition(" ")
    if kind.lower() != "bearer" or not secret.strip():
        raise AuthenticationError("the Authorization header must be 'Bearer <token>'", 401)
    return secret.strip()


def matches_admin_secret(secret: str, admin_secret: str | None) -> bool:
    """Constant-time comparison with the bootstrap admin secret."""
    if not admin_secret:
        return False
    return hmac.compare_digest(hash_secret(secret), hash_secret(admin_secret))


class UnknownTokenError(AuthenticationError):
    """401 for a secret no token has: the console words it for a browser user."""


def principal_for(row: TokenRow | None, now: datetime) -> Principal:
    """Turn a looked-up token row into a Principal, or raise 401."""
    if row is None:
        raise UnknownTokenError("unknown token: check SHARDSTREAM_TOKEN", 401)
    if row.revoked_at is not None:
        raise AuthenticationError(f"token {row.name!r} was revoked", 401)
    if row.expires_at is not None and row.expires_at <= now:
        raise AuthenticationError(f"token {row.name!r} expired at {row.expires_at}", 401)
    datasets = frozenset(row.datasets) if row.datasets is not None else None
    return Principal(
        name=row.name,
        scope=best_scope(row.scopes),
        datasets=datasets,
        token_id=row.id,
        expires_at=row.expires_at,
    )


class TokenCache:
    """Recently authenticated tokens, by secret hash, for ``ttl_s`` seconds.

    Saves a database round trip on every request of a busy client. A revocation through
    this process takes effect at once (:meth:`forget`); through another replica, within
    ``ttl_s`` (``SHARDSTREAM_TOKEN_CACHE_S``; 0 disables the cache).
    """

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._items: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def get(self, secret_hash: str, now: datetime) -> Principal | None:
        """The cached principal, unless stale or expired."""
        if self._ttl <= 0:
            return None
        with self._lock:
            hit = self._items.get(secret_hash)
        if hit is None or time.monotonic() - hit[1] > self._ttl:
            return None
        principal = hit[0]
        if principal.expires_at is not None and principal.expires_at <= now:
            return None
        return principal

    def put(self, secret_hash: str, principal: Principal) -> None:
        """Remember a successful authentication."""
        if self._ttl <= 0:
            return
        with self._lock:
            if len(self._items) >= self._max:
                self._items.clear()  # crude but bounded; refills on the next requests
            self._items[secret_hash] = (principal, time.monotonic())

    def forget(self, token_id: int) -> None:
        """Drop a token (after revoking it)."""
        with self._lock:
            for key in [k for k, (p, _) in self._items.items() if p.token_id == token_id]:
                del self._items[key]
