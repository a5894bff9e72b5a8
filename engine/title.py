"""Chat titles written by the loaded model, in the background.

After a chat's first reply the window asks for a title (``TitleRequest``). The prompt is
the chat's own prompt followed by one more user message, :data:`INSTRUCTION`, so the live
context already holds all of it but that message: the job prefills a few dozen tokens and
decodes at most ``max_tokens`` (greedy). It runs on sequence 0 like every request, and:

* its KV is never stored (no snapshot) and it leaves the store's statistics and LRU marks
  alone (``record=False``), so no chat's prefix-store entries change;
* the next turn of the chat shares the chat's prompt with what the job left live (the
  chat's path and the next user header), so it is restored from the live context as after
  any reply; only the instruction and the title tokens are cut away;
* it stops between decode steps as soon as any other request arrives (the engine process
  sets ``cancel``), and runs again after those requests; while the live context holds a
  draft a prewarm prepared, it waits until the request that uses it (``engine/worker.py``).

:func:`usable_title` decides whether what the model wrote can be a title; when it cannot,
the window keeps the first words of the chat (``storage.chat_text.auto_title``).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.chat_template import ChatMessage
from engine.settings import SamplingParams

INSTRUCTION = ("Write a title of 3 to 6 words for this conversation. "
               "Reply with the title only, no quotes.")
MAX_WORDS = 8
"""A title with more words than this is not used."""
MAX_CHARS = 60
_PREFIXES = ("title:", "title -", "title")
_TALK = re.compile(r"(?i)^(i|i'm|i am|here's|here is|sure|this conversation|as an)\b")


@dataclass
class TitleResult:
    """One run of the title job: ``text`` (the first line the model wrote, stripped),
    ``finished`` (False: ``cancel`` stopped it between decode steps), ``generated_tokens``."""

    text: str
    finished: bool
    generated_tokens: int


def title_messages(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The title job's messages: the chat's (system prompt first) and the instruction."""
    return [*messages, ChatMessage("user", INSTRUCTION)]


def write_title(engine, messages: Sequence[ChatMessage], cancel: threading.Event | None = None,
                max_tokens: int = 16, on_token: Callable[[str, int], None] | None = None) -> TitleResult:
    """Let ``engine`` (an ``engine.core.Engine``) write a title for the chat ``messages``
    (see the module docstring), greedy, at most ``max_tokens`` tokens; ``on_token(text,
    id)`` for each decoded token. Nothing is stored.

    Raises:
        ContextOverflowError: the chat and the instruction do not fit the context.
        TemplateError: the chat template cannot render these messages.
    """
    result = engine.generate(title_messages(messages), SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0),
                             on_token=on_token, cancel=cancel, snapshot=False, record=False)
    finished = result.stats.finish_reason != "cancelled"
    line = next((x for x in result.text.strip().splitlines() if x.strip()), "")
    return TitleResult(line.strip(), finished, result.stats.generated_tokens)


def usable_title(text: str, first_message: str) -> str | None:
    """``text`` (what the model wrote) as a title, or None when it cannot be one: empty,
    longer than ``MAX_WORDS`` words or ``MAX_CHARS`` characters, only punctuation, not plain
    words (control or format characters, markup such as ``<``, ``*``, ``#``, backticks), or
    a repeat of the chat's ``first_message`` (or its first words), a lead-in ending in ":",
    a question, or the model talking ("I'm…", "Here's…"). Quotes, a "Title:" label and a
    final period are taken off first."""
    t = " ".join(text.split())
    low = t.lower()
    for prefix in _PREFIXES:
        if low.startswith(prefix):
            t = t[len(prefix):].lstrip(" :-")
            break
    t = t.strip().strip("\"'“”‘’«»").strip().rstrip(".").strip()
    t = " ".join(t.replace('"', "").split())
    if not t or len(t) > MAX_CHARS or len(t.split()) > MAX_WORDS:
        return None
    if t[-1] in ":?;,-" or _TALK.match(t):  # a lead-in, a question, the model talking to the user
        return None
    if not any(ch.isalnum() for ch in t):
        return None
    if any(ch in "<>*#`[]{}|\\_=~^" or unicodedata.category(ch)[0] == "C" for ch in t):
        return None
    norm = " ".join(first_message.split()).lower().rstrip(".?!")
    if t.lower().rstrip(".?!") == norm or (len(norm) > 0 and t.lower() in (norm[: len(t)],)):
        return None
    return t
