"""``accelerate``: see :mod:`shardstream.client.integrations.hf_accelerate`."""

from shardstream.client.integrations.hf_accelerate import *  # noqa: F403
from shardstream.client.integrations.hf_accelerate import __all__  # noqa: F401
