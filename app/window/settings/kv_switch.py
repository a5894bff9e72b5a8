"""What a change of KV cache precision costs, said in Settings before OK.

The prefix store keys every KV block by the model fingerprint, which includes the KV types
(``engine.fingerprint.fingerprint``): blocks computed at f16 are not used at q8_0, and are
not deleted either (only the byte budget's eviction removes blocks). So a switch recomputes
the next turn of each chat once, and a switch back finds the old blocks again.
``PrefillMeter`` remembers the prefill speed the engine measured on the latest replies, and
``kv_switch_note`` turns it and the shown chat's token count into one sentence.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QObject

from storage.chats import ChatStore
from storage.errors import NotFoundError

MIN_MEASURED_TOKENS = 32
"""A reply's prefill counts as a speed measurement from this many prefilled tokens (a
shorter one is mostly fixed overhead)."""


def prefill_rate(stats: dict | None) -> float | None:
    """Prefill tokens per second of one reply's GenerationStats dict (``prefilled_tokens``
    over ``prefill_ms``), or None when it prefilled fewer than ``MIN_MEASURED_TOKENS``."""
    if not stats:
        return None
    tokens, ms = int(stats.get("prefilled_tokens") or 0), float(stats.get("prefill_ms") or 0.0)
    if tokens < MIN_MEASURED_TOKENS or ms <= 0:
        return None
    return tokens * 1000.0 / ms


def duration_words(seconds: float) -> str:
    """"about 30 s", "about 4 min" (rounded; at least 1 s)."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {round(seconds / 60)} min"


def kv_switch_note(old: str, new: str, tokens: int | None, rate: float | None) -> str:
    """The sentence Settings shows when the KV precision goes from ``old`` to ``new`` (e.g.
    "f16", "q8_0"): which stored KV stops being used, how many ``tokens`` of the shown chat
    the next turn recomputes (None: no chat shown or not counted yet) and how long that may
    take at ``rate`` prefill tokens/s (None: not measured yet). "" when nothing changes."""
    if old == new:
        return ""
    first = f"Your chats' stored KV was computed at {old}; "
    if tokens:
        cost = (f" ({duration_words(tokens / rate)} at the measured {rate:,.0f} tokens/s)" if rate
                else " (no prefill speed measured yet)")
        first += f"the next turn of this chat recomputes {tokens:,} tokens{cost} at {new}"
    else:
        first += f"the next turn of each chat recomputes its whole prompt at {new}"
        if rate:
            first += f", at about {rate:,.0f} tokens/s as measured"
    return (first + f", unless it was computed at {new} before. "
            f"The {old} KV is kept for when you switch back.")


class PrefillMeter(QObject):
    """The latest prefill speed (``rate``, tokens/s, or None) of replies saved in ``store``:
    call ``reply_saved(message id)`` after each reply, or ``seed`` with shown messages'
    stats when nothing was measured in this run yet."""

    def __init__(self, store: ChatStore, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.rate: float | None = None

    def reply_saved(self, message_id: int) -> None:
        """Take the prefill speed of reply ``message_id`` (0, or one that prefilled too
        little, changes nothing)."""
        if not message_id:
            return
        try:
            rate = prefill_rate(self.store.get_message(message_id).stats)
        except NotFoundError:  # deleted meanwhile
            return
        if rate is not None:
            self.rate = rate

    def seed(self, stats: Iterable[dict | None]) -> None:
        """When no speed was measured yet: the first usable one of ``stats`` (newest first)."""
        if self.rate is not None:
            return
        self.rate = next((r for r in map(prefill_rate, stats) if r is not None), None)
