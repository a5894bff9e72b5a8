"""Import chats from other apps, and Branchwise's own JSON, with every branch kept.

``import_files(paths, db_path, format=..., dry_run=..., progress=..., cancel=...)``
returns an ``ImportSummary``; ``detect(path)`` names a file's format. One
module per format reads it into ``SourceConversation`` records
(``records.py``); ``tree.py`` checks and orders the tree; ``writer.py`` stores
it; ``run.py`` handles files, zips, transactions, progress and cancelling.
``branchwise.py`` holds Branchwise's own JSON both ways: it also writes
``conversations export`` and ``export --all``.
"""

from storage.importers.records import (
    NO_KV_NOTE,
    FileReport,
    FileStatus,
    ImportCancelled,
    ImportFileError,
    ImportFormat,
    ImportProgress,
    ImportSummary,
    Skipped,
)

def __getattr__(name: str):
    """``import_files``, ``detect`` and ``expand_folders`` load the readers on first use, so the
    CLI's argument parser (which needs only the records) starts without them."""
    if name in ("import_files", "detect", "expand_folders"):
        from storage.importers import run

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NO_KV_NOTE",
    "FileReport",
    "FileStatus",
    "ImportCancelled",
    "ImportFileError",
    "ImportFormat",
    "ImportProgress",
    "ImportSummary",
    "Skipped",
    "detect",
    "expand_folders",
    "import_files",
]
