"""Block states: where each block (or piece) of a shard file being filled is.

A :class:`~shardstream.client.reads.partial.PartialShard` tracks every block of its file,
and every 64 KiB piece of a piece table, as one :class:`BlockState`. They move only along
these edges, and :class:`BlockTable` is the only code that moves them::

    MISSING --request--> IN_FLIGHT --arrive--> PRESENT
       ^                     |                    |
       +------- lose --------+------- lose -------+   (a read failed, evicted, forgotten)

    MISSING / IN_FLIGHT --arrive--> PRESENT            (a whole read, a copy from a peer)

A block is ``PRESENT`` only once its bytes are in the file, checked against their digest
where the index has one.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import numpy.typing as npt

__all__ = ["BlockState", "BlockTable"]

I64 = npt.NDArray[np.int64]
Where = I64 | slice
"""Blocks by index array, or a slice of them."""


class BlockState(IntEnum):
    """The state of one block (or piece) of a shard file."""

    MISSING = 0
    """Neither in the file nor on the way."""
    IN_FLIGHT = 1
    """A read of it is queued or running."""
    PRESENT = 2
    """In the file (verified where the index has a digest for it)."""


# Plain ints for numpy: comparing an int8 array with an IntEnum member costs ~5x more.
_MISSING, _IN_FLIGHT, _PRESENT = (
    int(BlockState.MISSING),
    int(BlockState.IN_FLIGHT),
    int(BlockState.PRESENT),
)


class BlockTable:
    """The states of ``count`` blocks (or pieces), and their transitions.

    Holds no lock: its owner (a partial shard) calls it with its own condition held, and
    readers that only look may read without it (a state read alone is atomic).
    """

    def __init__(self, count: int) -> None:
        self._state = np.full(count, _MISSING, dtype=np.int8)

    def __len__(self) -> int:
        return len(self._state)

    # -- looking ------------------------------------------------------------------------

    def missing(self, where: Where = slice(None)) -> npt.NDArray[np.bool_]:
        """Which of ``where`` are :attr:`BlockState.MISSING`."""
        found: npt.NDArray[np.bool_] = self._state[where] == _MISSING
        return found

    def in_flight(self, where: Where = slice(None)) -> npt.NDArray[np.bool_]:
        """Which of ``where`` are :attr:`BlockState.IN_FLIGHT`."""
        found: npt.NDArray[np.bool_] = self._state[where] == _IN_FLIGHT
        return found

    def present(self, where: Where = slice(None)) -> npt.NDArray[np.bool_]:
        """Which of ``where`` are :attr:`BlockState.PRESENT`."""
        found: npt.NDArray[np.bool_] = self._state[where] == _PRESENT
        return found

    def all_present(self, where: Where = slice(None)) -> bool:
        """Whether every one of ``where`` is present."""
        return bool(self.present(where).all())

    def present_ids(self) -> I64:
        """The present blocks, in order."""
        return np.flatnonzero(self._state == _PRESENT).astype(np.int64)

    def state(self, block: int) -> BlockState:
        """The state of one block."""
        return BlockState(int(self._state[block]))

    # -- moving -------------------------------------------------------------------------

    def request(self, where: Where) -> None:
        """The missing ones of ``where`` are on their way (MISSING -> IN_FLIGHT)."""
        sel = np.arange(len(self._state))[where] if isinstance(where, slice) else where
        take = sel[self._state[sel] == _MISSING]
        self._state[take] = _IN_FLIGHT

    def arrive(self, where: Where) -> None:
        """``where`` are in the file now (-> PRESENT)."""
        self._state[where] = _PRESENT

    def lose(self, where: Where) -> None:
        """``where`` are not in the file (-> MISSING): a read failed, or they were evicted."""
        self._state[where] = _MISSING
