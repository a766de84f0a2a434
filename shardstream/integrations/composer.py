"""MosaicML Composer: see :mod:`shardstream.client.integrations.composer`."""

from shardstream.client.integrations.composer import *  # noqa: F403
from shardstream.client.integrations.composer import __all__  # noqa: F401
