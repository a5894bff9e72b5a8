"""Global (not per-conversation) settings, kept as JSON in ``<data dir>/settings.json``.

Per-conversation settings (system prompt, sampling) live in ``chats.sqlite3`` instead.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from engine.settings import EngineSettings
from storage.chats import checked_sampling
from storage.paths import FILE_MODE
from storage.prefix_store import DEFAULT_BUDGET_BYTES

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
MAX_RECENT_MODELS = 8
_ENGINE = EngineSettings()  # the engine's defaults, defined once in engine/settings.py
ENGINE_FIELDS = ("n_ctx", "n_threads", "type_k", "type_v", "repack", "speculative")
"""The settings that decide how a model is loaded (a change reloads it)."""


def _valid_value(name: str, value) -> bool:
    """The checks beyond the type: new chats' sampling as ``storage.chats`` accepts it,
    presets as text."""
    if name == "default_sampling":
        try:
            checked_sampling(value)
        except (ValueError, TypeError):
            return False
        return all(isinstance(v, str) if k == "thinking" else
                   not isinstance(v, bool) and (isinstance(v, (int, float)) or (k in ("seed", "thinking_budget") and v is None))
                   and (k not in ("seed", "thinking_budget") or not isinstance(v, float)) for k, v in value.items())
    if name == "prompt_presets":
        return all(isinstance(v, str) for v in value.values())
    if name == "window_layout":
        return window_layout_ok(value)
    if name == "mcp_always_allow":
        return all(isinstance(tools, dict) and all(isinstance(t, str) and isinstance(w, str) for t, w in tools.items())
                   for tools in value.values())
    if name == "mcp_servers":
        from app.session.mcp_servers import McpServerConfig  # noqa: PLC0415 - read only when the file has servers

        try:
            for server, entry in value.items():
                McpServerConfig.from_dict(server, entry)
        except ValueError:
            return False
    return True


def window_layout_ok(value: dict) -> bool:
    """Whether ``value`` is a window layout as the window saves it: {"width", "height"}
    (pixels, 200 to 20,000) and "panels" (three splitter sizes, pixels, 0 to 20,000), or {}."""
    if not value:
        return True
    size_ok = all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
                  and 200 <= value[k] <= 20_000 for k in ("width", "height"))
    panels = value.get("panels")
    return (size_ok and isinstance(panels, list) and len(panels) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 20_000 for v in panels))


def _same_kind(value, default) -> bool:
    """Whether a value read from the file has the default's type (None: any; int for float)."""
    if default is None:
        return value is None or isinstance(value, str)
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if isinstance(default, dict):
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, type(default))


