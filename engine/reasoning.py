"""Reasoning ("thinking") in a reply: which format a model writes it in, and a streaming
parser that splits a reply into its reasoning and its answer.

Three formats (:class:`ReasoningFormat`), as llama.cpp's ``common/chat.cpp`` knows them:

* ``<think>…</think>`` (Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3, Phi-4-reasoning,
  GLM). Some templates end the generation prompt inside the reasoning (DeepSeek-R1's
  ``<｜Assistant｜><think>\\n``): the reply then starts in the reasoning
  (:attr:`ReasoningSyntax.starts_open`, llama.cpp's ``thinking_forced_open``).
* ``[THINK]…[/THINK]`` (Magistral).
* gpt-oss's harmony channels: ``<|channel|>analysis<|message|>…<|end|>`` then
  ``<|start|>assistant<|channel|>final<|message|>…``, written with special tokens.

The format comes from the chat template's text and the vocabulary (:func:`detect_syntax`),
never from the file name. A tag opens the reasoning only at the start of the reply (after
whitespace) or as a special token of the vocabulary: an answer that merely spells
``<think>`` keeps it as answer text.

The parser (:class:`ReasoningParser`) takes text pieces and special markers in any split,
holds back a tail that may be the start of a tag, and returns ``(kind, text)`` chunks, kind
:data:`REASONING` or :data:`ANSWER`; the chunks of any split of a reply concatenate to
those of the reply fed in one piece. :class:`ReasoningSplitter` feeds it token by token
(ids with their bytes, partial UTF-8 kept across tokens) and counts reasoning tokens and
time. Whitespace right after an opening tag, before a closing one and at the start of the
answer that follows is dropped; a reply with no reasoning is passed on unchanged.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

REASONING = "reasoning"
ANSWER = "answer"
Chunk = tuple[str, str]  # (REASONING | ANSWER, text)

HARMONY_MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|call|>",
                   "<|constrain|>")


class ReasoningFormat(StrEnum):
    """How a model writes its reasoning (``ModelFacts.reasoning_format``)."""

    NONE = "none"
    THINK = "<think>"        # <think>…</think>
    BRACKET = "[THINK]"      # [THINK]…[/THINK] (Magistral)
    HARMONY = "harmony"      # gpt-oss channels


@dataclass(frozen=True)
class ReasoningSyntax:
    """A model's reasoning format.

    open_tag / close_tag: the tags of THINK and BRACKET ("" for NONE and HARMONY).
    starts_open: the generation prompt ends inside the reasoning (the reply starts in it).
    field: the message key the template reads earlier turns' reasoning from
        ("reasoning_content", "thinking", or "" when it reads none).
    """

    format: ReasoningFormat = ReasoningFormat.NONE
    open_tag: str = ""
    close_tag: str = ""
    starts_open: bool = False
    field: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        """Texts that count as tags when the vocabulary has them as one token."""
        if self.format == ReasoningFormat.HARMONY:
            return HARMONY_MARKERS
        return (self.open_tag, self.close_tag) if self.open_tag else ()

    @property
    def closing_text(self) -> str:
        """What a thinking budget injects to end the reasoning and start the answer."""
        if self.format == ReasoningFormat.HARMONY:
            return "<|end|><|start|>assistant<|channel|>final<|message|>"
        if self.format == ReasoningFormat.THINK:
            return "\n</think>\n\n"
        return self.close_tag

    def to_dict(self) -> dict:
        return {"format": str(self.format), "starts_open": self.starts_open, "field": self.field}


NO_REASONING = ReasoningSyntax()

_TAGS = {ReasoningFormat.THINK: ("<think>", "</think>"), ReasoningFormat.BRACKET: ("[THINK]", "[/THINK]")}


def detect_syntax(template: str | None, generation_prompt: str, single_token: Callable[[str], bool]) -> ReasoningSyntax:
    """The reasoning format of a model, from its chat template and vocabulary.

    Args:
        template: the GGUF's ``tokenizer.chat_template`` (None or "" when it has none: NONE).
        generation_prompt: the template's rendering of one user message with the
            generation prompt (to see whether it opens the reasoning).
        single_token: ``single_token(text)`` is True when the vocabulary encodes ``text``
            (with special-token parsing) as exactly one token.

    Harmony needs ``<|channel|>`` in the template and ``<|channel|>`` and ``<|message|>``
    as tokens; ``[THINK]`` or ``<think>`` need the tag in the template or both tags as
    tokens of the vocabulary. Raises nothing.
    """
    if not template:
        return NO_REASONING
    if "<|channel|>" in template and single_token("<|channel|>") and single_token("<|message|>"):
        return ReasoningSyntax(ReasoningFormat.HARMONY, field="thinking")
    for fmt in (ReasoningFormat.BRACKET, ReasoningFormat.THINK):
        open_tag, close_tag = _TAGS[fmt]
        in_template = open_tag in template or close_tag in template
        if in_template or (single_token(open_tag) and single_token(close_tag)):
            tail = generation_prompt.rstrip()
            starts_open = tail.endswith(open_tag)
            field = next((f for f in ("reasoning_content", "thinking") if f in template), "")
            return ReasoningSyntax(fmt, open_tag, close_tag, starts_open, field)
    return NO_REASONING


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningParser:
    """Splits one reply, fed in pieces, into reasoning and answer chunks.

    :meth:`feed` takes text (any split, also inside a tag), :meth:`feed_special` a marker
    the vocabulary encodes as one special token (e.g. ``"<|channel|>"``), :meth:`flush`
    releases what is held back at the end. Each returns a list of ``(kind, text)``.
    Attributes: ``opened`` (a reasoning block began), ``closed`` (it ended),
    ``in_reasoning`` (the next text would be reasoning).
    """

    def __init__(self, syntax: ReasoningSyntax):
        self.syntax = syntax
        self.harmony = syntax.format == ReasoningFormat.HARMONY
        self._buf = ""
        self.opened = self.closed = False
        # think/bracket states: "start", "reasoning", "answer_start", "answer"
        # harmony states: "start", "header", "body", "between", "answer"
        self._state = "start"
        self._lead = True  # reasoning: still at its start (leading whitespace dropped)
        self._channel = ""
        self._lead_answer = True  # harmony final channel: still at its start
        if syntax.format == ReasoningFormat.NONE:
            self._state = "answer"
        elif syntax.starts_open and not self.harmony:
            self._open()

    @property
    def in_reasoning(self) -> bool:
        if self.harmony:
            return self._state in ("header", "body", "between") and self.opened and not self.closed
        return self._state == "reasoning"

    def _open(self) -> None:
        self._state = "reasoning"
        self.opened, self.closed, self._lead = True, False, True

    # -- think / bracket ------------------------------------------------------------

    def feed(self, text: str) -> list[Chunk]:
        """Chunks for ``text`` (held-back text included once it is decided)."""
        if not text:
            return []
        if self._state == "answer" and not self._buf:
            return [(ANSWER, text)]
        self._buf += text
        return self._harmony_text() if self.harmony else self._run()

    def feed_special(self, marker: str) -> list[Chunk]:
        """Chunks for a special token spelling ``marker`` (a tag of this format, or a
        harmony marker); any other marker is fed as text."""
        if self.harmony:
            return self._harmony_special(marker)
        s = self.syntax
        if marker == s.open_tag and self._state in ("start", "answer_start", "answer"):
            out = self._drain_answer() if self._state == "answer" or self._buf.strip() else []
            self._buf = ""
            self._open()
            return out
        if marker == s.close_tag and self._state == "reasoning":
            out = self._reasoning_out(self._buf.rstrip())
            self._buf = ""
            self._state, self.closed = "answer_start", True
            return out
        if marker in (s.open_tag, s.close_tag):
            return []  # a stray tag token: not text
        return self.feed(marker)

    def flush(self) -> list[Chunk]:
        """What is still held back, at the end of the reply."""
        buf, self._buf = self._buf, ""
        if self.harmony:
            kind = REASONING if self._state == "body" and self._channel != "final" else ANSWER
            if self._state in ("header", "between"):
                return []
            return self._emit(kind, buf.rstrip() if kind == REASONING else buf)
        if self._state == "reasoning":
            return self._reasoning_out(buf.rstrip())
        if self._state == "answer_start":
            return []
        return [(ANSWER, buf)] if buf else []

    def _drain_answer(self) -> list[Chunk]:
        buf, self._buf = self._buf, ""
        return [(ANSWER, buf)] if buf else []

    def _reasoning_out(self, text: str) -> list[Chunk]:
        if self._lead:
            text = text.lstrip()
            if text:
                self._lead = False
        return [(REASONING, text)] if text else []

    def _run(self) -> list[Chunk]:
        out: list[Chunk] = []
        s = self.syntax
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if not head or (len(head) < len(s.open_tag) and s.open_tag.startswith(head)):
                    return out  # whitespace, or the start of the opening tag: wait
                if head.startswith(s.open_tag):
                    self._buf = head[len(s.open_tag):]
                    self._open()
                    continue
                self._state = "answer"
                out += self._drain_answer()
                return out
            if self._state == "reasoning":
                i = self._buf.find(s.close_tag)
                if i >= 0:
                    out += self._reasoning_out(self._buf[:i].rstrip())
                    self._buf = self._buf[i + len(s.close_tag):]
                    self._state, self.closed = "answer_start", True
                    continue
                hold = _held_prefix(self._buf, s.close_tag)
                body = self._buf[: len(self._buf) - hold]
                safe = body.rstrip()  # trailing whitespace waits: it is dropped before the tag
                out += self._reasoning_out(safe)
                self._buf = self._buf[len(safe):]
                return out
            if self._state == "answer_start":
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return out
                self._state = "answer"
            out += self._drain_answer()
            return out

    # -- harmony ---------------------------------------------------------------------

    def _emit(self, kind: str, text: str) -> list[Chunk]:
        if kind == REASONING:
            return self._reasoning_out(text)
        return [(ANSWER, text)] if text else []

    def _body_kind(self) -> str:
        return ANSWER if self._channel == "final" else REASONING

    def _harmony_text(self) -> list[Chunk]:
        if self._state == "start":
            if not self._buf.strip():
                return []
            self._state = "answer"  # no channel: the model answers in plain text
            return self._drain_answer()
        if self._state == "body":
            kind = self._body_kind()
            if kind == ANSWER:
                if self._lead_answer:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        return []
                    self._lead_answer = False
                return self._drain_answer()
            safe = self._buf.rstrip()
            self._buf = self._buf[len(safe):]
            return self._reasoning_out(safe)
        if self._state == "answer":
            return self._drain_answer()
        return []  # header and role text are collected (header) or dropped (between)

    def _harmony_special(self, marker: str) -> list[Chunk]:
        out: list[Chunk] = []
        if marker == "<|channel|>":
            if self._state == "body":
                out = self._end_body()
            self._state, self._buf = "header", ""
        elif marker == "<|message|>" and self._state == "header":
            self._channel = (self._buf.split() or [""])[0].split("<")[0]
            self._buf = ""
            self._state = "body"
            self._lead_answer = True
            if self._channel != "final" and not self.opened:
                self.opened, self._lead = True, True
            elif self._channel == "final" and self.opened:
                self.closed = True
        elif marker in ("<|end|>", "<|return|>", "<|call|>"):
            if self._state == "body":
                out = self._end_body()
            self._state, self._buf = "between", ""
        elif marker == "<|start|>":
            if self._state == "body":
                out = self._end_body()
            self._state, self._buf = "between", ""
        elif marker == "<|constrain|>":
            pass
        else:
            out = self.feed(marker)
        return out

    def _end_body(self) -> list[Chunk]:
        buf, self._buf = self._buf, ""
        if self._body_kind() == REASONING:
            return self._reasoning_out(buf.rstrip())
        return [(ANSWER, buf)] if buf else []


def parse(syntax: ReasoningSyntax, pieces: Iterable[str | tuple[str]]) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a whole reply: ``pieces`` are text, or 1-tuples holding a
    special marker. ``reasoning`` is None when no reasoning block was opened."""
    p = ReasoningParser(syntax)
    chunks: list[Chunk] = []
    for piece in pieces:
        chunks += p.feed_special(piece[0]) if isinstance(piece, tuple) else p.feed(piece)
    chunks += p.flush()
    reasoning = "".join(t for k, t in chunks if k == REASONING)
    return (reasoning if p.opened else None), "".join(t for k, t in chunks if k == ANSWER)


