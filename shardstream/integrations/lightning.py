"""PyTorch Lightning: see :mod:`shardstream.client.integrations.lightning`."""

from shardstream.client.integrations.lightning import *  # noqa: F403
from shardstream.client.integrations.lightning import __all__  # noqa: F401
