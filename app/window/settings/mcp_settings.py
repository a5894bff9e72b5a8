"""Settings → Tools: the MCP servers of the tool loop, each with its tools and a switch per tool.

A server is added as a stdio command line (split as a shell would, ``shlex``) or a
streamable HTTP URL, or imported from an ``mcp.json`` file (Claude Desktop's, LM Studio's,
Cursor's shape: ``{"mcpServers": {name: {"command", "args", "env"} | {"url"}}}``). "List
tools" asks every server for its tools on the ``McpHub`` thread (the window never waits);
a server that cannot be reached is named below the list. What is shown is saved in
settings.json (``AppSettings.mcp_servers``): the entry, the tools last listed, and the tools
switched off. Below, the tools answered "Always for this tool" (``mcp_always_allow``), each
with the command line it was allowed for; Revoke makes it ask again. Server names, tool
names and descriptions are plain text.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.session.mcp_servers import CALL_TIMEOUT_S, MAX_RESULT_BYTES, McpHub, McpServerConfig, servers_from_mcp_json

__all__ = ["McpSettingsTab"]


class McpSettingsTab(QWidget):
    """The Tools tab, from ``servers`` (``AppSettings.mcp_servers``), ``tools_on`` and
    ``first_call_required``. Signal ``listed(server name)`` when a server's tools (or its
    failure) arrived."""

    listed = Signal(str)
    _arrived = Signal(str, object)  # (server name, list[McpTool] or an error sentence), to the UI thread

    def __init__(self, servers: dict, tools_on: bool, first_call_required: bool, parent: QWidget | None = None,
                 always_allow: dict | None = None):
        super().__init__(parent)
        self.entries: dict[str, dict] = {n: dict(e) for n, e in (servers or {}).items()}
        self.always_allow: dict[str, dict[str, str]] = {n: dict(t) for n, t in (always_allow or {}).items()}
        self.hub: McpHub | None = None
        self._own_hub = False  # made here (closed with the dialog), not the window's
        self._arrived.connect(self._tools_arrived)
        lay = QVBoxLayout(self)
        self.tools_on = QCheckBox("Replies may call the tools switched on below")
        self.tools_on.setChecked(bool(tools_on))
        self.first_call = QCheckBox("Make every reply start by calling a tool")
        self.first_call.setToolTip("The model's first output is held to the form of a tool call (a grammar "
                                   "built from the tools' schemas); later steps may answer in words.")
        self.first_call.setChecked(bool(first_call_required))
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Server / tool", "Command, URL or description"])
        self.tree.setAccessibleName("MCP servers and their tools")
        add_row = QHBoxLayout()
        self.name = QLineEdit()
        self.name.setPlaceholderText("name")
        self.where = QLineEdit()
        self.where.setPlaceholderText("command line (stdio) or http(s):// URL (streamable HTTP)")
        self.add_button = QPushButton("Add")
        self.add_button.clicked.connect(self._add_typed)
        for w in (self.name, self.where, self.add_button):
            add_row.addWidget(w)
        row = QHBoxLayout()
        self.import_button = QPushButton("Import mcp.json…")
        self.import_button.clicked.connect(self._import_dialog)
        self.list_button = QPushButton("List tools")
        self.list_button.clicked.connect(self.list_all)
        self.remove_button = QPushButton("Remove server")
        self.remove_button.clicked.connect(self._remove_selected)
        for w in (self.import_button, self.list_button, self.remove_button):
            row.addWidget(w)
        row.addStretch(1)
        self.allowed = QListWidget()
        self.allowed.setAccessibleName("Tools allowed without asking")
        self.allowed.setMaximumHeight(90)
        self.revoke_button = QPushButton("Revoke")
        self.revoke_button.setToolTip("Ask again before this tool runs")
        self.revoke_button.clicked.connect(self._revoke_selected)
        allowed_row = QHBoxLayout()
        allowed_row.addWidget(self.allowed, 1)
        allowed_row.addWidget(self.revoke_button, 0, Qt.AlignmentFlag.AlignTop)
        self.status = QLabel()
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setWordWrap(True)
        note = QLabel(f"Every call asks first (allow once, always for that tool, or deny). A call may take "
                      f"{CALL_TIMEOUT_S:g} s; at most {MAX_RESULT_BYTES // 1024} KB of its result enters the prompt; "
                      "a reply loop stops after 8 replies. The model's template must support tools.")
        note.setWordWrap(True)
        self.empty_note = QLabel("No tool servers yet. Tools let a reply run a program or fetch a page through "
                                 "an MCP server: add one below by name and command line or URL, or import "
                                 "an mcp.json.")
        self.empty_note.setObjectName("tools_empty")
        self.empty_note.setWordWrap(True)
        for w in (self.tools_on, self.first_call, self.empty_note, self.tree):
            lay.addWidget(w)
        lay.addLayout(add_row)
        lay.addLayout(row)
        lay.addWidget(QLabel("Allowed without asking (“Always for this tool”):"))
        lay.addLayout(allowed_row)
        lay.addWidget(self.status)
        lay.addWidget(note)
        self._fill()
        self._fill_allowed()

    def use_hub(self, hub: McpHub) -> None:
        """List tools through ``hub`` (the window's: its connections stay up for the calls)."""
        self.hub, self._own_hub = hub, False

    # -- what is shown -------------------------------------------------------------------

    def _fill(self) -> None:
        self.tree.clear()
        self.empty_note.setVisible(not self.entries)
        for name, entry in self.entries.items():
            cfg = McpServerConfig.from_dict(name, entry)
            top = QTreeWidgetItem([name, cfg.where])
            off = set(entry.get("disabled_tools") or [])
            for tool in entry.get("tools") or []:
                child = QTreeWidgetItem([tool.get("name", "?"), tool.get("description", "")])
                child.setFlags(child.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                child.setCheckState(0, Qt.CheckState.Unchecked if tool.get("name") in off else Qt.CheckState.Checked)
                top.addChild(child)
            self.tree.addTopLevelItem(top)
            top.setExpanded(True)

    def _fill_allowed(self) -> None:
        self.allowed.clear()
        for server, tools in self.always_allow.items():
            entry = self.entries.get(server)
            now = McpServerConfig.from_dict(server, entry).where if entry is not None else None
            for tool, where in tools.items():
                state = "" if now == where else (" (asks again: the server was removed)" if now is None
                                                  else " (asks again: its command line changed)")
                item = QListWidgetItem(f"{tool} · {server} · {where}{state}")
                item.setData(Qt.ItemDataRole.UserRole, (server, tool))
                self.allowed.addItem(item)
        self.revoke_button.setEnabled(self.allowed.count() > 0)

    def _revoke_selected(self) -> None:
        item = self.allowed.currentItem() or (self.allowed.item(0) if self.allowed.count() == 1 else None)
        if item is None:
            self.status.setText("Choose the tool to revoke in the list.")
            return
        self.revoke(*item.data(Qt.ItemDataRole.UserRole))

    def revoke(self, server: str, tool: str) -> None:
        """Forget "always allow ``tool`` of ``server``" (saved on OK): it asks again."""
        tools = self.always_allow.get(server, {})
        tools.pop(tool, None)
        if not tools:
            self.always_allow.pop(server, None)
        self._fill_allowed()
        self.status.setText(f"{tool} of {server} will ask again before it runs.")

    def _read_switches(self) -> None:
        """The tools' check boxes into ``entries[..]["disabled_tools"]``."""
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            entry = self.entries.get(top.text(0))
            if entry is None:
                continue
            off = [top.child(j).text(0) for j in range(top.childCount())
                   if top.child(j).checkState(0) != Qt.CheckState.Checked]
            entry["disabled_tools"] = off

    def values(self) -> dict:
        """``mcp_servers``, ``mcp_tools_on``, ``mcp_first_call_required`` and
        ``mcp_always_allow`` as shown."""
        self._read_switches()
        return {"mcp_servers": {n: dict(e) for n, e in self.entries.items()},
                "mcp_always_allow": {n: dict(t) for n, t in self.always_allow.items()},
                "mcp_tools_on": self.tools_on.isChecked(), "mcp_first_call_required": self.first_call.isChecked()}

    # -- adding and removing -------------------------------------------------------------

    def add_server(self, cfg: McpServerConfig) -> None:
        """Add (or replace) ``cfg`` and list its tools."""
        self._read_switches()
        self.entries[cfg.name] = {**cfg.to_dict(), "tools": []}
        self._fill()
        self.list_server(cfg.name)

    def _add_typed(self) -> None:
        name, where = self.name.text().strip(), self.where.text().strip()
        if not name or not where:
            self.status.setText("Give the server a name and a command line or URL.")
            return
        if where.startswith(("http://", "https://")):
            self.add_server(McpServerConfig(name, url=where))
        else:
            try:
                parts = shlex.split(where)
            except ValueError as exc:
                self.status.setText(f"The command line cannot be read: {exc}.")
                return
            self.add_server(McpServerConfig(name, parts[0], tuple(parts[1:])))
        self.name.clear()
        self.where.clear()

    def import_file(self, path: str | Path) -> int:
        """Add the servers of an ``mcp.json`` file; returns how many (0 and a sentence in
        ``status`` when the file cannot be used)."""
        try:
            servers = servers_from_mcp_json(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            self.status.setText(f"{path} cannot be imported: {exc}")
            return 0
        for cfg in servers:
            self.add_server(cfg)
        self.status.setText(f"Imported {len(servers)} server(s) from {path}.")
        return len(servers)

    def _import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import mcp.json", "", "JSON (*.json);;All files (*)")
        if path:
            self.import_file(path)

    def _remove_selected(self) -> None:
        item = self.tree.currentItem()
        while item is not None and item.parent() is not None:
            item = item.parent()
        if item is not None:
            self._read_switches()
            self.entries.pop(item.text(0), None)
            self._fill()

    # -- listing tools (on the hub's thread) ---------------------------------------------

    def list_all(self) -> None:
        for name in list(self.entries):
            self.list_server(name)

    def list_server(self, name: str) -> None:
        """Ask server ``name`` for its tools; ``listed(name)`` when they (or its failure) arrive."""
        if self.hub is None:
            self.hub, self._own_hub = McpHub(), True
        self.status.setText(f"Listing the tools of {name}…")
        future = self.hub.list_tools(McpServerConfig.from_dict(name, self.entries[name]))
        future.add_done_callback(lambda f, n=name: self._arrived.emit(
            n, "cancelled" if f.cancelled() else (str(f.exception()) if f.exception() else f.result())))

    def _tools_arrived(self, name: str, tools) -> None:
        entry = self.entries.get(name)
        if entry is not None and isinstance(tools, list):
            self._read_switches()
            entry["tools"] = [{"name": t.name, "description": t.description, "schema": t.schema} for t in tools]
            self._fill()
            self.status.setText(f"{name}: {len(tools)} tool(s).")
        elif entry is not None:
            self.status.setText(str(tools))
        self.listed.emit(name)

    def shutdown(self) -> None:
        """The dialog closed: stop the hub's thread (a hub of its own; the window's stays)."""
        if self.hub is not None and self._own_hub:
            self.hub.close()
        self.hub = None
