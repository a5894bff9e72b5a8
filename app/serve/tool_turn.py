"""One served request's tools on the local engine: what the template is given, the grammar,
and the reply read back as tool calls.

* The request's ``tools`` go to the model's own chat template (``Engine.generate(tools=)``,
  rendered in the bounded sandbox), also with ``tool_choice: "none"``, so every step of a
  tool loop renders the same system text and the prompt stays a token-prefix of the last.
* A template with no tool support (``ToolFormat.GENERIC``: SmolLM2's, the ChatML
  fallback) is refused when the model may call a tool: :data:`NO_TOOLS_IN_TEMPLATE`, a
  400. With ``tool_choice: "none"`` its tools are left out and the reply is text.
* ``"required"`` or a named function samples under
  ``engine.tool_grammar.tool_call_grammar``: the reply is a call of a listed tool whose
  arguments fit its schema, by construction.
* The reply streams through :class:`app.serve.tool_stream.ToolStream` as the engine's text;
  at its end the calls are read from its token ids with control tokens shown
  (``<|python_tag|>``, ``[TOOL_CALLS]``, gpt-oss's channels: the text leaves them out).
"""

from __future__ import annotations

from app.serve.tool_protocol import ToolRequest, calls_key
from app.serve.tool_stream import Delta, ToolStream
from engine.tool_calls import ToolFormat, reply_text_with_controls

__all__ = ["NO_TOOLS_IN_TEMPLATE", "ToolTurn"]

NO_TOOLS_IN_TEMPLATE = (
    "The model's chat template has no tool support (it does not render 'tools' or tool calls), so this server "
    "cannot offer the model tools: load a model whose template supports them (Qwen 2.5 and 3, Hermes, Llama 3.1 "
    "and later, Mistral, gpt-oss), or send tool_choice \"none\".")


class ToolTurn:
    """The tools of one request on an ``engine.core.Engine``.

    Attributes:
        render_tools: the tools for the template (None: none rendered).
        grammar: GBNF text the reply is sampled with (None: unconstrained).
        stream: the reply's splitter (None when the model may not call a tool).

    Raises:
        ApiError: 400 for tools on a template without tool support, or a schema the
            grammar cannot enforce (the message names the tool).
    """

    def __init__(self, engine, req: ToolRequest, emit, scanner, cancel):
        from app.serve.protocol import ApiError  # noqa: PLC0415 - protocol imports tool_protocol
        from engine.tool_grammar import GrammarError, tool_call_grammar  # noqa: PLC0415 - llama_cpp inside

        self.emit, self.scanner, self.cancel = emit, scanner, cancel  # the job's (app/serve/server.py)
        self.render_tools, self.grammar, self.stream = None, None, None
        if not req.tools:
            return  # nothing of the engine is asked (a request without tools, any engine)
        self.model = engine.model
        fmt = self.model.prompts.tool_format
        if req.active and fmt is ToolFormat.GENERIC:
            raise ApiError(400, NO_TOOLS_IN_TEMPLATE, param="tools", code="tools_not_supported")
        self.render_tools = req.tools if fmt is not ToolFormat.GENERIC else None
        if req.forced:
            try:
                self.grammar = tool_call_grammar(fmt, req.tools, only=req.named, parallel=req.parallel)
            except GrammarError as exc:
                raise ApiError(400, str(exc), param="tools", code="invalid_value") from None
        self.stream = ToolStream(fmt, req.tools, live=req.forced) if req.active else None

    def on_token(self, delta: str) -> None:
        """Read the reply's next text (control tokens left out; the end reads them from the
        ids) and send the events it makes ready."""
        self._send(self.stream.feed(delta))

    def _send(self, deltas: list[Delta]) -> None:
        """Tool deltas as "tool" events; content through the stop scanner as "token" events."""
        for d in deltas:
            if d.kind != "content":
                self.emit("tool", d)
                continue
            safe = self.scanner.feed(d.text)
            if self.scanner.stopped:
                self.cancel.set()  # a stop sequence: end decoding here
            if safe:
                self.emit("token", safe)

    def end(self, result) -> list[dict]:
        """Settle the reply (``ToolStream.finish`` on the text of ``result.token_ids`` with
        control tokens shown, when it has no reasoning apart), send what is left; returns its
        calls as OpenAI objects (none when there is no stream, it was cancelled, or a stop
        sequence cut it). A call the token limit cut sends no content (its partial markup
        is not text)."""
        if self.stream is None or result.stats.finish_reason == "cancelled":
            return []
        full = None
        if result.reasoning is None and result.token_ids:
            full = reply_text_with_controls(self.model, result.token_ids)
        cut = result.stats.finish_reason in ("length", "context")  # max_tokens or the context window
        _content, calls, out = self.stream.finish(full, cut=cut)
        self._send(out)
        return [c.to_openai() for c in calls] if not self.scanner.stopped else []

    def remember(self, memory, model_key: bytes, content: str, calls: list[dict], ids: list[int]) -> None:
        """Keep the reply's generated ``ids`` in ``memory`` (``app.serve.replies.ReplyMemory``)
        under the calls as sent, so the reply resent as those calls stands as those ids."""
        if ids:
            memory.remember(model_key, calls_key(content, calls), ids)
