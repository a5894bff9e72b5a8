"""Turn a conversation into prompt token ids with the model's own chat template.

Three promises, because the prefix store matches prompts by token ids, not by text:

* **Prefix stability.** The prompt of turn k is a token-prefix of the prompt of turn k+1,
  so the KV computed for turn k is reused. The template is rendered once with a
  sentinel in place of every message's content; the text between assistant messages is
  tokenized in one piece, and an assistant message that was generated contributes the
  exact token ids that were generated, never a re-tokenization of its text.
* **User text is text.** Content is tokenized with special-token parsing only if that
  yields the same ids as parsing it as plain text; otherwise it is tokenized on its own
  as plain text, so typing ``<|im_start|>`` can never produce a control token.
* **The GGUF's template.** ``tokenizer.chat_template`` is rendered in a sandboxed Jinja
  environment (as llama-cpp-python's ``Jinja2ChatFormatter`` does); models without one
  get ChatML.

The template is data from a downloaded file, so it renders in a bounded sandbox
(:mod:`engine.template_sandbox`: time, size, range and integer limits; a breach raises
:class:`TemplateLimitError`).

A model whose template is missing, blank, or leaves out the user's message gets ChatML
with a reason in :attr:`PromptBuilder.note`; since ChatML's markers are plain text to such
a model's tokenizer, :meth:`PromptBuilder.stop_matcher` then stops the reply at the first
marker, before it is shown or saved (:mod:`engine.stop_strings`).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from engine.errors import TemplateError
from engine.stop_strings import StopMatcher, Tokenize
from engine.tool_calls import ToolFormat, detect_format, generic_chat_messages, template_message
from engine.thinking_control import ThinkingControl, detect_control, template_variables, with_flag
from engine.template_sandbox import (  # re-exported: importers name them from here
    MAX_INT_BITS,
    MAX_OUTPUT_CHARS,
    MAX_RANGE,
    RENDER_TIME_LIMIT_S,
    BoundedSandbox,
    RenderGuard,
    TemplateLimitError,
    TemplateLoadError,
    compile_template,
    render_bounded,
)

__all__ = [
    "CHATML_STOP_STRINGS", "CHATML_TEMPLATE", "MAX_INT_BITS", "MAX_OUTPUT_CHARS", "MAX_RANGE",
    "RENDER_TIME_LIMIT_S", "TOKEN_CACHE_CHARS", "BoundedSandbox", "ChatMessage", "PromptBuilder",
    "PromptFormat", "RenderGuard", "StopMatcher", "TemplateLimitError", "TemplateLoadError",
    "TokenCache", "Tokenize", "compile_template", "conversation_messages",
    "disable_library_chat_templates", "render_bounded", "template_from_metadata",
]

CHATML_STOP_STRINGS = ("<|im_end|>", "<|im_start|>")


class PromptFormat(StrEnum):
    """Where the prompt format comes from (shown in model info and ``--json``)."""

    MODEL_TEMPLATE = "model template"  # the GGUF's tokenizer.chat_template
    CHATML_FALLBACK = "ChatML fallback"  # no usable template: ChatML with stop strings


CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SENTINEL = "\ue000bw{}\ue001"  # private-use code points: never in a template's own text
_SENTINEL_RE = re.compile("\ue000b([wr])(\\d+)\ue001")  # w: a message's content, r: its reasoning
_REASONING_SENTINEL = "\ue000br{}\ue001"
REASONING_FIELDS = ("reasoning_content", "thinking")
"""Keys an earlier assistant turn's reasoning is passed in: Qwen3-style templates (and
DeepSeek's API) read ``reasoning_content``, gpt-oss's reads ``thinking``. A template that
reads neither never sees the reasoning."""


def _message_dict(m: ChatMessage, content: str, reasoning: str | None = None) -> dict:
    """A message as the template sees it (``engine.tool_calls.template_message``: tool
    calls and results), the reasoning of an assistant reply in the keys of
    :data:`REASONING_FIELDS` (only when it has one)."""
    d = template_message(m, content)
    if m.role == "assistant" and m.reasoning is not None:
        for key in REASONING_FIELDS:
            d[key] = m.reasoning if reasoning is None else reasoning
    return d


@dataclass(frozen=True)
class ChatMessage:
    """One message of the prompt. ``token_ids`` are the generated ids of an assistant reply;
    ``reasoning`` its thinking when a reasoning model wrote one (None: none), ``content``
    then being the answer alone (see :meth:`PromptBuilder.build`)."""

    role: str
    content: str
    token_ids: Sequence[int] | None = None
    reasoning: str | None = None
    tool_calls: tuple[dict, ...] | None = None  # an assistant's calls, OpenAI's objects
    tool_call_id: str | None = None  # a "tool" message: the call it answers
    name: str | None = None  # a "tool" message: the tool's name

    def to_dict(self) -> dict:
        """The form the engine process receives (``engine.worker``)."""
        ids = [int(t) for t in self.token_ids] if self.token_ids is not None else None
        out = {"role": self.role, "content": self.content, "token_ids": ids, "reasoning": self.reasoning}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = list(self.tool_calls) if key == "tool_calls" else getattr(self, key)
        return out

    def template_dict(self, content: str, reasoning: str | None = None) -> dict:
        """The message as a chat template sees it, with ``content`` in place of its own
        (tool calls' arguments as objects, as templates that loop over them expect; the
        reasoning of an assistant reply in :data:`REASONING_FIELDS`, ``reasoning`` in place
        of it when given)."""
        return _message_dict(self, content, reasoning)


def conversation_messages(system_prompt: str, path) -> list[ChatMessage]:
    """The engine's view of a conversation path (records with role, content, token_ids,
    such as ``storage.chats.Message``): the system prompt first when it is not blank, then
    the user and assistant messages, assistant ones with the ids that were generated."""
    out = [ChatMessage("system", system_prompt)] if system_prompt.strip() else []
    out += [_path_message(m) for m in path if m.role in ("user", "assistant", "tool")]
    return out


def _path_message(m) -> ChatMessage:
    """One stored message as the engine sees it; a tool step's fields (``m.tool``: an
    assistant's ``tool_calls``, a result's ``tool_call_id`` and ``name``) go with it, and an
    assistant's calls are rendered by the template rather than replayed as ids."""
    tool = getattr(m, "tool", None) or {}
    if m.role == "tool":
        return ChatMessage("tool", m.content, tool_call_id=tool.get("tool_call_id"), name=tool.get("name"))
    if m.role == "assistant" and tool.get("tool_calls"):
        return ChatMessage("assistant", m.content, None, getattr(m, "reasoning", None),
                           tool_calls=tuple(tool["tool_calls"]))
    return ChatMessage(m.role, m.content, m.token_ids if m.role == "assistant" else None,
                       getattr(m, "reasoning", None) if m.role == "assistant" else None)


