# SPDX-License-Identifier: Apache-2.0
"""io.regen.Device.Watch (libregen's watch.c): generation changes as they
happen, on a connection of their own."""

from types import TracebackType
from typing import Iterator, Optional, Type

from . import errors
from ._parts import JSON, ClientPart
from .varlink import Connection

__all__ = ["Watch", "WatchCalls"]


class Watch(Iterator[JSON]):
    """Generation changes as they happen, on a connection of its own.  The
    first event is the current state of each device (reason "subscribed");
    iterate, or call ``next(timeout)``.  Close it (or use ``with``) when done."""

    def __init__(self, socket_path: str, timeout: Optional[float] = None) -> None:
        self._conn = Connection(socket_path, timeout=timeout)
        self._conn.send("io.regen.Device.Watch", more=True)
        self._done = False

    def next(self, timeout: Optional[float] = None) -> JSON:
        """The next event (a dict: epoch, device, generation, state, reason).
        Raises TimeoutError after ``timeout`` seconds (the watch stays open),
        StopIteration when regend ends the stream, ConnectionReset if it broke."""
        if self._done:
            raise StopIteration
        self._conn.settimeout(timeout)
        try:
            params, continues = self._conn.receive()
        except errors.Error:
            # An error reply ends the call (LimitExceeded, Draining): the
            # next next() is StopIteration, not a wait for ever.
            self._done = True
            raise
        if not continues:
            self._done = True
        return params

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> JSON:
        if self._done:
            raise StopIteration
        return self.next()

    def close(self) -> None:
        self._done = True
        self._conn.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()


class WatchCalls(ClientPart):
    """The watch part of :class:`regen.Client`."""

    def watch(self, timeout: Optional[float] = None) -> Watch:
        """A :class:`Watch` on its own connection, subscribed when this returns."""
        return Watch(self.socket_path, timeout=timeout)
