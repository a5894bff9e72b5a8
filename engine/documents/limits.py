"""The limits of attaching a file (README, "Chat with your documents").

Each one turns a hostile or mistaken file into one sentence instead of a full memory,
a hung window or a database of gigabytes. They are checked in this order: size on disk
(before a byte is read), then in the extraction child its time and memory, the page
count (before a page is read), a DOCX's unzipped size (before it is unzipped), and the
characters of text extracted.
"""

from __future__ import annotations

from typing import Final

MAX_FILE_BYTES: Final = 64 * 1024**2
"""Largest file attached: 64 MiB (LM Studio stops at 30 MB). A 2 GB file is refused from
its size alone, before it is opened."""

MAX_STORED_ORIGINAL_BYTES: Final = 16 * 1024**2
"""The original file is kept in ``chats.sqlite3`` beside its text up to 16 MiB; a larger
one keeps only its text, SHA-256 and size."""

MAX_PAGES: Final = 2_000
"""Most pages of a PDF; a 10,000-page PDF is refused from its page count."""

MAX_TEXT_CHARS: Final = 4_000_000
"""Most characters of extracted text (about a million tokens: far past any context, but
enough to search the document)."""

MAX_UNZIPPED_BYTES: Final = 256 * 1024**2
"""Most bytes a DOCX may unpack to, from its zip directory, checked before unzipping (a
zip bomb that lies in its directory still meets the memory limit)."""

TIME_LIMIT_S: Final = 60.0
"""Wall-clock time the extraction child gets (PDFium reads about 100 pages/s on one busy
core here, so a 2,000-page PDF takes about 20 s)."""

MEMORY_LIMIT_BYTES: Final = 1536 * 1024**2
"""Address space of the extraction child (``RLIMIT_AS`` on POSIX): 1.5 GiB."""
