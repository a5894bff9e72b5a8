"""Import chats from other apps, and Branchwise's own JSON, with every branch kept.

``import_files(paths, db_path, format=..., dry_run=..., progress=..., cancel=...)``
returns an ``ImportSummary``; ``detect(path)`` names a file's format. One
module per format reads it into ``SourceConversation`` records
(``records.py``); ``tree.py`` checks and orders the tree; ``writer.py`` stores
it; ``run.py`` handles files, zips, transactions, progress and cancelling;
``backup.py`` writes ``export --all``.
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
from storage.importers.run import detect, import_files

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
    "import_files",
]
