"""Every backend declares what it can do (``ObjectStore.capabilities``); nobody probes."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardstream.storage as storage
from shardstream.errors import StorageError
from shardstream.storage import (
    HTTPStore,
    LocalStore,
    ObjectStore,
    S3Store,
    StorageOptions,
    StoreCapabilities,
)

REPO = Path(__file__).resolve().parents[2]


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_backend_declares_its_capabilities() -> None:
    concrete = [c for c in _subclasses(ObjectStore) if not inspect.isabstract(c)]
    assert {LocalStore, S3Store, HTTPStore} <= set(concrete)
    for cls in concrete:
        assert "capabilities" in vars(cls), f"{cls.__name__} does not declare capabilities"


def test_a_store_without_capabilities_cannot_be_built() -> None:
    class Undeclared(ObjectStore):
        pass

    with pytest.raises(TypeError, match="capabilities"):
        Undeclared()  # type: ignore[abstract]


def test_local_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    caps = store.capabilities
    assert caps == StoreCapabilities(local_root=tmp_path)
    assert caps.local and not caps.presigns
    assert caps.max_connections == 0 and caps.connection_limit is None
    with pytest.raises(StorageError, match="cannot presign"):
        store.presign_get("a.bin")


@pytest.mark.parametrize(("cls", "presigns"), [(S3Store, True), (HTTPStore, False)])
def test_remote_stores(cls: type[ObjectStore], presigns: bool) -> None:
    options = StorageOptions(max_connections=7, region="us-east-1")
    store = (
        S3Store("bucket", options=options)
        if cls is S3Store
        else HTTPStore(lambda keys: {}, options=options)
    )
    caps = store.capabilities
    assert not caps.local and caps.local_root is None
    assert caps.presigns is presigns
    assert caps.max_connections == 7
    assert caps.connection_limit is not None
    assert caps.connection_limit() == store.limit.limit  # type: ignore[attr-defined]


def test_nobody_probes_a_store() -> None:
    """No module outside shardstream/storage asks a store's type or attributes: it asks
    ``store.capabilities``."""
    backends = {"LocalStore", "S3Store", "HTTPStore", "RemoteStore"}
    offenders = []
    files = {
        p.resolve()
        for f in ("client", "server", "shard_builder", "shardstream")
        for p in (REPO / f).rglob("*.py")
    }
    for path in sorted(files):
        if "storage" in path.relative_to(REPO).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            args = node.args
            if node.func.id == "isinstance" and len(args) == 2:
                names = {n.id for n in ast.walk(args[1]) if isinstance(n, ast.Name)}
                if names & backends:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if node.func.id in ("getattr", "hasattr") and args:
                target = ast.unparse(args[0])
                if "store" in target.lower():
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"probing a store's type or attributes: {offenders}"


def test_exported() -> None:
    assert storage.StoreCapabilities is StoreCapabilities
