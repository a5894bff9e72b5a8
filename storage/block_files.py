"""Block payloads as files beside the prefix store's SQLite index: one immutable file per
block, named by its key, in ``<store>-blocks/``.

Why files: a payload in a SQLite BLOB spans a chain of overflow pages, so reading it takes
a copy (SQLite page -> ``bytes``) before anything else can look at it. A file is mapped
(:meth:`BlockFiles.map`): the checksum runs over the page cache in place and the codec
copies the bytes once, straight into the state blob handed to llama.cpp.

The rules that keep the store consistent (``storage/prefix_store.py`` applies them):

* a file is written whole under a temporary name and renamed over its final name, so a
  reader sees either no file or a complete one (the content of a key never changes);
* a file is written *inside* the index transaction that inserts its row (the SQLite write
  lock is held), before the commit: a process killed at any moment leaves at worst a
  file without a row (an orphan) or a temporary file, and both are removed by
  :meth:`BlockFiles.reclaim` under the same lock at the next open;
* a row whose file is missing or damaged fails its checksum on read and is dropped, as a
  damaged BLOB was;
* deletion overwrites the file with zeros before unlinking it (:meth:`BlockFiles.scrub`),
  so a forgotten or evicted block leaves no bytes in the folder; with ``sync`` the zeros
  are forced to the disk first (``forget``), else they reach it with the next writeback.

No fsync on write: the store is disposable, and a power loss that tears a file is caught
by the checksum. Files are created 0600 and the folder 0700 (``storage/paths.py``).

A file is zeroed in place before it is unlinked, and another process may have it mapped,
between checking its checksum and copying it (a restore; a tester caught restores that
copied zeros this way). So a restore checks and copies under :meth:`BlockFiles.reading`, a
shared lock on ``<folder>.lock`` beside the folder, and zeroing takes it exclusively
(``flock``; where the platform has none, Windows, nothing is locked, and files are not
kept mapped there either).

Only Branchwise's own files are ever changed (issue 30). The folder may be a symbolic
link (a cache moved to another disk): it is followed. But only names of the block-file
pattern (:data:`storage.paths.BLOCK_NAME`) are opened, zeroed or removed; anything else
in the folder is left alone and logged once. A block file is opened without following
symbolic links (``O_NOFOLLOW``, relative to a descriptor of the folder where the
platform has ``dir_fd``): a link is unlinked, never written through, and a file that is
not a regular file of this user is skipped; one with other hard links is unlinked
without being zeroed (its bytes belong to the other name too).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from storage.paths import BLOCK_NAME, DIR_MODE, FILE_MODE

log = logging.getLogger(__name__)

_TMP = ".tmp"
_ZEROS = bytes(1 << 20)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the whole mapping in one go (Linux)
_BINARY = getattr(os, "O_BINARY", 0)  # Windows opens files in text mode otherwise
_datasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
_CACHE_MAPS = os.name == "posix"  # Windows cannot delete a file that is still mapped
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # Windows has none: lstat first (see _lstat)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_FD = bool(_DIRECTORY) and {os.open, os.stat, os.unlink} <= os.supports_dir_fd
_WILLNEED = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")
_UID = os.getuid() if hasattr(os, "getuid") else None
try:
    import fcntl as _fcntl  # flock: the scrub/restore lock (see the module notes)
except ImportError:  # Windows
    _fcntl = None
MAP_CACHE_BYTES = 256 * 1024**2
"""Most bytes of block files kept mapped between restores: the active conversation of a
context up to ~11,000 tokens of the default model. The pages are the page cache's (shared
and reclaimable, cached whether mapped or not), but system monitors count mapped pages in
the process's resident size, so the bound stays modest."""


