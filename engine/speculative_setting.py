"""The speculative-decoding setting (``--speculative``, Settings → App), without llama.cpp:
the CLI's parser and the window's settings read it before any model is loaded. The decoding
itself is :mod:`engine.speculative`."""

from __future__ import annotations

NONE, LOOKUP, DRAFT = "none", "lookup", "draft"
DEFAULT = NONE
"""Off by default: at temperature 0 a lookup reply is not always token for token the plain
one, on either of ``branchwise bench``'s workloads (a quote of a pasted text, a plain
question), because a verification batch's logits equal a one-token step's only at its first
position (measured: later positions differ by up to 0.47-1.4, the largest difference over
the vocabulary; README "Speculative decoding")."""

CHOICES = "none, lookup or draft:PATH"


def parse(text: str | None) -> str:
    """The normalized setting: ``"none"``, ``"lookup"`` or ``"draft:PATH"`` (PATH as given).

    Raises:
        ValueError: anything else, in one sentence naming the accepted forms.
    """
    value = (text or "").strip()
    if value.lower() in (NONE, LOOKUP):
        return value.lower()
    if value.lower().startswith(DRAFT + ":") and value[len(DRAFT) + 1:].strip():
        return f"{DRAFT}:{value[len(DRAFT) + 1:].strip()}"
    raise ValueError(f"speculative decoding must be {CHOICES} (a GGUF file), not {value!r}")


def kind_of(setting: str) -> str:
    """``"none"``, ``"lookup"`` or ``"draft"`` for a :func:`parse`'d setting."""
    return DRAFT if setting.startswith(DRAFT + ":") else setting
