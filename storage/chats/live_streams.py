"""Which STREAMING replies are being written right now, by some live process.

A reply's row is STREAMING while its text streams (``app/session/recorder.py``), and a row
a crash or a kill left STREAMING is marked stopped when a store is next opened
(``ChatStore.mark_interrupted_streams``). Without a way to tell the two apart, a second
``branchwise chat`` marked a reply another process was still streaming as stopped, then
answered under its half-written text.

So the process that writes a STREAMING row holds an exclusive lock on
``<database>-streams/<message id>.lock`` (``flock``; ``msvcrt.locking`` on Windows) from
inside the transaction that made the row STREAMING until the one that ends it. The
operating system drops the lock when the process dies, however it dies, so a row whose
lock can be taken is an interrupted one. Locks are best-effort: a folder that cannot be
written (a full disk) only means the row is not claimed, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

STREAMS_SUFFIX = "-streams"
"""The lock folder of ``chats.sqlite3`` is ``chats.sqlite3-streams`` beside it."""


def _try_lock(f: BinaryIO) -> bool:
    """Take an exclusive lock on ``f`` without waiting; False when another holder has it."""
    try:
        if sys.platform == "win32":
            import msvcrt

            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError on POSIX, PermissionError on Windows: held elsewhere
        return False
    return True


def _unlock(f: BinaryIO) -> None:
    with contextlib.suppress(OSError):
        if sys.platform == "win32":
            import msvcrt

            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class LiveStreams:
    """The stream locks of one chat database at ``db_path`` (see the module docstring).

    ``claim`` and ``release`` are called by ``ChatStore`` inside and after the transaction
    that starts and ends a STREAMING row; ``is_live`` tells whether any holder (this store,
    another store, another process) has a row's lock. None of them raises.
    """

    def __init__(self, db_path: Path) -> None:
        self.folder = Path(db_path).with_name(Path(db_path).name + STREAMS_SUFFIX)
        self._held: dict[int, BinaryIO] = {}

    def _file(self, message_id: int) -> Path:
        return self.folder / f"{int(message_id)}.lock"

    def _foreign(self) -> bool:
        """True when the lock folder is a symbolic link: files there are not ours to
        create or delete (the data folder's own rule, storage/paths.py)."""
        return self.folder.is_symlink()

    def claim(self, message_id: int) -> None:
        """Hold the lock of ``message_id`` until ``release`` (or this process ends)."""
        if message_id in self._held:
            return
        if self._foreign():
            log.warning("reply %d streams without a lock: %s is a symbolic link, not Branchwise's folder",
                        message_id, self.folder)
            return
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            f = open(self._file(message_id), "a+b")  # noqa: SIM115 - held until release
        except OSError as exc:
            log.warning("reply %d streams without a lock (another branchwise may mark it stopped): %s",
                        message_id, exc)
            return
        if _try_lock(f):
            self._held[message_id] = f
        else:
            f.close()

    def release(self, message_id: int) -> None:
        """Drop the lock of ``message_id`` (nothing when it is not held here) and its file."""
        f = self._held.pop(message_id, None)
        if f is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self._file(message_id))
        _unlock(f)
        f.close()

    def is_live(self, message_id: int) -> bool:
        """True when some holder has ``message_id``'s lock: its reply is being written now."""
        if message_id in self._held:
            return True
        try:
            f = open(self._file(message_id), "rb")  # noqa: SIM115
        except OSError:  # no file: nobody claimed it (or it was released)
            return False
        with f:
            if not _try_lock(f):
                return True
            _unlock(f)
        return False

    def forget(self, message_id: int) -> None:
        """Remove the lock file an interrupted (dead) reply left, if any."""
        if message_id not in self._held and not self._foreign():
            with contextlib.suppress(OSError):
                os.unlink(self._file(message_id))

    def close(self) -> None:
        """Release every lock this store holds."""
        for message_id in list(self._held):
            self.release(message_id)
