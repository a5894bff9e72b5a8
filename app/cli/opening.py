"""Opening what a command works on: the data folder, the chats, the prefix store and the
engine, from the parsed arguments. Every command module and the supervisor's caller use
these; nothing here imports a command, so no command imports another through them.

The engine and the stores are imported when opened, not here: building the parser and
running a command that needs neither stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.cli.arguments import parse_size
from app.cli.progress import TerminalProgress
from app.cli.storage_commands import check_model_path


def data_dir(args) -> Path:
    """The data folder a command uses: ``--data-dir`` (a command's, or the window's before
    the command), else ``BRANCHWISE_DATA_DIR``, else the user data folder.

    Raises:
        StorageError: the folder cannot be used (storage.paths.resolve_data_dir says why).
    """
    from storage.paths import resolve_data_dir

    return resolve_data_dir(getattr(args, "data_dir", None) or getattr(args, "gui_data_dir", None))


def open_chats(args):
    """The ``ChatStore`` of the data folder's ``chats.sqlite3``; replies a crash or a kill
    left streaming are marked stopped first.

    Raises:
        StorageError: the database cannot be opened or created.
    """
    from storage.chats import ChatStore
    from storage.paths import CHATS_DB

    chats = ChatStore(data_dir(args) / CHATS_DB)
    chats.mark_interrupted_streams()  # replies cut short by a crash or a kill become "stopped"
    return chats


def open_store(args):
    """The ``PrefixStore`` of the data folder's ``kvcache.sqlite3``, with the byte budget of
    ``--cache-budget``, else ``BRANCHWISE_CACHE_BUDGET``, else 4 GiB.

    Raises:
        StorageError: the store cannot be opened; ValueError: a bad
            ``BRANCHWISE_CACHE_BUDGET``.
    """
    from storage.paths import KVCACHE_DB
    from storage.prefix_store import DEFAULT_BUDGET_BYTES, PrefixStore

    budget = getattr(args, "cache_budget", None)
    if budget is None:
        text = os.environ.get("BRANCHWISE_CACHE_BUDGET", "") or str(DEFAULT_BUDGET_BYTES)
        try:
            budget = parse_size(text)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(f"BRANCHWISE_CACHE_BUDGET: {exc} (unset it, or give a size such as 2G).") from None
    return PrefixStore(data_dir(args) / KVCACHE_DB, budget_bytes=budget)


def open_engine(args):
    """The engine a command generates with: a ``RemoteEngine`` for ``--engine-url``, else
    ``engine.core.Engine`` on ``--model`` (a library name or a path; the bundled model by
    default) with the prefix store unless ``--no-cache`` (a store that cannot be opened is
    said on stderr and left out). Sets ``args.progress`` (the terminal's progress bars).

    Raises:
        ValueError: a model path that is not UTF-8; EngineError: the model cannot be loaded.
    """
    if getattr(args, "engine_url", None):
        return open_remote_engine(args)
    from engine.core import Engine
    from engine.cpu import CrashVerdict
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings

    check_model_path(args.model)
    args.model = resolve_model(args.model, data_dir(args))  # a library name, or a path
    settings = EngineSettings.for_kv_type(args.kv_type, n_ctx=args.ctx_size, n_threads=args.threads,
                                          flash_attn=args.flash_attn, repack=args.repack,
                                          speculative=args.speculative)
    store = None
    if not args.no_cache:
        from storage.errors import StorageError

        try:
            store = open_store(args)
        except StorageError as exc:
            print(f"branchwise: running without the KV cache: {exc}", file=sys.stderr)
    args.progress = TerminalProgress.for_args(args)
    from app.cli import interrupts

    # A stop while llama.cpp loads would raise inside its log callback, where ctypes prints
    # and drops the exception, and the command went on; it is held and taken after the load.
    with interrupts.stops_held() as held, args.progress.loading():
        engine = Engine(args.model or default_model_path(), settings, store, progress=args.progress.hashing,
                        crash_verdict=CrashVerdict.applies(data_dir(args)))
    interrupts.report(repack=engine.model.repack.repack)  # for the supervisor, should llama.cpp crash later
    if held.signum:
        engine.close()
        raise KeyboardInterrupt
    return engine


def chat_model(args, chats, conversation_id: int) -> None:
    """Without ``--model`` (and ``--engine-url``), point ``args.model`` at the model file
    ``conversation_id`` last ran on (``ChatStore.models``) when that file exists, saying so
    in one line on stderr; when it is gone, say that the default model is used instead.
    A chat with no recorded file (the default model, a server) is left to the default."""
    if args.model or getattr(args, "engine_url", None):
        return
    from storage.errors import NotFoundError

    try:
        recorded = chats.models.of(conversation_id)
    except NotFoundError:
        return
    if recorded is None or not recorded.path:
        return
    from engine.model_file import default_model_path

    if Path(recorded.path) == Path(default_model_path()):
        return
    if Path(recorded.path).is_file():
        args.model = recorded.path
        print(f"branchwise: conversation {conversation_id} runs on {recorded.name} ({recorded.path}); loading it.",
              file=sys.stderr)
    else:
        print(f"branchwise: conversation {conversation_id} last ran on {recorded.name} ({recorded.path}), which is "
              "not there any more; using the default model.", file=sys.stderr)


def sampling(args, conversation):
    """The ``SamplingParams`` of a turn: ``conversation.sampling`` (a dict, or None)
    overridden by the sampling flags given on the command line."""
    from engine.settings import SamplingParams

    s = dict(conversation.sampling or {})
    for name in ("max_tokens", "temperature", "seed", "top_p", "top_k", "min_p", "repeat_penalty"):
        value = getattr(args, name, None)
        if value is not None:
            s[name] = value
    return SamplingParams.from_dict(s)


def open_remote_engine(args):
    """A ``RemoteEngine`` for ``--engine-url``, with ``--engine-key`` (else
    ``BRANCHWISE_ENGINE_KEY``) and ``--engine-model``. Connects to nothing yet."""
    import os

    from engine.remote import RemoteEngine

    key = args.engine_key or os.environ.get("BRANCHWISE_ENGINE_KEY") or None
    return RemoteEngine(args.engine_url, key, args.engine_model)


def resolve_model(model: str | None, data_dir: Path) -> str | None:
    """``chat --model X``: X itself when it is a path that exists or looks like one, else
    the library model called X (its first part), else X unchanged (the load then names it)."""
    if not model or Path(model).exists() or "/" in model or "\\" in model:
        return model
    from engine.hub.library import find

    found = find(data_dir, model)
    return found.path if found else model
