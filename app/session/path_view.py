"""A branch as the window shows it: ``PathView`` (its messages, read when asked for) and
``SiblingPositions`` (the ``‹ 2/3 ›`` of each, likewise).

Opening a branch reads the ids of its newest ``PATH_TAIL`` messages only (a walk up from the
leaf of at most that many steps); the transcript draws at most the newest 200. The whole
path's ids are read when something asks for a message further up, for the path's length or
for its ids (on the UI thread that is a walk of the whole branch: 11 ms for 10,000 short
messages, 30 ms for 10,000 of 2 KB), or given by ``complete_with`` (the window reads them on
its reader thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from storage.errors import NotFoundError

PATH_TAIL = 256
"""Ids read up front when a branch is opened (``ConversationSession.shown_path``): more than
the transcript draws at once (``transcript_view.SHOWN_MESSAGES``)."""


class SiblingPositions(Mapping):
    """Message id -> (1-based position among its siblings, their count) for the messages of
    one path (``ids``: a list of ids, or a ``PathView``, which is not read whole for this);
    each is read from ``chats`` (a ChatStore) when first asked for, then kept."""

    def __init__(self, chats, ids, extra: tuple[int, ...] = ()):
        self._chats, self._ids, self._extra, self._known = chats, ids, extra, {}
        self._wanted = None if isinstance(ids, PathView) else set(ids)

    def _on_path(self, message_id: int) -> bool:
        if message_id in self._extra:
            return True
        return self._ids.has_id(message_id) if self._wanted is None else message_id in self._wanted

    def __getitem__(self, message_id: int) -> tuple[int, int]:
        if message_id not in self._known and not self._on_path(message_id):
            raise KeyError(message_id)
        if message_id not in self._known:
            try:
                sibs = [s.id for s in self._chats.branches.siblings(message_id)]
            except NotFoundError:  # deleted since the path was read: drawn without a navigator
                sibs = [message_id]
            self._known[message_id] = (sibs.index(message_id) + 1, len(sibs))
        return self._known[message_id]

    def __iter__(self) -> Iterator[int]:
        yield from (self._ids.ids if self._wanted is None else self._ids)
        yield from self._extra

    def __len__(self) -> int:
        return len(self._ids.ids if self._wanted is None else self._ids) + len(self._extra)

    def plus(self, message_id: int, position: tuple[int, int]) -> SiblingPositions:
        """These positions and ``message_id``'s (a message drawn below the path); none read again."""
        more = SiblingPositions(self._chats, self._ids, (*self._extra, message_id))
        more._known = {**self._known, message_id: position}
        return more


class PathView(Sequence):
    """A path of messages (root first) of which only ids are read up front; a message is read
    from ``chats`` (a ChatStore) when first asked for, slices in one query.

    ``ids`` given with ``complete=False`` are the newest of a longer path (``tail_ids``):
    a negative index or slice within them, ``bool()``, ``has_id`` of one of them and
    ``reversed()`` as far as they go read nothing more; ``len()``, ``ids``, any other index and
    iterating read the whole path's ids first (``path_ids`` from its last message), unless
    ``complete_with`` gave them. Raises NotFoundError for a message deleted since the ids
    were read."""

    def __init__(self, chats, ids: list[int], complete: bool = True):
        self._chats, self._ids, self._complete, self._known = chats, list(ids), complete, {}
        self._id_set: set[int] | None = None

    @property
    def complete(self) -> bool:
        """True when every id of the path is known (its length too)."""
        return self._complete

    @property
    def tail_ids(self) -> list[int]:
        """The ids known (root first): the whole path when ``complete``, else its newest ones."""
        return self._ids

    @property
    def ids(self) -> list[int]:
        """The ids of the whole path, root first (read first when not ``complete``)."""
        self.read_ids()
        return self._ids

    def complete_with(self, ids: list[int]) -> bool:
        """Take ``ids`` (the whole path's, root first, read elsewhere) when they end with the
        ids known; returns whether they were taken (False: another path, left as it was)."""
        if not self._complete and len(ids) >= len(self._ids) and ids[len(ids) - len(self._ids):] == self._ids:
            self._ids, self._complete, self._id_set = list(ids), True, None
        return self._complete and self._ids == ids

    def has_id(self, message_id: int) -> bool:
        """Whether ``message_id`` is on the path (its tail is looked at first)."""
        if self._id_set is None or len(self._id_set) != len(self._ids):
            self._id_set = set(self._ids)
        if message_id in self._id_set or self._complete:
            return message_id in self._id_set
        self.read_ids()
        return self.has_id(message_id)

    def read_ids(self) -> None:
        """Read the whole path's ids now when they are not known (a walk of the branch)."""
        if not self._complete:
            self.complete_with(self._chats.branches.path_ids(self._ids[-1]))

    def _in_tail(self, index) -> bool:
        if self._complete:
            return True
        if isinstance(index, slice):
            start, stop = index.start, index.stop
            return (index.step is None and start is not None and -len(self._ids) <= start < 0
                    and (stop is None or -len(self._ids) <= stop <= 0))
        return -len(self._ids) <= index < 0

    def __len__(self) -> int:
        return len(self.ids)

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __getitem__(self, index):
        ids = self._ids if self._in_tail(index) else self.ids
        if isinstance(index, slice):
            wanted = ids[index]
            self._read([i for i in wanted if i not in self._known])
            return [self._known[i] for i in wanted]
        mid = ids[index]
        if mid not in self._known:
            self._read([mid])
        return self._known[mid]

    def __iter__(self) -> Iterator:
        ids = self.ids
        for i in range(0, len(ids), 200):  # read in slices
            yield from self[i:i + 200]

    def __reversed__(self) -> Iterator:
        for i in range(-1, -len(self._ids) - 1, -1):  # the ids known first
            yield self[i]
        if not self._complete:
            known = len(self._ids)
            self.read_ids()
            for i in range(-known - 1, -len(self._ids) - 1, -1):
                yield self[i]

    def plus(self, message) -> PathView:
        """This path with ``message`` (a Message, a child of its last one) below it; the
        messages read already are not read again."""
        more = PathView(self._chats, [*self._ids, message.id], self._complete)
        more._known = {**self._known, message.id: message}
        return more

    def _read(self, ids: list[int]) -> None:
        if ids:
            self._known.update((m.id, m) for m in self._chats.messages(ids))
