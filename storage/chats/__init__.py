"""The chat store as a package: ``from storage.chats import ChatStore`` (and the records,
``SearchHit`` and the title and search helpers, re-exported so callers import from one
place).

=================  ==========================================================
``store.py``       ``ChatStore``: conversations, messages, the active path
``tree.py``        ``Branches`` (``store.branches``): children, siblings, paths
``copies.py``      ``Copies`` (``store.copies``): duplicate, fork
``deletion.py``    ``Deletion`` (``store.deletion``): subtrees, Undo, scrubbing
``search.py``      ``Search`` (``store.search_hits``) and ``SearchHit``
``queries.py``     the row queries the parts share
``connection.py``  opening the file, transactions, a full disk
=================  ==========================================================
"""

from storage.chat_records import (
    DEFAULT_SAMPLING,
    DEFAULT_TITLE,
    ROLES,
    STATUSES,
    Conversation,
    Message,
    checked_sampling,
)
from storage.chat_text import TITLE_LIMIT, auto_title, search_terms
from storage.chats.connection import LOW_SPACE_BYTES
from storage.chats.search import SearchHit
from storage.chats.store import ChatStore

__all__ = [
    "DEFAULT_SAMPLING",
    "DEFAULT_TITLE",
    "LOW_SPACE_BYTES",
    "ROLES",
    "STATUSES",
    "TITLE_LIMIT",
    "ChatStore",
    "Conversation",
    "Message",
    "SearchHit",
    "auto_title",
    "checked_sampling",
    "search_terms",
]