class ReasoningSplitter:
    """Feeds a :class:`ReasoningParser` token by token and measures the reasoning.

    Args:
        syntax: the model's format.
        specials: token id -> marker text, for the markers of ``syntax`` the vocabulary
            encodes as one token (see :func:`special_ids`).
        clock: seconds (``time.perf_counter``), for ``reasoning_ms``.

    :meth:`feed` takes one token's id and its text or bytes (bytes are decoded with an
    incremental UTF-8 decoder, so a character split over tokens comes out whole).
    Attributes after the reply: ``reasoning`` (None when no block was opened),
    ``answer``, ``reasoning_tokens`` (tokens from the block's first to the one that
    closed it), ``reasoning_ms`` (milliseconds from the first token to the close).
    """

    def __init__(self, syntax: ReasoningSyntax, specials: dict[int, str] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.parser = ReasoningParser(syntax)
        self.specials = specials or {}
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._clock = clock
        self._t_first: float | None = None
        self._t_closed: float | None = None
        self._parts = {REASONING: [], ANSWER: []}
        self.reasoning_tokens = 0

    @property
    def in_reasoning(self) -> bool:
        return self.parser.in_reasoning

    def feed(self, token: int, data: str | bytes) -> list[Chunk]:
        """Chunks for one generated token (``data`` its text, or its bytes)."""
        now = self._clock()
        if self._t_first is None:
            self._t_first = now
        was = self.parser.in_reasoning
        marker = self.specials.get(token)
        if marker is not None:
            chunks = self.parser.feed_special(marker)
        else:
            text = self._decoder.decode(data) if isinstance(data, bytes) else data
            chunks = self.parser.feed(text)
        if was or self.parser.in_reasoning:
            self.reasoning_tokens += 1
        if was and not self.parser.in_reasoning and self._t_closed is None:
            self._t_closed = now
        return self._keep(chunks)

    def flush(self) -> list[Chunk]:
        """What the parser held back (at the end of the reply)."""
        return self._keep(self.parser.flush())

    def _keep(self, chunks: list[Chunk]) -> list[Chunk]:
        for kind, text in chunks:
            self._parts[kind].append(text)
        return chunks

    @property
    def reasoning(self) -> str | None:
        return "".join(self._parts[REASONING]) if self.parser.opened else None

    @property
    def answer(self) -> str:
        return "".join(self._parts[ANSWER])

    @property
    def reasoning_ms(self) -> float:
        if self._t_first is None or not self.parser.opened:
            return 0.0
        end = self._t_closed if self._t_closed is not None else self._clock()
        return (end - self._t_first) * 1000


def special_ids(syntax: ReasoningSyntax, tokenize: Callable[[str, bool], list[int]]) -> dict[int, str]:
    """Token id -> marker for each marker of ``syntax`` that ``tokenize(text, True)``
    (special-token parsing on) encodes as exactly one token."""
    out: dict[int, str] = {}
    for marker in syntax.markers:
        ids = tokenize(marker, True)
        if len(ids) == 1:
            out[int(ids[0])] = marker
    return out


# -- the engine's side: a model's syntax, the thinking budget, a test grammar ---------------

GRAMMAR_ENV = "BRANCHWISE_TEST_GRAMMAR"
"""Internal, for tests: a GBNF file every reply is sampled with (``llama_cpp.LlamaGrammar``),
so a model that never thinks can be made to write ``<think>…</think>answer``."""


def model_syntax(template: str | None, prompts, tokenize: Callable[[str, bool], list[int]]) -> tuple[ReasoningSyntax, dict[int, str]]:
    """``(syntax, specials)`` of a loaded model: :func:`detect_syntax` on its template (NONE
    when ``prompts``, an ``engine.chat_template.PromptBuilder``, fell back to ChatML) and
    :func:`special_ids` for its markers. Raises nothing: a template that cannot render a
    lone user message is taken to open no reasoning."""
    from engine.chat_template import ChatMessage, PromptFormat  # noqa: PLC0415 - no import cycle at load

    if prompts.format != PromptFormat.MODEL_TEMPLATE:
        return NO_REASONING, {}
    try:
        generation_prompt = prompts.render([ChatMessage("user", "Hello")])
    except Exception:  # noqa: BLE001 - a template error is judged per request, as before
        generation_prompt = ""
    syntax = detect_syntax(template, generation_prompt, lambda text: len(tokenize(text, True)) == 1)
    return syntax, special_ids(syntax, tokenize)


def grammar_from_env():
    """The ``llama_cpp.LlamaGrammar`` of :data:`GRAMMAR_ENV`, or None when it is not set."""
    import os  # noqa: PLC0415

    path = os.environ.get(GRAMMAR_ENV)
    if not path:
        return None
    import llama_cpp  # noqa: PLC0415 - the engine process only

    return llama_cpp.LlamaGrammar.from_file(path, verbose=False)


class ReasoningSteer:
    """One reply's reasoning, seen from the decoding loop.

    :meth:`wrap` turns the engine's ``on_token(text, token)`` into one that feeds the
    splitter and passes answer text to ``on_token`` and reasoning text to
    ``on_reasoning(text, token)``. With a ``budget`` (tokens of reasoning), once that
    many reasoning tokens were generated :meth:`forced` hands out the tokens of the
    syntax's closing text (``closing_ids``) one by one, which the loop feeds instead of
    sampling, so the model goes on with its answer; None otherwise.
    """

    def __init__(self, syntax: ReasoningSyntax, specials: dict[int, str], budget: int | None = None,
                 closing_ids: list[int] | None = None):
        self.splitter = ReasoningSplitter(syntax, specials)
        self.budget = budget
        self._closing = list(closing_ids or [])
        self._queue: list[int] = []
        self.budget_hit = False

    def forced(self) -> int | None:
        """The next token to feed instead of sampling one, or None."""
        if self._queue:
            return self._queue.pop(0)
        if (self.budget is not None and not self.budget_hit and self.splitter.in_reasoning
                and self.splitter.reasoning_tokens >= self.budget and self._closing):
            self.budget_hit = True
            self._queue = self._closing[1:]
            return self._closing[0]
        return None

    def wrap(self, on_token, on_reasoning):
        def feed(text: str, token: int) -> None:
            for kind, piece in self.splitter.feed(token, text):
                self._send(kind, piece, token, on_token, on_reasoning)

        self._callbacks = (on_token, on_reasoning)
        return feed

    def finish(self) -> None:
        """Release what the parser held back (call once, after the last token)."""
        on_token, on_reasoning = getattr(self, "_callbacks", (None, None))
        for kind, piece in self.splitter.flush():
            self._send(kind, piece, -1, on_token, on_reasoning)

    @staticmethod
    def _send(kind, piece, token, on_token, on_reasoning) -> None:
        target = on_reasoning if kind == REASONING else on_token
        if target is not None:
            target(piece, token)
