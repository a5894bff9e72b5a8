"""Whether the window is closing: ``Lifetime``, shared by the flows.

A callback that arrives late (a deferred count, an engine answer, a finished import)
checks ``closed`` before it draws or writes anything."""

from __future__ import annotations


class Lifetime:
    """``closed`` turns True once, when the window starts to shut down (``close()``)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True
