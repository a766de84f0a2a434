"""The fast loader's tests share one token dataset, written once per module
(:func:`tests.fixtures.loader_data.tokens_dir`)."""

from tests.fixtures.loader_data import tokens_dir

__all__ = ["tokens_dir"]