def template_from_metadata(metadata: dict, read_raw: Callable[[str], bytes | None]) -> tuple[str | None, str]:
    """``(template text or None, why it is None)`` from a model's GGUF metadata.

    llama-cpp-python (``Llama.__init__``, ``_internals.LlamaModel.metadata``) decodes every
    metadata string as UTF-8 and, if one fails, replaces the whole metadata with ``{}``.
    Then the template is read again on its own with ``read_raw(key)`` (the raw bytes,
    e.g. through ``llama_model_meta_val_str``); if that is not UTF-8 either, the reason
    says so, so the ChatML fallback is stated rather than silent.
    """
    key = "tokenizer.chat_template"
    text = metadata.get(key)
    if text is not None or metadata:
        return text, ""
    raw = read_raw(key)
    if raw is None:
        return None, ("The model file has no chat template (and some of its metadata is not valid UTF-8 "
                      "text, so llama-cpp-python could not read any of it)")
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, "The model's chat template is not valid UTF-8 text, so it cannot be used"


class _InertChatFormatter:
    """Stands in for llama-cpp-python's ``Jinja2ChatFormatter`` while a model loads."""

    def __init__(self, *args, **kwargs):
        pass

    def to_chat_handler(self):
        def handler(*args, **kwargs):
            raise TemplateError("Branchwise renders chat templates itself (engine.chat_template).")

        return handler


def disable_library_chat_templates() -> None:
    """Keep llama-cpp-python from compiling the GGUF's chat templates, for this process.

    ``Llama.__init__`` (llama_cpp/llama.py) compiles every ``tokenizer.chat_template*``
    string of the GGUF with ``llama_chat_format.Jinja2ChatFormatter``, in a sandbox with no
    limits; jinja2 folds constant expressions at compile time, so a template holding
    ``{{ 3 ** 10000000000 }}`` or ``{{ 'x' * 10**10 }}`` would hang the load or exhaust
    memory before Branchwise sees it, and a syntax error would escape as a raw
    ``TemplateSyntaxError``. Branchwise never uses llama-cpp-python's chat handlers
    (prompts are built by :class:`PromptBuilder`, bounded), so an inert stand-in replaces
    the formatter: ``Llama.create_chat_completion`` is unusable in a process that calls
    this (``engine.model`` does, at import). Calling it again is harmless."""
    from llama_cpp import llama_chat_format  # noqa: PLC0415 - only the engine process needs it

    llama_chat_format.Jinja2ChatFormatter = _InertChatFormatter


