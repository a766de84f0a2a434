"""Joining a Ray cluster for a build, and where Ray is imported.

Ray is an optional extra (``shardstream[ray]``): it is imported here, when a build asks for
it, never when ``shardstream`` or the builder is imported. :func:`ray_session` joins the
cluster named by ``--ray`` (``local``: a one-machine instance on loopback; ``auto``: the
cluster this machine belongs to; ``HOST:PORT`` or ``ray://HOST:PORT``: that cluster) and
leaves it afterwards; inside a program that already called ``ray.init`` it uses that
session and leaves it open.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from shardstream.errors import ConfigError
from shardstream.shard_builder.cluster import ray_auth

_INSTALL = "pip install 'shardstream[ray]'"
_LOOPBACK = "127.0.0.1"
_NO_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's "no cluster" setting, see below
# Settings the workers need to reach the same object store as the driver. A worker
# process gets the environment of its node's raylet, not the driver's.
_FORWARDED_PREFIXES = ("AWS_",)
_FORWARDED_NAMES = (
    "NO_PROXY",
    "no_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
)


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How a build uses Ray.

    ``address`` is ``"local"`` (start a Ray instance on this machine, bound to loopback,
    for trying it), ``"auto"`` (the cluster this machine is a node of), ``"HOST:PORT"`` or
    ``"ray://HOST:PORT"``. ``workers`` is the number of worker actors, one CPU each
    (default: every CPU of the cluster). ``forward_env`` passes the driver's ``AWS_*`` and
    proxy settings to the workers (they upload the shards), ``startup_timeout_s`` is how
    long to wait for the workers to be placed. ``retries`` is how many times a build that
    lost a worker or a node resumes by itself from its journal, on the nodes left, before
    it stops with the error: one loss spends one retry. Before each retry the build waits,
    at most ``node_loss_wait_s``, until Ray has declared dead every node of the attempt
    that no longer answers (Ray's health checks take ~30 s by default), so that no worker
    of the retry is placed on a lost node.

    Example::

        build_text_on_ray(TextBuildConfig(...), RayOptions(address="auto"))
    """

    address: str = "auto"
    workers: int | None = None
    forward_env: bool = True
    startup_timeout_s: float = 120.0
    retries: int = 2
    node_loss_wait_s: float = 90.0

    def __post_init__(self) -> None:
        if not self.address:
            raise ConfigError("--ray needs an address: local, auto, HOST:PORT or ray://HOST:PORT")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be at least 1, got {self.workers}")
        if self.retries < 0:
            raise ConfigError(f"retries must be 0 or more, got {self.retries}")
        if self.node_loss_wait_s < 0:
            raise ConfigError(f"node_loss_wait_s must be 0 or more, got {self.node_loss_wait_s}")


def import_ray() -> Any:
    """The ``ray`` module; :class:`ConfigError` with the install line when it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"building on Ray needs Ray installed on this machine ({exc}): {_INSTALL}"
        ) from exc
    return ray


def worker_env(forward: bool) -> dict[str, str]:
    """Environment variables for the worker actors."""
    env = {
        # One actor per CPU: HF tokenizers' own thread pool would only oversubscribe it.
        "TOKENIZERS_PARALLELISM": "false",
        "RAYON_NUM_THREADS": "1",
    }
    if forward:
        for name, value in os.environ.items():
            if name.startswith(_FORWARDED_PREFIXES) or name in _FORWARDED_NAMES:
                env[name] = value
    return env


def _is_host_port(address: str) -> bool:
    """``HOST:PORT`` (not ``auto``, not ``ray://``, which goes through Ray Client)."""
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and "://" not in address


def _loopback_host(address: str) -> str | None:
    host = address.removeprefix("ray://").rsplit(":", 1)[0]
    return host if host.startswith("127.") else None


@contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """Join the cluster for the block; yields the ``ray`` module."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray  # the caller's own session: theirs to end
        return
    kwargs: dict[str, Any] = {
        # For every task of the job, Ray Data's readers included (actors get it too).
        "runtime_env": {"env_vars": worker_env(options.forward_env)},
        "logging_level": logging.WARNING,
        "log_to_driver": False,  # worker output would break the progress bar
        "configure_logging": True,
    }
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with ExitStack() as session:
        if options.address == "local":
            session.enter_context(_loopback_only(ray))
            session.enter_context(ray_auth.environment(ray, ray_auth.local_settings()))
            kwargs.update(
                address="local",  # a new instance, even where `ray start` runs a cluster
                num_cpus=options.workers or os.cpu_count() or 1,
                include_dashboard=False,
                _node_ip_address=_LOOPBACK,
            )
        else:
            kwargs["address"] = options.address
            if _is_host_port(options.address):  # token authentication or not: as the cluster
                settings = ray_auth.join_settings(ray, options.address)
                session.enter_context(ray_auth.environment(ray, settings))
            loopback = _loopback_host(options.address)
            if loopback is not None:  # a cluster on this machine's loopback (tests, try-outs)
                kwargs["_node_ip_address"] = loopback
        try:
            ray.init(**kwargs)
        except ConnectionError as exc:
            raise ConfigError(
                f"cannot join the Ray cluster at {options.address!r} ({exc}); start one with "
                "'ray start --head', or pass --ray local to start one on this machine"
            ) from exc
        try:
            yield ray
        finally:
            ray.shutdown()


@contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """Every server of a ``--ray local`` instance bound to loopback, none on the network.

    Ray's GCS, raylets and autoscaler monitor listen on 127.0.0.1 only when the node's
    address is exactly ``127.0.0.1`` (on any other address, 127.0.0.2 included, on every
    interface); but Ray replaces a node address of 127.0.0.1 by the machine's interface
    address, unless its "no cluster" setting is on (what it does on macOS and Windows).
    Turned on for this process (Ray read it when imported) and, through the environment,
    for the processes Ray starts; restored afterwards.
    """
    constants = ray._private.ray_constants
    saved = (os.environ.get(_NO_CLUSTER_ENV), constants.ENABLE_RAY_CLUSTER)
    os.environ[_NO_CLUSTER_ENV] = "0"
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        _restore_env(_NO_CLUSTER_ENV, saved[0])
        constants.ENABLE_RAY_CLUSTER = saved[1]


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
