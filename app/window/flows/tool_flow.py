"""The window's tool loop over MCP servers (issue #28, item 4).

When tools are on (Settings → Tools), some tool of a server is switched on, and the model's
template supports tools (``ModelFacts.tool_format`` is not "generic"), every reply's request
carries the enabled tools (``request_args``), rendered by the model's own chat template.
A saved reply is read for calls (``engine.tool_calls.parse_reply`` on the reply's token ids
as text with control tokens shown, ``DoneEvent.tool_text``, as ``branchwise serve`` reads
them: Mistral's ``[TOOL_CALLS]``, Llama 3's ``<|python_tag|>`` and gpt-oss's channels are
control tokens the reply's text leaves out); when it has some:

1. the reply is stored as an assistant message with ``tool_calls`` (its text without them);
2. each call asks first (``ToolApprovalDialog``: tool, server, arguments): Allow once,
   Always for this tool, or Deny. Nothing runs before that. "Always" is kept in
   settings.json (``mcp_always_allow``: server → tool → the server's command line or URL
   when it was given), shown and revoked in Settings → Tools; a server whose command line
   changed since asks again.
   A denied call's result is :data:`DENIED`; a call of a tool that is not offered, or with
   arguments that are not a JSON object, gets an error without asking;
3. an allowed call runs on the ``McpHub`` thread (``app.session.mcp_servers``: 30 s, 32 KB;
   one live connection per server for the window's life, its stderr in
   ``<data dir>/logs/mcp-servers.log``);
   its result is stored as a ``role: "tool"`` message under the call (the tree keeps every
   step, so a branch can start at any of them);
4. the next reply starts under the last result, until a reply has no calls or
   :data:`MAX_STEPS` replies were made in one loop (then it says so in the banner).

Stop (Esc, the Stop button, closing the dialog) ends the loop at any step: a reply being
generated is cancelled as usual; a call being asked or run is abandoned (its future is
cancelled) and nothing more is stored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.session.mcp_servers import McpHub, McpServerConfig, McpTool, ToolOutcome
from app.window.flows.tool_approval import Approval, ToolApprovalDialog
from engine.tool_calls import ToolCall, ToolFormat, parse_reply

log = logging.getLogger(__name__)

__all__ = ["DENIED", "MAX_STEPS", "ToolFlow"]

MAX_STEPS = 8
"""Replies one user message may get in a tool loop (each after the first answers results)."""
DENIED = "The user declined this call."
"""What the model gets for a call the user denied."""


class ToolFlow(QObject):
    """The tool loop of a ``ChatController`` (``chat``): ``parent`` owns the dialogs.

    Signals: ``asked(ToolApprovalDialog)`` when a call's question opens (for tests and
    accessibility), ``ran(message_id)`` when a result was stored, ``_finished(object)``
    (internal: a call's outcome, from the hub's thread to the UI thread)."""

    asked = Signal(object)
    ran = Signal(int)
    _finished = Signal(object, object)  # (token, ToolOutcome)

    def __init__(self, chat, settings, facts: Callable[[], dict], parent, hub: McpHub | None = None):
        super().__init__(chat)
        self.chat, self.settings, self.facts, self.parent_widget = chat, settings, facts, parent
        self._hub = hub
        self.steps = 0  # replies in the current loop
        self.dialog: ToolApprovalDialog | None = None
        self._future = None
        self._queue: list[ToolCall] = []
        self._parent_id: int | None = None  # where the next step is stored
        self._token: object | None = None  # the call being run (an outcome of another is dropped)
        self._step = False  # the reply being generated answers tool results
        self._finished.connect(self._outcome)
        chat.reply_finished.connect(self.reply_saved)

    @property
    def hub(self) -> McpHub:
        """The MCP client (made at first use: ``McpHub`` with its default bounds, the
        servers' stderr in :attr:`log_path`). Settings → Tools lists tools through it too."""
        if self._hub is None:
            self._hub = McpHub(errlog=self.log_path)
        return self._hub

    @property
    def log_path(self) -> Path | None:
        """``<data dir>/logs/mcp-servers.log`` (None when the settings have no data folder)."""
        data_dir = getattr(self.settings, "data_dir", None)
        if data_dir is None:
            return None
        logs = Path(data_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return logs / "mcp-servers.log"

    @property
    def always(self) -> set[tuple[str, str]]:
        """(server, tool) pairs allowed always whose server's command line is unchanged."""
        where = {s.name: s.where for s in self.servers()}
        return {(server, tool) for server, tools in (self.settings.mcp_always_allow or {}).items()
                for tool, was in tools.items() if where.get(server) == was}

    def allow_always(self, server: McpServerConfig, tool: str) -> None:
        """Keep "always allow ``tool`` of ``server``" in settings.json, with its command line."""
        kept = {k: dict(v) for k, v in (self.settings.mcp_always_allow or {}).items()}
        kept.setdefault(server.name, {})[tool] = server.where
        self.settings.update(mcp_always_allow=kept)

    @hub.setter
    def hub(self, hub: McpHub) -> None:
        self._hub = hub

    @property
    def busy(self) -> bool:
        """True while a call is asked or runs (no reply is being generated then)."""
        return self.dialog is not None or self._token is not None

    # -- what a request carries ---------------------------------------------------------

    def settings_changed(self) -> None:
        """Settings closed: connections to servers no longer listed (or listed with another
        command line) end now, not at the window's close."""
        if self._hub is not None:
            self._hub.keep_only(self.servers())

    def servers(self) -> list[McpServerConfig]:
        return [McpServerConfig.from_dict(n, e) for n, e in (self.settings.mcp_servers or {}).items()]

    def tools(self) -> list[McpTool]:
        """The enabled tools of every server (as last listed in Settings)."""
        out = []
        for name, entry in (self.settings.mcp_servers or {}).items():
            off = set(entry.get("disabled_tools") or [])
            out += [McpTool(name, t["name"], t.get("description", ""), t.get("schema") or {})
                    for t in entry.get("tools") or [] if isinstance(t, dict) and t.get("name") not in off]
        return out

    def format(self) -> ToolFormat:
        try:
            return ToolFormat(self.facts().get("tool_format", "generic"))
        except ValueError:
            return ToolFormat.GENERIC

    def active(self) -> bool:
        """Tools go with replies: on in Settings, some enabled, and a template that has them."""
        return bool(self.settings.mcp_tools_on and self.tools() and self.format() is not ToolFormat.GENERIC)

    def request_args(self, messages) -> dict:
        """``EngineClient.generate`` keywords for the reply to ``messages`` (its prompt, a
        list of ``ChatMessage``): ``tools``, and ``grammar`` on a loop's first step (the
        prompt does not end on a tool result) when Settings require a call; empty when tools
        are not active."""
        self._step = bool(messages) and messages[-1].role == "tool"
        first_step = not self._step
        if not self.active():
            return {}
        tools = [t.to_openai() for t in self.tools()]
        if not (first_step and self.settings.mcp_first_call_required):
            return {"tools": tools}
        from engine.tool_grammar import GrammarError, tool_call_grammar  # noqa: PLC0415 - llama_cpp inside

        try:
            return {"tools": tools, "grammar": tool_call_grammar(self.format(), tools, parallel=False)}
        except GrammarError as exc:
            log.warning("no grammar for the tools: %s", exc)
            return {"tools": tools}

    # -- the loop ----------------------------------------------------------------------

    def reply_saved(self, message_id: int) -> bool:
        """Read the reply ``message_id`` (``ChatController.reply_finished``; 0: none was
        stored) for calls; when it has some, store them on it and start asking. A reply
        stopped or failed ends the loop. Returns True when the loop goes on."""
        if not self._step:
            self.steps = 0
        self._step = False
        self.steps += 1
        if not message_id or not self.active():
            return False
        m = self.chat.store.get_message(message_id)
        if m.role != "assistant" or m.status != "complete" or m.tool:
            return False
        parsed = parse_reply(self.format(), self._reply_text(m))
        if not parsed.tool_calls:
            return False
        calls = [c.to_openai() for c in parsed.tool_calls]
        self.chat.store.update_message(message_id, content=parsed.content, tool={"tool_calls": calls})
        self._queue, self._parent_id = list(parsed.tool_calls), message_id
        self.chat.composer.set_streaming(True)  # Stop (Esc) ends the loop while it asks or runs
        self.chat.render()
        self._next_call()
        return True

    def _reply_text(self, m) -> str:
        """The reply ``m`` (a stored message) with control tokens shown when the engine sent
        that text for it (``ChatController.last_done``: the DoneEvent of the same token ids),
        else its stored content."""
        done = getattr(self.chat, "last_done", None)
        if done is not None and done.tool_text and list(done.token_ids) == list(m.token_ids or []):
            return done.tool_text
        return m.content

    def _server_of(self, name: str) -> tuple[McpServerConfig, McpTool] | None:
        tools = {t.name: t for t in self.tools()}
        servers = {s.name: s for s in self.servers()}
        tool = tools.get(name)
        return (servers[tool.server], tool) if tool is not None and tool.server in servers else None

    def _next_call(self) -> None:
        if not self._queue:
            self._continue()
            return
        call = self._queue[0]
        found = self._server_of(call.name)
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if found is None or not isinstance(args, dict):
            why = (f"There is no enabled tool named {call.name}." if found is None
                   else "The arguments are not a JSON object.")
            self._store_result(call, None, ToolOutcome(why, why, 0.0), args)
            return
        server, _tool = found
        if (server.name, call.name) in self.always:
            self._run(call, server, args)
            return
        self.dialog = ToolApprovalDialog(call.name, server.name, server.where, call.arguments, self.parent_widget)
        self.dialog.decided.connect(lambda a, c=call, s=server, x=args: self._decided(a, c, s, x))
        self.chat.status.stats_label.setText(f"Asking to run {call.name}…")
        self.dialog.open()
        self.asked.emit(self.dialog)

    def _decided(self, answer: Approval, call: ToolCall, server: McpServerConfig, args: dict) -> None:
        self.dialog = None
        if answer is Approval.STOP:
            self.stop()
        elif answer is Approval.DENY:
            self._store_result(call, server, ToolOutcome(DENIED, DENIED, 0.0), args)
        else:
            if answer is Approval.ALWAYS:
                self.allow_always(server, call.name)
            self._run(call, server, args)

    def _run(self, call: ToolCall, server: McpServerConfig, args: dict) -> None:
        token = object()
        self._token = token
        self.chat.status.stats_label.setText(f"Running {call.name} on {server.name}…")
        self._future = self.hub.call_tool(server, call.name, args)
        self._future.add_done_callback(lambda f, t=token, c=call, s=server, a=args: self._finished.emit(
            t, (c, s, a, None if f.cancelled() else f.result())))

    def _outcome(self, token, payload) -> None:
        if token is not self._token:
            return  # stopped meanwhile: dropped
        self._token, self._future = None, None
        call, server, args, outcome = payload
        if outcome is not None:
            self._store_result(call, server, outcome, args)

    def _store_result(self, call: ToolCall, server: McpServerConfig | None, outcome: ToolOutcome, args) -> None:
        fields = {"tool_call_id": call.id, "name": call.name, "server": server.name if server else None,
                  "arguments": call.arguments, "duration_ms": round(outcome.duration_ms, 1),
                  "error": outcome.error, "cut_bytes": outcome.cut_bytes}
        cid = self.chat.store.get_message(self._parent_id).conversation_id
        m = self.chat.store.add_message(cid, self._parent_id, "tool", outcome.text, tool=fields)
        self._parent_id = m.id
        self._queue.pop(0)
        self.ran.emit(m.id)
        self._next_call()

    def _continue(self) -> None:
        """Every call answered: the next step, unless the bound is reached."""
        self.chat.composer.set_streaming(False)
        if self.steps >= MAX_STEPS:
            self.chat.render()
            self.chat.banner.show_message(
                f"The tool loop stopped after {MAX_STEPS} replies; send a message to go on.", "info")
            return
        self.chat.start_reply(self._parent_id)

    def stop(self) -> bool:
        """End the loop while a call is asked or runs (True when there was one to end)."""
        if not self.busy and not self._queue:
            return False
        if self.dialog is not None:
            d, self.dialog = self.dialog, None
            d.answer = Approval.STOP
            d.done(0)
        if self._future is not None:
            self._future.cancel()
        self._token, self._future, self._queue = None, None, []
        self.chat.composer.set_streaming(False)
        self.chat.status.stats_label.setText("Stopped.")
        self.chat.render()
        return True

    def shutdown(self) -> None:
        """The window closes: abandon a call and stop the hub's loop."""
        self.stop()
        if self._hub is not None:
            self._hub.close()
