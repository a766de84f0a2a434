"""Hugging Face ``Trainer``: see :mod:`shardstream.client.integrations.hf_trainer`."""

from shardstream.client.integrations.hf_trainer import *  # noqa: F403
from shardstream.client.integrations.hf_trainer import __all__  # noqa: F401
