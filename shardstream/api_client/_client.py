""":class:`APIClient`: the session plus every resource's methods, in one class."""

from __future__ import annotations

from typing import Any

from ._datasets import DatasetsAPI
from ._runs import RunsAPI
from ._tokens import TokensAPI
from ._versions import VersionsAPI


class APIClient(DatasetsAPI, VersionsAPI, RunsAPI, TokensAPI):
    """A thread-safe client of the shardstream server's ``/v1`` API."""

    def __enter__(self) -> APIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def healthz(self) -> bool:
        """Whether the server answers."""
        return self.request("GET", "/healthz").status_code == 200

    def whoami(self) -> dict[str, Any]:
        """The calling token's name, scope and dataset allow-list."""
        result: dict[str, Any] = self.request("GET", "/v1/whoami").json()
        return result
