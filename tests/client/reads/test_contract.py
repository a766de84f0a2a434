"""The read layer's surface: the package exports the batch stream's contract, each module
exports only what it defines, and the parts share no public mutable state."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import shardstream.client.reads as reads
from shardstream.client.reads.read_state import SharedReads


def test_the_package_exports_the_contract() -> None:
    assert reads.__all__ == ["BlockStats", "ReadPass", "ShardReads"]
    for name in reads.__all__:
        assert getattr(reads, name).__doc__


def test_each_module_exports_only_what_it_defines() -> None:
    """One home per name: a class or function is exported by the module that defines it
    (``partial`` re-exported ``BlockStats`` and ``NodeSharing`` before)."""
    borrowed = []
    for info in pkgutil.iter_modules(reads.__path__, f"{reads.__name__}."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            defined = inspect.isclass(value) or inspect.isfunction(value)
            if defined and value.__module__ != module.__name__:
                borrowed.append(f"{info.name}.{name} (from {value.__module__})")
    assert borrowed == []


def test_the_shared_state_has_no_public_dicts_or_lock() -> None:
    """What the parts share changes through named transitions: no public dict any part
    writes, and no lock the parts take."""
    public = {f.name: f for f in dataclasses.fields(SharedReads) if not f.name.startswith("_")}
    assert "lock" not in public
    mutable = [
        name
        for name, f in public.items()
        if isinstance(f.type, str) and (f.type.startswith("dict") or "Event" in f.type)
    ]
    assert mutable == []