@dataclass
class AppSettings:
    """What the window remembers between runs.

    n_ctx: context window (tokens). n_threads: CPU threads (0 = automatic, see EngineSettings).
    type_k / type_v: KV cache precision ("f16" or "q8_0").
    repack: llama.cpp's CPU weight repacking ("auto", "on", "off"; see EngineSettings.repack).
        The window sets it to "off" when the engine crashed natively while loading or before
        its first reply and the user restarts (app/window/flows/crash.py).
    budget_bytes: the prefix store's byte budget (``kvcache.sqlite3``; default
        ``storage.prefix_store.DEFAULT_BUDGET_BYTES``).
    theme: "system", "light" or "dark". recent_models: newest first (paths).
    last_model: the model to load at start (None: the embedded default model).
    show_tree: whether the tree panel is open.
    window_layout: the window's size and its three panels' widths when it last closed
        ({"width", "height", "panels": [sidebar, messages, tree]}, pixels; {}: not yet).
    api_host / api_port / api_key: where Server → Start API server listens (``branchwise
        serve``; an empty key: none, allowed on loopback only).
    engine_url / engine_key / engine_model: "" runs the local model file; a URL sends every
        reply to that OpenAI-compatible server (``engine.remote``), with the key and model
        name when given. The conversations stay local.
    default_system_prompt / default_sampling: what a new chat starts with (sampling: some or
        all ``storage.chats.DEFAULT_SAMPLING`` keys, overriding those defaults).
    prompt_presets: named system prompts (name -> text), offered in Settings.
    reset_fields: after ``load``, the fields the file held with an invalid value, now at
        their defaults (not saved; the window names them).
    unreadable: after ``load``, why the whole file could not be used and where it went
        ("" when it could; not saved; the window shows it).
    speculative: speculative decoding ("none", "lookup" or "draft:PATH"; see
        EngineSettings.speculative).
    prewarm: zero-wait turns (app/window/flows/prewarm_controller.py): restore an opened chat and
        prefill the composer's draft in the background. Off: the engine idles between turns.
    always_switch_model: opening a chat that last ran on another model loads that model
        without asking (app/window/flows/chat_model_flow.py); off: a bar offers the switch.
    mcp_servers: MCP servers for the tool loop (name -> the ``mcp.json`` entry plus
        ``disabled_tools`` and the ``tools`` last listed; app/window/settings/mcp_settings.py).
    mcp_tools_on: replies may call the enabled tools (the template must support tools).
    mcp_first_call_required: each reply's first step must be a tool call (sampled under the
        schema grammar, ``tool_choice: "required"``); later steps are free.
    mcp_always_allow: the tool calls answered "Always for this tool": server name -> tool
        name -> the server's command line (or URL) then; a changed one asks again.
    """

    n_ctx: int = _ENGINE.n_ctx
    n_threads: int = _ENGINE.n_threads
    type_k: str = _ENGINE.type_k
    type_v: str = _ENGINE.type_v
    repack: str = _ENGINE.repack
    speculative: str = _ENGINE.speculative
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    theme: str = "system"
    recent_models: list[str] = field(default_factory=list)
    last_model: str | None = None
    show_tree: bool = False
    window_layout: dict = field(default_factory=dict)
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_key: str = ""
    engine_url: str = ""
    engine_key: str = ""
    engine_model: str = ""
    default_system_prompt: str = ""
    default_sampling: dict = field(default_factory=dict)
    prompt_presets: dict = field(default_factory=dict)
    reset_fields: list[str] = field(default_factory=list)
    prewarm: bool = True
    unreadable: str = ""
    always_switch_model: bool = False
    mcp_servers: dict = field(default_factory=dict)
    mcp_tools_on: bool = True
    mcp_first_call_required: bool = False
    mcp_always_allow: dict = field(default_factory=dict)

    def engine_settings(self) -> EngineSettings:
        """The EngineSettings these settings describe, built by the engine's own rule
        (``EngineSettings.for_kv_type``: a q8_0 V cache turns flash attention on; f16 keeps
        it off, see ``EngineSettings.flash_attn``).

        Raises:
            ValueError, TypeError: a value is invalid (an unknown KV type, a context under 256).
        """
        return EngineSettings.for_kv_type(self.type_v, type_k=self.type_k, n_ctx=self.n_ctx,
                                          n_threads=self.n_threads, repack=self.repack,
                                          speculative=self.speculative)

    def engine_fields(self) -> dict:
        """The fields that decide how the model is loaded (``ENGINE_FIELDS``), as a dict."""
        return {k: getattr(self, k) for k in ENGINE_FIELDS}

    def remote_engine(self) -> dict | None:
        """{"url", "key", "model"} of the remote engine, or None for the local model file."""
        url = (self.engine_url or "").strip()
        return {"url": url, "key": self.engine_key or "", "model": self.engine_model or ""} if url else None

    def remember_model(self, path: str) -> None:
        """Put ``path`` first in the recent list and make it the model loaded at start."""
        path = str(Path(path).resolve()) if path else path  # one entry per file, however it was named
        self.recent_models = [path] + [p for p in self.recent_models if p and str(Path(p).resolve()) != path]
        del self.recent_models[MAX_RECENT_MODELS:]
        self.last_model = path

    @classmethod
    def load(cls, data_dir: Path) -> "AppSettings":
        """Read the settings of ``data_dir``; a missing or unreadable file gives the defaults.
        A field with an invalid value is reset to its default and named in ``reset_fields``;
        the other fields are kept."""
        path = Path(data_dir) / SETTINGS_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            return cls._unreadable(path, f"it could not be read ({exc})")
        if not isinstance(raw, dict):
            return cls._unreadable(path, "it holds no settings")
        settings, settings.reset_fields = cls._valid_fields(raw)
        if settings.reset_fields:
            log.warning("%s: reset to the default: %s", path, ", ".join(settings.reset_fields))
        return settings

    @classmethod
    def _unreadable(cls, path: Path, why: str) -> "AppSettings":
        """The defaults, for a settings file that cannot be used: the file is moved aside
        (``settings.json.unreadable``, replacing an older one) so the next save does not
        overwrite what it held, and ``unreadable`` says so for the window's banner."""
        aside = path.with_name(path.name + ".unreadable")
        try:
            os.replace(path, aside)
            kept = f"it was moved to {aside}"
        except OSError as exc:
            kept = f"it could not be moved aside ({exc.strerror or exc})"
        log.warning("settings file %s: %s; %s; using the defaults", path, why, kept)
        return cls(unreadable=f"{path}: {why}; {kept}. Every setting is back to its default.")

    @classmethod
    def _valid_fields(cls, raw: dict) -> tuple["AppSettings", list[str]]:
        """Settings from ``raw`` keeping every valid field; the names of the fields that were
        invalid (and are left at their defaults). A field is valid when its type matches the
        default's and, for the engine's fields, EngineSettings accepts it with the others."""
        settings, reset = cls(), []
        for f in fields(cls):
            if f.name not in raw or f.name in ("reset_fields", "unreadable"):
                continue
            value, default = raw[f.name], getattr(settings, f.name)
            if not _same_kind(value, default):
                reset.append(f.name)
                continue
            setattr(settings, f.name, type(default)(value) if isinstance(value, (list, dict)) else value)
            if not _valid_value(f.name, value):
                setattr(settings, f.name, default)
                reset.append(f.name)
                continue
            if f.name in ENGINE_FIELDS:
                try:
                    settings.engine_settings()
                except (ValueError, TypeError):
                    setattr(settings, f.name, default)
                    reset.append(f.name)
        return settings, reset

    def save(self, data_dir: Path) -> None:
        """Write atomically (temp file + rename), readable by the owner only (``FILE_MODE``,
        0600: it holds API keys and MCP servers' environments). Raises OSError if the folder
        is not writable."""
        path = Path(data_dir) / SETTINGS_FILE
        tmp = path.with_suffix(".json.tmp")
        data = {k: v for k, v in asdict(self).items() if k not in ("reset_fields", "unreadable")}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2))
        os.chmod(tmp, FILE_MODE)  # a temp file left by a crash kept its own mode
        os.replace(tmp, path)
