"""Wording shared by the CLI and the window: the model label on a reply, the stats line."""

from __future__ import annotations

from pathlib import Path


def model_label(path: str | Path | None, facts: dict | None = None) -> str:
    """The name of a model as stored on the replies it wrote (``messages.model``) and shown in
    the status bar: the GGUF file name without ``.gguf``, e.g. "SmolLM2-135M-Instruct.Q4_1".
    Without a path, ``facts["name"]`` (GGUF ``general.name``), else "model".
    One rule for both front ends: the CLI and the window must label the same model alike."""
    if path:
        name = Path(path).name
        return name[:-5] if name.lower().endswith(".gguf") else name
    return (facts or {}).get("name") or "model"


def draft_note(stats: dict) -> str:
    """"51 of 64 drafted tokens accepted" for a GenerationStats dict of a reply decoded with
    speculative decoding that drafted anything (engine/speculative.py), else ""."""
    drafted = stats.get("drafted_tokens") or 0
    return f"{stats.get('accepted_tokens', 0):,} of {drafted:,} drafted tokens accepted" if drafted else ""


def restored_words(tokens: int, first_turn: bool) -> str:
    """What a reply's restored prefix is called, in the window and on the command line:
    "restored 3,774" when it holds earlier turns of the conversation, "reused 39 cached"
    on a conversation's first turn, where it can only be the start every chat shares (the
    system prompt, the template's opening) or the same question asked before."""
    return f"reused {tokens:,} cached" if first_turn else f"restored {tokens:,}"


def reply_status_line(stats: dict, saved: bool = False, first_turn: bool = False) -> str:
    """"restored N tokens in X ms · prefilled M in Y s · Z tok/s" for a GenerationStats dict
    (tokens, milliseconds); when background prewarms (engine/prewarm.py) had the prompt ready,
    "prefilled while you typed: T tokens · ready before you sent: R tokens" instead of the
    restore, and "nothing left to prefill" when they had all of it. ``first_turn``: the reply
    is a conversation's first (``restored_words``). ``saved`` True labels the line as the saved figures of the reply
    shown ("Last reply on this branch: …"), so that opening a chat does not look like a new run."""
    parts = []
    if stats.get("typed_tokens"):
        parts.append(f"prefilled while you typed: {stats['typed_tokens']:,} tokens")
    if stats.get("prepared_tokens"):  # engine/prewarm.py: live before the request came
        parts.append(f"ready before you sent: {stats['prepared_tokens']:,} tokens")
    elif stats.get("restored_tokens"):
        parts.append(f"{restored_words(stats['restored_tokens'], first_turn)} tokens in {stats.get('restore_ms', 0):.0f} ms")
    else:
        parts.append("nothing restored")
    if not stats.get("prefilled_tokens") and stats.get("prepared_tokens"):
        parts.append("nothing left to prefill")  # the first token came from the prewarm's logits
    else:
        parts.append(f"prefilled {stats.get('prefilled_tokens', 0):,} in {stats.get('prefill_ms', 0) / 1000:.2f} s")
    parts.append(f"{stats.get('decode_tokens_per_s', 0):.0f} tok/s")
    if note := draft_note(stats):
        parts.append(note)
    line = " · ".join(parts)
    return f"Last reply on this branch: {line}" if saved else line
