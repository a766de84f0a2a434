"""The dataset methods of :class:`~shardstream.api_client.APIClient`."""

from __future__ import annotations

from collections.abc import Iterator

from shardstream.errors import ConflictError, NotFoundError
from shardstream.wire import DatasetCreate, DatasetPublic

from ._session import APISession, json_body


class DatasetsAPI(APISession):
    """Create, read, list and delete datasets."""

    def create_dataset(self, name: str, *, description: str = "") -> DatasetPublic:
        """Create a dataset (ConflictError if it exists); the server records the calling
        token's name as its owner."""
        body = DatasetCreate(name=name, description=description)
        return self._model(
            DatasetPublic, self.request("POST", "/v1/datasets", json=json_body(body))
        )

    def get_dataset(self, name: str) -> DatasetPublic:
        """One dataset."""
        return self._model(DatasetPublic, self.request("GET", f"/v1/datasets/{name}"))

    def ensure_dataset(self, name: str, *, description: str = "") -> DatasetPublic:
        """The dataset ``name``, created if missing (safe against a concurrent creator)."""
        try:
            return self.get_dataset(name)
        except NotFoundError:
            pass
        try:
            return self.create_dataset(name, description=description)
        except ConflictError:
            return self.get_dataset(name)

    def list_datasets(self, *, page_size: int = 100) -> Iterator[DatasetPublic]:
        """Every dataset the token may read, fetched a page at a time."""
        return self._pages("/v1/datasets", DatasetPublic, limit=page_size)

    def delete_dataset(self, name: str, *, force: bool = False) -> None:
        """Delete a dataset's metadata (ConflictError while a running run reads it)."""
        self.request("DELETE", f"/v1/datasets/{name}", params={"force": str(force).lower()})
