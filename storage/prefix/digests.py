"""The model-file digest cache: a model file's content digest, remembered by path and a
stamp of the file (size, mtime, ctime, inode), so a multi-gigabyte GGUF is hashed once,
not at every load (``engine.fingerprint.cached_file_digest``). It lives in the prefix
store's index (table ``file_digests``) because it is as disposable as the cache."""

from __future__ import annotations

from storage.prefix.index import Index


class FileDigests:
    """The digests kept in one store (``PrefixStore.digests``). Raises StoreFull /
    StoreUnavailable / StoreReset like the store."""

    def __init__(self, index: Index):
        self.ix = index

    def cached(self, path: str, stamp: str) -> str | None:
        """A model file's content digest computed earlier for this path and ``stamp`` (its
        size, mtime, ctime and inode: any write, copy or replacement changes one of them)."""
        with self.ix.guard():
            row = self.ix.db.execute(
                "SELECT digest FROM file_digests WHERE path=? AND stamp=?", (path, stamp)
            ).fetchone()
        return row[0] if row else None

    def remember(self, path: str, stamp: str, digest: str) -> None:
        """Keep ``digest`` (hex) for ``path`` at ``stamp``, replacing an older one."""
        with self.ix.guard(), self.ix.tx():
            self.ix.db.execute("DELETE FROM file_digests WHERE path=?", (path,))
            self.ix.db.execute("INSERT INTO file_digests VALUES (?,?,?)", (path, stamp, digest))
