"""Downloads that never start over and never hand over a bad file.

Why not ``huggingface_hub.hf_hub_download``: it resumes into its own cache layout
(``blobs/`` + ``snapshots/`` symlinks, or ``local_dir/.cache``), and files stored with
Xet go through ``hf_xet``, whose partial state is not a byte range on disk. Branchwise
wants plain files in its own models folder and a resume it can prove, so the range loop
is here, on httpx:

* the bytes go to ``<models>/.partial/<repo>/<file>.part``; its size on disk is where the
  next request starts (``Range: bytes=N-``), after Cancel, a crash, ``kill -9`` or a lost
  connection (retried in place, :data:`RETRIES` times without progress). A sidecar
  ``.part.json`` ties the bytes to the expected SHA-256; another hash starts afresh;
* the SHA-256 is computed while writing (the kept bytes are hashed from disk first) and
  compared with the hub's LFS ``sha256``; a mismatch deletes the partial file;
* free disk space is checked before the first byte; ``ENOSPC`` mid-way is named as a
  full disk and the bytes so far are kept for the resume;
* a verified file is fsynced and moved into ``<models>/<repo>/`` with ``os.replace``
  (atomic on one file system); a split model's parts move together, first part last,
  so the library never lists a model with a part missing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHUNK = 1024 * 1024
RETRIES = 5
DISK_MARGIN = 64 * 1024 * 1024
PARTIAL_DIR = ".partial"


class DownloadError(Exception):
    """A download failed; the message is one sentence naming the file or folder to act on."""


class Cancelled(DownloadError):
    """The download was cancelled; the bytes so far are kept for the resume."""


@dataclass
class RemoteFile:
    """One file to fetch: ``url``, its name, exact size and SHA-256 (hex) from the hub."""

    url: str
    name: str
    size: int
    sha256: str | None


Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)`` over every file of one download."""


def folder_name(repo: str) -> str:
    """A repository's folder in the models folder: ``owner--name``."""
    return repo.replace("/", "--")


def _hash_file(path: Path, h) -> None:
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)


def _full_disk(folder: Path, done: int, total: int, part: Path) -> DownloadError:
    free = shutil.disk_usage(folder).free
    return DownloadError(f"The disk holding {folder} is full ({free / 1e6:,.0f} MB free): {done / 1e6:,.0f} of "
                         f"{total / 1e6:,.0f} MB are kept in {part.name}; free some space and run the download "
                         "again to continue from there.")


class _Fetcher:
    def __init__(self, client, headers: dict, progress: Progress | None, cancel: threading.Event | None,
                 total: int, base_done: int):
        self.client, self.headers, self.progress, self.cancel = client, headers, progress, cancel
        self.total, self.done = total, base_done

    def fetch(self, rf: RemoteFile, part: Path) -> None:
        """Fill ``part`` up to ``rf.size`` bytes and check its SHA-256."""
        import httpx

        meta = part.with_name(part.name + ".json")
        expected = {"url": rf.url, "size": rf.size, "sha256": rf.sha256}
        if part.exists():
            try:
                kept = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                kept = None
            if kept is None or kept.get("sha256") != rf.sha256 or kept.get("size") != rf.size \
                    or part.stat().st_size > rf.size:
                part.unlink()
        if not part.exists():
            part.touch()
            meta.write_text(json.dumps(expected), encoding="utf-8")
        self.h = hashlib.sha256()
        _hash_file(part, self.h)
        offset = part.stat().st_size
        self._report(offset)
        failures = 0
        while offset < rf.size:
            before = offset
            try:
                offset = self._range(rf, part, offset)
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                offset = part.stat().st_size
                failures = 0 if offset > before else failures + 1
                if failures >= RETRIES:
                    raise DownloadError(f"The connection to {httpx.URL(rf.url).host} was lost {RETRIES} times "
                                        f"without progress ({exc}); {offset / 1e6:,.0f} MB of {rf.name} are kept: "
                                        "run the download again to continue.") from exc
                time.sleep(min(0.2 * 2 ** failures, 5.0))
                self.h = hashlib.sha256()
                _hash_file(part, self.h)
        digest = self.h.hexdigest()
        if rf.sha256 and digest != rf.sha256.lower():
            part.unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
            raise DownloadError(f"{rf.name} does not match the hub's SHA-256 (expected {rf.sha256[:16]}…, got "
                                f"{digest[:16]}…), so it was deleted and is not in the library; try again.")

    def _report(self, file_done: int) -> None:
        if self.progress:
            self.progress(self.done + file_done, self.total)

    def _range(self, rf: RemoteFile, part: Path, offset: int) -> int:
        headers = {**self.headers, "Range": f"bytes={offset}-", "Accept-Encoding": "identity"}
        with self.client.stream("GET", rf.url, headers=headers) as r:
            if r.status_code == 416 and offset == rf.size:
                return offset
            if r.status_code not in (200, 206):
                raise DownloadError(f"{r.url.host} answered {r.status_code} for {rf.name}"
                                    + (": store an access token with 'branchwise models login'."
                                       if r.status_code in (401, 403) else "."))
            if r.status_code == 200 and offset:  # the server ignored the range: start this file over
                offset = 0
                self.h = hashlib.sha256()
                mode = "wb"
            else:
                mode = "ab"
            with open(part, mode) as f:
                for block in r.iter_raw(CHUNK):
                    if self.cancel is not None and self.cancel.is_set():
                        f.flush()
                        raise Cancelled(f"Download stopped; {offset / 1e6:,.0f} MB of {rf.name} are kept and "
                                        "the next download continues from there.")
                    if offset + len(block) > rf.size:
                        block = block[: rf.size - offset]
                    try:
                        f.write(block)
                        f.flush()
                    except OSError as exc:
                        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
                            f.close()
                            raise _full_disk(part.parent, self.done + part.stat().st_size, self.total,
                                             part) from exc
                        raise
                    self.h.update(block)
                    offset += len(block)
                    self._report(offset)
                    if offset >= rf.size:
                        break
        return offset


