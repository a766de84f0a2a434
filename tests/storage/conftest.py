"""Storage test fixtures: the fault-injecting proxy (from tests/fixtures/faulty_proxy.py)."""

from tests.fixtures.faulty_proxy import faulty_proxy

__all__ = ["faulty_proxy"]