# -- prompts ----------------------------------------------------------------------------


TOKEN_CACHE_CHARS = 4_000_000
"""Most characters of text whose token ids :class:`TokenCache` keeps (a few MB of ids)."""


class TokenCache:
    """``tokenize`` that keeps the ids of recent long texts.

    A prompt is built again for every request, context count, tree figure and keystroke
    prewarm, and all of it but the newest message is the same text as the time before:
    :meth:`PromptBuilder.build` tokenizes it in segments (template text and plain message
    content up to each assistant reply), so every segment but the last is a hit. Texts
    under 256 characters are not kept (tokenizing them costs about what a lookup does);
    the rest are kept least-recently-used first up to :data:`TOKEN_CACHE_CHARS`.
    Thread-safe; the ids are those ``tokenize`` returned, so a hit changes nothing.
    """

    def __init__(self, tokenize: Tokenize, max_chars: int = TOKEN_CACHE_CHARS):
        self._tokenize = tokenize
        self._max_chars = max_chars
        self._entries: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __call__(self, text: str, parse_special: bool) -> list[int]:
        if len(text) < 256 or len(text) > self._max_chars:
            return self._tokenize(text, parse_special)
        key = (text, parse_special)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return list(hit)
        ids = self._tokenize(text, parse_special)
        with self._lock:
            self.misses += 1
            if key not in self._entries:
                self._entries[key] = tuple(ids)
                self._chars += len(text)
                while self._chars > self._max_chars:
                    (old, _), _ids = self._entries.popitem(last=False)
                    self._chars -= len(old)
        return ids


