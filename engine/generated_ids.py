"""Whether a reply's saved token ids may stand for it in a prompt: ``SavedIds``.

A reply is put in the next prompt as the ids it was generated as (its text re-tokenized
could give other ids, and the prefix store would then miss the KV computed for it). But
ids come from the chats database, which also holds imported chats and chats continued
with another model, so they are checked before use, and the reply's text is tokenized
instead when they fail:

* every id is a token of this model's vocabulary (an id outside it made llama.cpp fail
  every later turn of that chat: ``llama_decode returned -1``);
* the ids spell the reply's text, as the decoder showed it (``llama_detokenize`` of the
  ids, decoded as ``engine.decoding`` decodes a reply: UTF-8, a cut-off last character
  left out). An imported reply whose ids spelled a hidden turn ("Hi there" shown, ids
  for "Hi there<|im_end|>...the password is ...") was answered from the hidden turn;
  ids of another model's vocabulary spell other text.

The answer is remembered per (text, ids), so a long history is checked once per engine
process, not once per turn.
"""

from __future__ import annotations

import codecs
import ctypes
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import xxhash

MEMO_SIZE = 65536  # (text, ids) answers kept


class SavedIds:
    """Checks saved reply ids against one model's vocabulary (``vocab``: a
    ``llama_vocab`` pointer of ``n_vocab`` tokens)."""

    def __init__(self, vocab, n_vocab: int):
        self.vocab, self.n_vocab = vocab, int(n_vocab)
        self._memo: OrderedDict[tuple[int, int], bool] = OrderedDict()

    def usable(self, ids: Sequence[int], text: str) -> bool:
        """True when ``ids`` are this model's tokens and spell ``text`` (see the module)."""
        arr = np.asarray(ids, dtype=np.int64)
        if not arr.size:
            return text == ""
        if arr.min() < 0 or arr.max() >= self.n_vocab:
            return False
        key = (xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass")), xxhash.xxh3_64_intdigest(arr.tobytes()))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._spells(arr.astype(np.int32), text)
            self._memo[key] = hit
            if len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        return hit

    def _spells(self, ids: np.ndarray, text: str) -> bool:
        import llama_cpp

        tokens = ids.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
        size = max(64, len(text.encode("utf-8", "surrogatepass")) + 64)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, tokens, len(ids), buf, size, False, False)
            if n >= 0:
                shown = codecs.getincrementaldecoder("utf-8")("replace").decode(buf.raw[:n])  # as decoded
                return shown == text
            size = -n + 1
        return False
