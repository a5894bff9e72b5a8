"""A long text tokenized with special-token parsing in pieces, to the same ids.

llama.cpp's special-token partition (``tokenizer_st_partition`` in ``src/llama-vocab.cpp``)
walks its fragment list from the start at every match, so a text holding many control
token texts takes quadratic time: on the default model (a 2-core machine), a ChatML
history tokenized with special parsing took 0.26 s at 50 KB, 1.49 s at 200 KB, 4.26 s at
400 KB; a 10,000-message history (494 KB) 5.24 s, a 50,001-message one (2.51 MB, 663,928
tokens) 54-220 s. In pieces of about :data:`PIECE_BYTES` it is linear: 0.96 s and 4.79 s
for those two histories, the same ids.

The pieces tokenize to the same ids as the whole text because each cut falls just before
an occurrence of a special token (one llama.cpp matches on its own: control, user-defined
or unknown, without ``LSTRIP``, which would eat the whitespace before it) that llama.cpp
surely matches there: no other special token's occurrence straddles the cut, and none at
least as long starts inside it (llama.cpp matches the longest tokens first, so Falcon's
``<|endoftext|>`` in ``>>TITLE<<|endoftext|>`` wins over ``>>TITLE<<``, and a cut before
``>>TITLE<<`` changed the ids). llama.cpp tokenizes the raw text between two
special tokens on its own (SentencePiece's space prefix, too, only looks at whether the
fragment before was a special token, and a piece starts with one), so cutting there
changes nothing. A text with no such place is tokenized whole.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import llama_cpp

PIECE_BYTES = 8 * 1024
"""Bytes a piece holds before the next cut is looked for (1-32 KB measured alike per megabyte)."""

_SPECIAL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN


class SpecialPieces:
    """Where a text may be cut: ``texts`` are the special tokens' texts llama.cpp matches,
    ``cut_texts`` those a piece may begin with (no ``LSTRIP``). :meth:`from_vocab` reads
    them from a model (0.02-0.23 s for 3-6,414 special tokens in vocabularies of up to
    262,144, measured on a 2-core machine)."""

    def __init__(self, texts: list[bytes], cut_texts: list[bytes]):
        self.cut_texts = cut_texts
        self._by_pair: dict[bytes, list[bytes]] = defaultdict(list)  # two bytes -> special texts holding them
        self._by_start: dict[bytes, list[bytes]] = defaultdict(list)  # first two bytes -> special texts
        for text in set(texts):
            self._by_start[text[:2]].append(text)
            for i in range(len(text) - 1):
                pair = text[i : i + 2]
                if not self._by_pair[pair] or self._by_pair[pair][-1] != text:
                    self._by_pair[pair].append(text)

    @classmethod
    def from_vocab(cls, vocab) -> SpecialPieces:
        """The special tokens of ``vocab`` (a ``llama_vocab`` pointer): those with the
        ``CONTROL``, ``USER_DEFINED`` or ``UNKNOWN`` attribute, the set llama.cpp's
        partition matches (``cache_special_tokens`` in ``src/llama-vocab.cpp``)."""
        texts: list[bytes] = []
        cuts: list[bytes] = []
        for t in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            attr = llama_cpp.llama_vocab_get_attr(vocab, t)
            if not attr & _SPECIAL:
                continue
            text = llama_cpp.llama_vocab_get_text(vocab, t) or b""  # c_char_p: bytes, the token's own text
            if not text:
                continue
            texts.append(text)
            if not attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP:
                cuts.append(text)
        return cls(texts, cuts)

    def _unsafe(self, data: bytes, cut: int, marker: bytes) -> bool:
        """True when llama.cpp might not match ``marker`` at ``cut``: another special token's
        occurrence spans ``cut`` (starts before it and ends after it), or one at least as
        long as ``marker`` starts inside it, or a longer one at ``cut`` (matched first, it
        would take the marker's bytes, or its ``LSTRIP`` the whitespace before the cut)."""
        for p in range(cut, cut + len(marker)):
            for text in self._by_start.get(data[p : p + 2], ()):
                longer = len(text) > len(marker) if p == cut else len(text) >= len(marker)
                if longer and data.startswith(text, p):
                    return True
        for text in self._by_pair.get(data[cut - 1 : cut + 1], ()):
            lo = max(0, cut - len(text) + 1)
            at = data.find(text, lo, cut + len(text) - 1)
            while at != -1 and at < cut:
                if at + len(text) > cut:
                    return True
                at = data.find(text, at + 1, cut + len(text) - 1)
        return False

    def pieces(self, data: bytes, piece_bytes: int = PIECE_BYTES) -> list[bytes]:
        """``data`` cut into pieces of about ``piece_bytes`` or more, each cut just before a
        special token's text that llama.cpp surely matches there (:meth:`_unsafe`; one piece
        when there is no such place)."""
        head = data[: 2 * piece_bytes]
        # the markers this text uses, each with its next occurrence (found again only once
        # passed, so the text is scanned once per marker, not once per cut)
        upcoming = {t: data.find(t) for t in self.cut_texts if t in head}
        out, start = [], 0
        while upcoming and len(data) - start > 2 * piece_bytes:
            pos, cut = start + piece_bytes, -1
            while pos < len(data):
                for t, at in upcoming.items():
                    if -1 < at < pos:
                        upcoming[t] = data.find(t, pos)
                found = [at for at in upcoming.values() if at != -1]
                if not found:
                    break
                at = min(found)
                marker = max((t for t, i in upcoming.items() if i == at), key=len)  # the longest starting there
                if not self._unsafe(data, at, marker):
                    cut = at
                    break
                pos = at + 1
            if cut == -1:
                break
            out.append(data[start:cut])
            start = cut
        out.append(data[start:])
        return out

    def tokenize(self, data: bytes, tokenize: Callable[[bytes], list[int]]) -> list[int]:
        """The ids of ``tokenize(data)`` (special parsing, no BOS), computed piece by piece;
        what ``tokenize`` raises (llama-cpp-python: ``RuntimeError``) goes to the caller."""
        ids: list[int] = []
        for piece in self.pieces(data):
            ids.extend(tokenize(piece))
        return ids