class BlockFiles:
    """The payload files of one store: ``folder / key.hex()``.

    Args:
        folder: the directory (created 0700 on the first write).

    Errors: :meth:`write` raises OSError (a full disk is ENOSPC) after removing its
    temporary file; :meth:`map` returns None for a missing or unreadable file.
    """

    def __init__(self, folder: Path | str):
        self.folder = Path(folder)
        self._maps: OrderedDict[bytes, tuple[tuple[int, int, int], memoryview]] = OrderedDict()
        self._mapped = 0  # bytes in _maps
        self._warned = False  # a foreign entry in the folder was logged
        self._made = False  # the folder was made (or found) by a write of this object

    def path(self, key: bytes) -> Path:
        return self.folder / key.hex()

    def write(self, key: bytes, data) -> None:
        """Write ``data`` (a contiguous buffer) as the payload of ``key``: temporary file,
        then rename."""
        if not self._made:  # once, not a mkdir and a stat per block
            self.folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            self._made = True
        final = self.path(key)
        tmp = self.folder / f"{key.hex()}.{os.getpid()}{_TMP}"
        view = memoryview(data).cast("B")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY  # never through a link
        try:
            fd = os.open(tmp, flags, FILE_MODE)
        except FileNotFoundError:  # the folder went (a reset by another process): make it again
            self.folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(tmp, flags, FILE_MODE)
        except FileExistsError:  # left by a killed process of the same id (or planted): unlink it
            os.remove(tmp)
            fd = os.open(tmp, flags, FILE_MODE)
        try:
            try:
                while view:  # resumed after a short write
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    def map(self, key: bytes, cache: bool = True) -> memoryview | None:
        """A read-only view of the payload of ``key`` over the page cache (no copy), or
        None when the file is missing, empty or unreadable. The mapping lives as long as
        the view (or anything made from it).

        With ``cache`` (POSIX) the mapping is kept for the next call, up to
        :data:`MAP_CACHE_BYTES` in least-recently-used order, and reused while the file
        at the path is the same file (inode, size and mtime, one ``stat``): mapping 48 MB
        of block files and unmapping them took 11 ms of page-table work in a
        micro-benchmark on this project's machine. The bytes are still read, and checked, on every restore; a file that is
        scrubbed or replaced is never served from an old mapping."""
        path = self.path(key)
        if cache and _CACHE_MAPS:
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                self._forget_map(key)
                return None
            ident = (st.st_ino, st.st_size, st.st_mtime_ns)
            hit = self._maps.get(key)
            if hit is not None and hit[0] == ident:
                self._maps.move_to_end(key)
                return hit[1]
        view = self._map_file(path)
        if cache and _CACHE_MAPS and view is not None:
            self._forget_map(key)
            self._maps[key] = (ident, view)
            self._mapped += len(view)
            while self._mapped > MAP_CACHE_BYTES and len(self._maps) > 1:
                self._forget_map(next(iter(self._maps)))
        return view

    def prefetch(self, keys: Iterable[bytes]) -> int:
        """Ask the kernel to start reading the files of ``keys`` into the page cache
        (``posix_fadvise(WILLNEED)``, asynchronous) so that a cold restore reads them in
        parallel instead of one mapping at a time. Keys whose file is mapped already (its
        pages are resident) are skipped; missing files are ignored. No-op where the
        platform has no ``posix_fadvise``. Returns how many files were advised."""
        if not _WILLNEED:
            return 0
        n = 0
        for key in keys:
            if key in self._maps:
                continue
            try:
                fd = os.open(self.path(key), os.O_RDONLY | _NOFOLLOW | _BINARY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        return n

    def _forget_map(self, key: bytes) -> None:
        """Drop the cached mapping of ``key``; the OS unmaps it when its last view goes."""
        hit = self._maps.pop(key, None)
        if hit is not None:
            self._mapped -= len(hit[1])

    @staticmethod
    def _map_file(path: Path) -> memoryview | None:
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY)  # a link is damage: not read
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size == 0 or not stat.S_ISREG(st.st_mode):
                return None
            if hasattr(mmap, "MAP_SHARED"):
                return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ))
            return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))  # Windows
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def size(self, key: bytes) -> int:
        try:
            return os.stat(self.path(key), follow_symlinks=False).st_size
        except OSError:
            return 0

    def scrub(self, keys: Iterable[bytes], sync: bool = False) -> None:
        """Overwrite the files of ``keys`` with zeros, then unlink them (missing ones are
        skipped; a symbolic link is unlinked, its target untouched; see the module notes).
        Waits for the restores of every process that are copying block bytes now."""
        keys = list(keys)
        if not keys:
            return
        with self._locked(exclusive=True), self._open_dir() as dir_fd:
            for key in keys:
                self._forget_map(key)
                self._scrub_name(key.hex(), sync, dir_fd)

    @contextlib.contextmanager
    def reading(self):
        """Held while mapped block bytes are checked and then copied (a restore): no process
        zeroes a block file meanwhile (:meth:`scrub` waits). Several readers may hold it."""
        with self._locked(exclusive=False):
            yield

    @contextlib.contextmanager
    def _locked(self, exclusive: bool):
        """``flock`` on ``<folder>.lock`` (a new descriptor each time, so threads of one
        process exclude each other too); nothing where the platform has no flock or the lock
        file cannot be opened (a symbolic link planted there is not followed)."""
        fd = None
        if _fcntl is not None:
            with contextlib.suppress(OSError):
                fd = os.open(f"{self.folder}.lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW, FILE_MODE)
                _fcntl.flock(fd, _fcntl.LOCK_EX if exclusive else _fcntl.LOCK_SH)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _open_dir(self):
        """A descriptor of the folder (following a symlinked folder) for ``dir_fd``-relative
        operations, or None where the platform has none or the folder is missing."""
        fd = None
        if _DIR_FD:
            with contextlib.suppress(OSError):
                fd = os.open(self.folder, os.O_RDONLY | _DIRECTORY)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def _scrub_name(self, name: str, sync: bool, dir_fd: int | None) -> bool:
        """Zero and unlink the block file ``name``. A symbolic link is unlinked without
        being followed; a name outside the block-file pattern, or an entry that is not a
        regular file of this user, is left alone. True when the name went."""
        if not BLOCK_NAME.fullmatch(name):
            self._note_foreign(name)
            return False
        where = {"dir_fd": dir_fd} if dir_fd is not None else {}
        target = name if dir_fd is not None else os.path.join(self.folder, name)
        try:
            st = os.stat(target, follow_symlinks=False, **where)
        except OSError:
            return False
        if not stat.S_ISLNK(st.st_mode):
            if not _own_regular_file(st):
                self._note_foreign(name)
                return False
            if st.st_nlink == 1:  # another hard link's bytes are not ours to zero
                self._zero(target, st, sync, where)
        try:
            os.unlink(target, **where)
        except OSError:
            return False
        return True

    @staticmethod
    def _zero(target: str, st: os.stat_result, sync: bool, where: dict) -> None:
        """Overwrite the regular file ``target`` (the one ``st`` describes) with zeros."""
        try:
            fd = os.open(target, os.O_WRONLY | _NOFOLLOW | _BINARY, **where)
        except OSError:
            return
        try:
            now = os.fstat(fd)
            if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev) or not _own_regular_file(now):
                return  # swapped since the lstat: leave it
            left = now.st_size
            while left > 0:
                left -= os.write(fd, _ZEROS[: min(left, len(_ZEROS))])
            if sync:
                _datasync(fd)
        except OSError:
            pass  # a full disk cannot stop a deletion: unlink anyway
        finally:
            os.close(fd)

    def _note_foreign(self, name: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s holds %s, which Branchwise did not make: left as it is", self.folder, name)

    def names(self) -> list[str]:
        """The block-file names in the folder (keys in hex, and temporary files), files or
        symbolic links, never followed. Any other entry is left out (and logged once)."""
        out = []
        try:
            with os.scandir(self.folder) as it:
                for e in it:
                    if BLOCK_NAME.fullmatch(e.name) and (e.is_symlink() or e.is_file(follow_symlinks=False)):
                        out.append(e.name)
                    else:
                        self._note_foreign(e.name)
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def reclaim(self, keep: set[str]) -> int:
        """Scrub every block file whose name is not in ``keep`` (hex keys): temporary
        files and orphans of a write that never committed. Files of other names are not
        touched. Call it holding the index's write lock. Returns how many files went."""
        gone = 0
        self._made = False
        self._maps.clear()
        self._mapped = 0
        with self._locked(exclusive=True), self._open_dir() as dir_fd:
            for name in self.names():
                if name not in keep and self._scrub_name(name, False, dir_fd):
                    gone += 1
        return gone

    def total_bytes(self) -> int:
        """Bytes of every block file in the folder (symbolic links count as their own size)."""
        total = 0
        with contextlib.suppress(OSError):
            with os.scandir(self.folder) as it:
                for e in it:
                    if BLOCK_NAME.fullmatch(e.name):
                        with contextlib.suppress(OSError):
                            total += e.stat(follow_symlinks=False).st_size
        return total

    def remove_all(self) -> None:
        """Unlink every block file, then the folder if that leaves it empty (a reset of
        the store). Other entries, and a symlinked folder's link, stay."""
        self._made = False
        self._maps.clear()
        self._mapped = 0
        with self._open_dir() as dir_fd:
            where = {"dir_fd": dir_fd} if dir_fd is not None else {}
            for name in self.names():
                with contextlib.suppress(OSError):
                    os.unlink(name if dir_fd is not None else os.path.join(self.folder, name), **where)
        if not self.folder.is_symlink():
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)  # fails, as it should, if anything else is in it

    def drop_cache(self) -> None:
        """Evict the files from the page cache (``posix_fadvise(DONTNEED)``, after an
        fsync so no dirty page stays), for cold-cache measurements. No-op elsewhere."""
        if not hasattr(os, "posix_fadvise"):
            return
        self._maps.clear()  # a mapped page is never dropped
        self._mapped = 0
        for name in self.names():
            drop_file_cache(self.folder / name)


def _own_regular_file(st: os.stat_result) -> bool:
    """A regular file owned by this user (any owner where the platform has no uids)."""
    return stat.S_ISREG(st.st_mode) and (_UID is None or st.st_uid == _UID)


def drop_file_cache(path: Path | str) -> None:
    """fsync ``path``, then ask the kernel to drop its cached pages (Linux)."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
