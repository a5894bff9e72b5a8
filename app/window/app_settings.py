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
from storage.prefix_store import DEFAULT_BUDGET_BYTES

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
MAX_RECENT_MODELS = 8
_ENGINE = EngineSettings()  # the engine's defaults, defined once in engine/settings.py


@dataclass
class AppSettings:
    """What the window remembers between runs.

    n_ctx: context window (tokens). n_threads: CPU threads (0 = all cores).
    type_k / type_v: KV cache precision ("f16" or "q8_0").
    repack: llama.cpp's CPU weight repacking ("auto", "on", "off"; see EngineSettings.repack).
        The window sets it to "off" when the engine crashed natively while loading or before
        its first reply and the user restarts (app/window/crash.py).
    budget_bytes: the prefix store's byte budget (``kvcache.sqlite3``; default
        ``storage.prefix_store.DEFAULT_BUDGET_BYTES``).
    theme: "system", "light" or "dark". recent_models: newest first (paths).
    last_model: the model to load at start (None: the embedded default model).
    show_tree: whether the tree panel is open.
    api_host / api_port / api_key: where Server → Start API server listens (``branchwise
        serve``; an empty key: none, allowed on loopback only).
    engine_url / engine_key / engine_model: "" runs the local model file; a URL sends every
        reply to that OpenAI-compatible server (``engine.remote``), with the key and model
        name when given. The conversations stay local.
    prewarm: zero-wait turns (app/window/prewarm_controller.py): restore an opened chat and
        prefill the composer's draft in the background. Off: the engine idles between turns.
    """

    n_ctx: int = _ENGINE.n_ctx
    n_threads: int = _ENGINE.n_threads
    type_k: str = _ENGINE.type_k
    type_v: str = _ENGINE.type_v
    repack: str = _ENGINE.repack
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    theme: str = "system"
    recent_models: list[str] = field(default_factory=list)
    last_model: str | None = None
    show_tree: bool = False
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_key: str = ""
    engine_url: str = ""
    engine_key: str = ""
    engine_model: str = ""
    prewarm: bool = True

    def engine_settings(self) -> EngineSettings:
        """The EngineSettings these settings describe. Flash attention keeps its default (off,
        see ``EngineSettings.flash_attn``).

        Raises:
            ValueError: the values are invalid, e.g. a q8_0 V cache, which needs flash attention.
        """
        return EngineSettings(n_ctx=self.n_ctx, n_threads=self.n_threads,
                              type_k=self.type_k, type_v=self.type_v, repack=self.repack)

    def remote_engine(self) -> dict | None:
        """{"url", "key", "model"} of the remote engine, or None for the local model file."""
        url = (self.engine_url or "").strip()
        return {"url": url, "key": self.engine_key or "", "model": self.engine_model or ""} if url else None

    def remember_model(self, path: str) -> None:
        """Put ``path`` first in the recent list and make it the model loaded at start."""
        self.recent_models = [path] + [p for p in self.recent_models if p != path]
        del self.recent_models[MAX_RECENT_MODELS:]
        self.last_model = path

    @classmethod
    def load(cls, data_dir: Path) -> "AppSettings":
        """Read the settings of ``data_dir``; a missing or unreadable file gives the defaults."""
        path = Path(data_dir) / SETTINGS_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s: %s", path, exc)
            return cls()
        names = {f.name for f in fields(cls)}
        settings = cls(**{k: v for k, v in raw.items() if k in names})
        try:
            settings.engine_settings()
        except (ValueError, TypeError) as exc:
            log.warning("invalid engine settings in %s (%s); using defaults", path, exc)
            defaults = cls()
            settings.n_ctx, settings.n_threads = defaults.n_ctx, defaults.n_threads
            settings.type_k, settings.type_v = defaults.type_k, defaults.type_v
            settings.repack = defaults.repack
        return settings

    def save(self, data_dir: Path) -> None:
        """Write atomically (temp file + rename). Raises OSError if the folder is not writable."""
        path = Path(data_dir) / SETTINGS_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        os.replace(tmp, path)
