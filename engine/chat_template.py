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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import TemplateError

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SENTINEL = "\ue000bw{}\ue001"  # private-use code points: never in a template's own text
_SENTINEL_RE = re.compile("\ue000bw(\\d+)\ue001")


@dataclass(frozen=True)
class ChatMessage:
    """One message of the prompt. ``token_ids`` are the generated ids of an assistant reply."""

    role: str
    content: str
    token_ids: Sequence[int] | None = None


    def to_dict(self) -> dict:
        """The form the engine process receives (``engine.worker``)."""
        ids = [int(t) for t in self.token_ids] if self.token_ids is not None else None
        return {"role": self.role, "content": self.content, "token_ids": ids}


def conversation_messages(system_prompt: str, path) -> list[ChatMessage]:
    """The engine's view of a conversation path (records with role, content, token_ids,
    such as ``storage.chats.Message``): the system prompt first when it is not blank, then
    the user and assistant messages, assistant ones with the ids that were generated."""
    out = [ChatMessage("system", system_prompt)] if system_prompt.strip() else []
    out += [ChatMessage(m.role, m.content, m.token_ids if m.role == "assistant" else None)
            for m in path if m.role in ("user", "assistant")]
    return out


Tokenize = Callable[[str, bool], list[int]]  # (text, parse_special) -> ids, no BOS


class PromptBuilder:
    """Builds prompt token ids for a list of :class:`ChatMessage`.

    Args:
        template: Jinja chat template text (None or "" for ChatML).
        tokenize: ``tokenize(text, parse_special) -> ids`` without BOS.
        bos_token / eos_token: the texts the template may reference.
        bos_id: prepended when ``add_bos`` and the rendered text does not begin with BOS.
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
    ):
        env = ImmutableSandboxedEnvironment(
            loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True
        )

        def raise_exception(message: str):
            raise TemplateError(f"The model's chat template refused these messages: {message}")

        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(template or CHATML_TEMPLATE)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"The model's chat template is invalid: {exc}") from exc
        self._tokenize = tokenize
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id, self.add_bos = bos_id, add_bos

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The template's text for ``messages`` (for display and debugging)."""
        return self._render([{"role": m.role, "content": m.content} for m in messages], add_generation_prompt)

    def _render(self, msgs: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self._template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except Exception as exc:  # jinja2 errors and template-side type errors
            raise TemplateError(f"The model's chat template failed: {exc}") from exc

    def build(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        """Prompt token ids for ``messages``, ending with the assistant's turn header."""
        placeholders = [{"role": m.role, "content": _SENTINEL.format(i)} for i, m in enumerate(messages)]
        text = self._render(placeholders, add_generation_prompt)
        found = [int(g) for g in _SENTINEL_RE.findall(text)]
        if found != list(range(len(messages))):
            # The template transforms or reorders content; render it for real. Prefix
            # stability may suffer, correctness does not.
            return self._with_bos(self._fallback(messages, add_generation_prompt))

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
            m = messages[int(match.group(1))]
            if m.role == "assistant" and m.token_ids is not None:
                flush()
                ids.extend(int(t) for t in m.token_ids)
            elif self._is_plain(m.content):
                pending.append(m.content)
            else:
                flush()
                ids.extend(self._tokenize(m.content, False))
        pending.append(text[pos:])
        flush()
        return self._with_bos(ids)

    def _is_plain(self, content: str) -> bool:
        """True when parsing special tokens in ``content`` changes nothing."""
        return "<" not in content and "[" not in content or (
            self._tokenize(content, True) == self._tokenize(content, False)
        )

    def _fallback(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> list[int]:
        if not all(self._is_plain(m.content) for m in messages):
            raise TemplateError(
                "This model's chat template cannot safely include text that looks like "
                "control tokens. Remove them from the message."
            )
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        return self._tokenize(self._render(msgs, add_generation_prompt), True)

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            return [self.bos_id, *ids]
        return ids