def download(files: list[RemoteFile], models_dir: Path, repo: str, token: str | None = None,
             progress: Progress | None = None, cancel: threading.Event | None = None, client=None,
             extra: dict | None = None) -> list[Path]:
    """Download ``files`` (one model: a single file or every part of a split one) into
    ``models_dir/<owner--name>/`` and return their final paths, first part first. Bytes a
    previous attempt left in ``.partial/`` are not fetched again. ``extra`` is written
    beside the first part as ``<file>.source.json`` (repository, revision, licence).
    Contacts the host of each file's URL.

    Raises:
        DownloadError: not enough free disk space (before starting), a full disk, the
            connection lost for good, an HTTP error, or a SHA-256 mismatch (the partial
            file is then deleted). :class:`Cancelled` when ``cancel`` was set.
    """
    import httpx

    final_dir = Path(models_dir) / folder_name(repo)
    partial_dir = Path(models_dir) / PARTIAL_DIR / folder_name(repo)
    partial_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    total = sum(f.size for f in files)
    parts = [partial_dir / (Path(f.name).name + ".part") for f in files]
    have = sum(p.stat().st_size for p in parts if p.exists())
    free = shutil.disk_usage(partial_dir).free
    if total - have + DISK_MARGIN > free:
        raise DownloadError(f"Not enough free disk space in {models_dir}: the download needs "
                            f"{(total - have) / 1e9:,.2f} GB more and {free / 1e9:,.2f} GB are free.")
    own = client is None
    client = client or httpx.Client(follow_redirects=True, trust_env=False,
                                    timeout=httpx.Timeout(30.0, read=60.0))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    done = 0
    try:
        for rf, part in zip(files, parts):
            fetcher = _Fetcher(client, headers, progress, cancel, total, done)
            fetcher.fetch(rf, part)
            done += rf.size
    finally:
        if own:
            client.close()
    final_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    for part in parts:
        with open(part, "rb+") as f:
            os.fsync(f.fileno())
    if extra is not None:
        (final_dir / (Path(files[0].name).name + ".source.json")).write_text(json.dumps(extra, indent=1),
                                                                           encoding="utf-8")
    targets = [final_dir / Path(f.name).name for f in files]
    for part, target in list(zip(parts, targets))[1:] + list(zip(parts, targets))[:1]:
        os.replace(part, target)
        part.with_name(part.name + ".json").unlink(missing_ok=True)
    try:
        fd = os.open(final_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # Windows: folders cannot be opened for fsync
    return targets
