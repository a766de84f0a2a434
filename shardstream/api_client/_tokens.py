"""The token methods of :class:`~shardstream.api_client.APIClient` (all need an admin token)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from shardstream.wire import Scope, TokenCreate, TokenPublic

from ._session import APISession, json_body


class TokensAPI(APISession):
    """Create, list and revoke API tokens."""

    def create_token(
        self,
        name: str,
        scopes: Sequence[Scope | str],
        *,
        datasets: Sequence[str] | None = None,
    ) -> TokenPublic:
        """Create a token (admin); ``.secret`` is only in this response."""
        body = TokenCreate(
            name=name,
            scopes=[Scope(s) for s in scopes],
            datasets=list(datasets) if datasets is not None else None,
        )
        return self._model(TokenPublic, self.request("POST", "/v1/tokens", json=json_body(body)))

    def list_tokens(self, *, page_size: int = 100) -> Iterator[TokenPublic]:
        """Every token's metadata (admin)."""
        return self._pages("/v1/tokens", TokenPublic, limit=page_size)

    def revoke_token(self, token_id: int) -> TokenPublic:
        """Revoke a token (admin)."""
        return self._model(TokenPublic, self.request("DELETE", f"/v1/tokens/{token_id}"))
