"""Stop strings: end a streamed reply at the first one, before any of it is shown
(a model given the ChatML fallback sees ChatML's markers as plain text, see
:meth:`engine.chat_template.PromptBuilder.stop_matcher`)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

Tokenize = Callable[[str, bool], list[int]]  # (text, parse_special) -> ids, no BOS



class StopMatcher:
    """Ends a streamed reply at the first stop string, before any of it is shown.

    Feed each token's text delta to :meth:`feed`; it returns the text that is safe to
    show now, holding back a tail that could be the start of a stop string. Once
    :attr:`hit` is True the reply ends; :attr:`text` is everything before the stop string
    and :meth:`cut_ids` the token ids that spell exactly that. At the end of a reply
    without a hit, :meth:`flush` releases the held-back tail.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self._raw = ""
        self._shown = 0
        self._ends: list[int] = []  # len(raw text) after each token
        self.hit = False
        self.stop_at: int | None = None

    def feed(self, delta: str) -> str:
        self._raw += delta
        self._ends.append(len(self._raw))
        if self.hit:
            return ""
        raw = self._raw
        search_from = max(self._shown - max(map(len, self.stops)), 0)
        found = [i for i in (raw.find(s, search_from) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            self.stop_at = min(found)
            out = raw[self._shown : self.stop_at]
            self._shown = self.stop_at
            return out
        hold = 0  # the longest tail of raw that is a proper prefix of a stop string
        for s in self.stops:
            for k in range(min(len(s) - 1, len(raw)), hold, -1):
                if raw.endswith(s[:k]):
                    hold = k
                    break
        safe = max(len(raw) - hold, self._shown)
        out = raw[self._shown : safe]
        self._shown = safe
        return out

    def flush(self) -> str:
        """The held-back tail (at the end of a reply that met no stop string)."""
        if self.hit:
            return ""
        out = self._raw[self._shown :]
        self._shown = len(self._raw)
        return out

    @property
    def text(self) -> str:
        return self._raw[: self._shown]

    def cut_ids(self, ids: Sequence[int], tokenize: Tokenize) -> tuple[list[int], int]:
        """``(ids, n_evaluated_kept)`` after a hit: the whole tokens that end before the
        stop string, plus the plain-text tokens of the part of a token cut through, so the
        ids spell :attr:`text` exactly. ``n_evaluated_kept`` is the count of original ids kept."""
        assert self.stop_at is not None
        n = bisect.bisect_right(self._ends, self.stop_at)
        start = self._ends[n - 1] if n else 0
        rest = self._raw[start : self.stop_at]
        return list(ids[:n]) + (tokenize(rest, False) if rest else []), n