class PromptBuilder:
    """Builds prompt token ids for a list of :class:`ChatMessage`.

    Args:
        template: Jinja chat template text (None or blank for ChatML).
        tokenize: ``tokenize(text, parse_special) -> ids`` without BOS.
        bos_token / eos_token: the texts the template may reference.
        bos_id: prepended when ``add_bos`` and the rendered text does not begin with BOS.
        missing_reason: why ``template`` is None, when it is known (shown in :attr:`note`).
        saved_ids: ``usable(ids, text)``: whether a reply's saved ids may stand for it
            (``engine.generated_ids.SavedIds``); the text is tokenized when not.

    Attributes:
        format: a :class:`PromptFormat`.
        note: "" with the model's own template, else a sentence saying which format is
            used instead and why (for model info, the status bar and ``--json``).
        stop_strings: texts that end a reply (ChatML's markers with the fallback).

    Raises:
        TemplateLoadError: the template has a syntax error, or cannot render one user
            message within the limits.
    """

    def __init__(
        self,
        template: str | None,
        tokenize: Tokenize,
        *,
        bos_token: str = "",
        eos_token: str = "",
        bos_id: int | None = None,
        add_bos: bool = False,
        missing_reason: str = "",
        saved_ids: Callable[[Sequence[int], str], bool] | None = None,
    ):
        self._tokenize = TokenCache(tokenize)
        self._saved_ids_usable = saved_ids  # engine.generated_ids.SavedIds.usable: None trusts every id
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id, self.add_bos = bos_id, add_bos
        self.format = PromptFormat.MODEL_TEMPLATE
        self.note = ""
        self.stop_strings: tuple[str, ...] = ()
        self.tool_format = ToolFormat.GENERIC  # the tool-call syntax (engine.tool_calls)
        self.thinking_control = ThinkingControl.NONE  # what a chat may set (engine.thinking_control)
        if template is None or not template.strip():
            why = missing_reason or ("The model file has no chat template" if template is None
                                     else "The model's chat template is blank")
            self._use_chatml(why)
            return
        self._template = compile_template(template)
        self.tool_format = detect_format(template)
        self.thinking_control = detect_control(template)
        probe = "Hello \u2013 what is 2+2?"
        try:
            text = self._render([{"role": "user", "content": probe}], True)
        except TemplateLimitError as exc:
            raise TemplateLoadError(str(exc)) from exc
        except TemplateError:
            return  # refuses a lone user message (some templates want a system one): judged per request
        if probe not in text:
            self._use_chatml("The model's chat template leaves out the user's message")

    def _use_chatml(self, why: str) -> None:
        self._template = compile_template(CHATML_TEMPLATE)
        self.format = PromptFormat.CHATML_FALLBACK
        self.tool_format = ToolFormat.GENERIC
        self.thinking_control = ThinkingControl.NONE
        self.stop_strings = CHATML_STOP_STRINGS
        self.note = (f"{why}, so Branchwise uses the ChatML prompt format and ends each reply at "
                     "ChatML's <|im_end|> marker. Replies may be poor: this may be a base model, "
                     "not one tuned for chat.")

    def stop_matcher(self) -> StopMatcher | None:
        """A fresh :class:`StopMatcher` for one reply, or None when the model's own
        template ends its turns (with an end-of-generation token)."""
        return StopMatcher(self.stop_strings) if self.stop_strings else None

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
               thinking: str = "") -> str:
        """The template's text for ``messages`` (for display and debugging); ``thinking`` as in :meth:`build`."""
        messages = with_flag(self.thinking_control, thinking, messages)
        return self._render([_message_dict(m, m.content) for m in messages], add_generation_prompt,
                            variables=template_variables(self.thinking_control, thinking))

    def _render(self, msgs: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None,
                variables: dict | None = None) -> str:
        extra = {**(variables or {}), **({"tools": tools} if tools else {})}
        try:
            return render_bounded(
                self._template,
                **extra,
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja2 errors and template-side type errors
            raise TemplateError(f"The model's chat template failed: {exc}") from exc

    def build(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True,
              tools: list[dict] | None = None, thinking: str = "") -> list[int]:
        """Prompt token ids for ``messages``, ending with the assistant's turn header.
        ``tools`` (OpenAI's function objects) are rendered by the template, or with
        :attr:`tool_format` GENERIC described in a system message (``engine.tool_calls``).

        An assistant reply with ``reasoning`` (not None) goes to the template with the
        answer as ``content`` and the reasoning in :data:`REASONING_FIELDS`; whatever the
        template keeps of the two is tokenized as text (the reply's generated ids hold
        the thinking, which most templates drop from earlier turns).

        ``thinking`` is a chat's thinking setting (``engine.thinking_control``: "" the
        template's default, "off", or an effort "low" / "medium" / "high"); one that
        :attr:`thinking_control` does not take changes nothing."""
        variables = template_variables(self.thinking_control, thinking)
        flagged = with_flag(self.thinking_control, thinking, messages)
        if flagged != list(messages):  # the template reads the flag from the text, which the sentinels hide
            return self._with_bos(self._fallback(flagged, add_generation_prompt, tools, variables))
        if self.tool_format is ToolFormat.GENERIC and (tools or any(m.tool_calls or m.role == "tool" for m in messages)):
            messages, tools = generic_chat_messages(messages, tools), None
        placeholders = [m.template_dict(_SENTINEL.format(i), _REASONING_SENTINEL.format(i))
                        for i, m in enumerate(messages)]
        text = self._render(placeholders, add_generation_prompt, tools, variables)
        found = [int(i) for kind, i in _SENTINEL_RE.findall(text) if kind == "w"]
        if found != list(range(len(messages))):
            # The template transforms or reorders content; render it for real. Prefix
            # stability may suffer, correctness does not.
            return self._with_bos(self._fallback(messages, add_generation_prompt, tools, variables))

        ids: list[int] = []
        pending: list[str] = []

        def flush():
            if pending:
                ids.extend(self._tokenize("".join(pending), True))
                pending.clear()

        pos = 0
        for match in _SENTINEL_RE.finditer(text):
            pending.append(text[pos : match.start()])
            pos = match.end()
            m = messages[int(match.group(2))]
            content = m.content if match.group(1) == "w" else (m.reasoning or "")
            if m.role == "tool" and text[match.start() - 1 : match.start()] == text[match.end() : match.end() + 1] == '"':
                content = json.dumps(content, ensure_ascii=False)[1:-1]  # the template tojson'd a tool result
            if (m.role == "assistant" and m.token_ids is not None and m.reasoning is None
                    and (self._saved_ids_usable is None or self._saved_ids_usable(m.token_ids, m.content))):
                flush()
                ids.extend(int(t) for t in m.token_ids)
            elif self._is_plain(content):
                pending.append(content)
            else:
                flush()
                ids.extend(self._tokenize(content, False))
        pending.append(text[pos:])
        flush()
        return self._with_bos(ids)

    def _is_plain(self, content: str) -> bool:
        """True when parsing special tokens in ``content`` changes nothing."""
        return "<" not in content and "[" not in content or (
            self._tokenize(content, True) == self._tokenize(content, False)
        )

    def _fallback(self, messages: Sequence[ChatMessage], add_generation_prompt: bool,
                  tools: list[dict] | None = None, variables: dict | None = None) -> list[int]:
        if not all(self._is_plain(m.content) and self._is_plain(m.reasoning or "") for m in messages):
            raise TemplateError(
                "This model's chat template cannot safely include text that looks like "
                "control tokens. Remove them from the message."
            )
        msgs = [m.template_dict(m.content) for m in messages]
        return self._tokenize(self._render(msgs, add_generation_prompt, tools, variables), True)

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            return [self.bos_id, *ids]
        return ids
