"""The ``branchwise`` command: the window by default, and a headless CLI for everything else.

No Qt is imported on the CLI paths; ``branchwise`` with no subcommand opens the window.
Every failure a person can cause (a bad model file, an unknown id, a full disk) ends
with one readable line on stderr and a non-zero exit code; tracebacks go to the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger("branchwise")

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _size(text: str) -> int:
    """Parse a byte size like ``500000``, ``200M``, ``1.5G`` (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 500M or 2G)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the size must be positive, not {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"branchwise: {message} (see '{self.prog} --help')\n")


def _ctx_size(text: str) -> int:
    value = _positive(text)
    if value < 256:
        raise argparse.ArgumentTypeError("the context size must be at least 256 tokens")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--data-dir", help="where chats and the KV cache live (default: the user data folder; env BRANCHWISE_DATA_DIR)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    engine = _Parser(add_help=False)
    engine.add_argument("--model", help="a GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    engine.add_argument("--ctx-size", type=_ctx_size, default=8192, help="context window in tokens (default 8192)")
    engine.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    engine.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16", help="KV cache precision")
    engine.add_argument("--flash-attn", action="store_true",
                        help="use flash attention (faster prefill; replies after a restore may then differ "
                             "in rare cases from uncached ones; always on with --kv-type q8_0)")
    engine.add_argument("--cache-budget", type=_size, default=None,
                        help="most bytes the prefix store keeps, e.g. 2G (env BRANCHWISE_CACHE_BUDGET)")
    engine.add_argument("--no-cache", action="store_true", help="neither read nor write the prefix store")
    engine.add_argument("--max-tokens", type=_positive, help="most tokens in the reply")
    engine.add_argument("--temperature", type=float, help="0 is deterministic")
    engine.add_argument("--seed", type=int, help="sampling seed")
    engine.add_argument("--top-p", type=float, help="nucleus sampling threshold")
    engine.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    engine.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top probability")
    engine.add_argument("--repeat-penalty", type=float, help="penalty for recently generated tokens (1 = none)")

    p = _Parser(
        prog="branchwise",
        description="Branchwise: chat with local models; never read the same tokens twice.",
    )
    p.add_argument("--data-dir", dest="gui_data_dir", help=argparse.SUPPRESS)
    p.add_argument("--model", dest="gui_model", metavar="PATH", help="open the window on this GGUF model")
    p.add_argument("--self-test", action="store_true", help="run one turn and one resume on the bundled model, then exit")
    p.add_argument("--screenshot", metavar="PNG", help="open the window offscreen, save a screenshot, exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    chat = sub.add_parser("chat", parents=[common, engine], help="send a message and stream the reply")
    chat.add_argument("--conversation", type=int, help="continue this conversation (default: a new one)")
    chat.add_argument("--parent", type=int, help="reply under this message instead of the active leaf (a branch)")
    chat.add_argument("--system", help="system prompt (for a new conversation, or to change it)")
    chat.add_argument("text", help="the message")

    regen = sub.add_parser("regenerate", parents=[common, engine], help="a new sibling reply for an assistant message")
    regen.add_argument("message_id", type=int)
    from app.serve.commands import add_remote_arguments, add_serve_parser

    for parser in (chat, regen):
        add_remote_arguments(parser)
    add_serve_parser(sub, [common, engine])

    conv = sub.add_parser("conversations", help="list, show or export conversations")
    conv_sub = conv.add_subparsers(dest="action", required=True, parser_class=_Parser)
    conv_sub.add_parser("list", parents=[common])
    show = conv_sub.add_parser("show", parents=[common])
    show.add_argument("id", type=int)
    export = conv_sub.add_parser("export", parents=[common],
                                 help="json: the whole tree, every branch; markdown: the active branch")
    export.add_argument("id", type=int)
    export.add_argument("--format", choices=["json", "markdown"], default="markdown")

    cache = sub.add_parser("cache", help="the KV prefix store")
    cache_sub = cache.add_subparsers(dest="action", required=True, parser_class=_Parser)
    for name, text in (("stats", "sizes and hit counts"), ("verify", "check every block's checksum, remove bad ones"),
                       ("clear", "remove every block")):
        c = cache_sub.add_parser(name, parents=[common], help=text)
        c.add_argument("--cache-budget", type=_size, default=None, help=argparse.SUPPRESS)

    bench = sub.add_parser("bench", help="measure cold prefill vs resume, restore speed and sharing")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--model", help="a GGUF model (default: the embedded one)")
    bench.add_argument("--quick", action="store_true", help="smaller workload (for a smoke test)")
    bench.add_argument("--serve", action="store_true",
                       help="only the API server comparison: TTFT for a resent 2,000-token history after a "
                            "restart, branchwise serve vs python -m llama_cpp.server")
    sub.add_parser("gui", parents=[common], help="open the window (the default)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args)
    import sqlite3

    from app.serve import ServeError
    from engine.errors import EngineError
    from storage.errors import StorageError
    from storage.prefix_store import StoreError

    try:
        if args.self_test:
            from app.self_test import run_self_test

            return run_self_test()
        if args.command in (None, "gui"):
            from app.gui import run

            if args.screenshot:
                os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
            elif _no_display():
                print("branchwise: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset). "
                      "Use the command line (branchwise --help) or set QT_QPA_PLATFORM=offscreen.",
                      file=sys.stderr)
                return EXIT_ERROR
            data_dir = getattr(args, "data_dir", None) or args.gui_data_dir
            return run(data_dir, args.gui_model, screenshot=args.screenshot)
        if args.command == "bench":
            from app.bench import run_bench

            if args.serve:
                from app.serve.bench import run_serve_bench

                return run_serve_bench(model=args.model, as_json=args.json, quick=args.quick)

            return run_bench(model=args.model, as_json=args.json, quick=args.quick)
        from app.serve.commands import cmd_serve

        handler = {"chat": cmd_chat, "regenerate": cmd_regenerate, "serve": cmd_serve,
                   "conversations": cmd_conversations, "cache": cmd_cache}[args.command]
        return handler(args)
    except (EngineError, StorageError, StoreError, ServeError, ValueError) as exc:
        log.debug("command failed", exc_info=True)
        print(f"branchwise: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except sqlite3.DatabaseError as exc:
        log.debug("database error", exc_info=True)
        print(f"branchwise: the chat database could not be read ({exc}). It may be damaged: "
              "move chats.sqlite3 out of the data folder to start afresh; nothing was changed.",
              file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nbranchwise: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_ERROR


def _no_display() -> bool:
    return (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"))


def _setup_logging(args) -> None:
    level = getattr(logging, os.environ.get("BRANCHWISE_LOG", "WARNING").upper(), logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the window logs INFO to its file, not here
        handler.setLevel(level)


# -- shared helpers ----------------------------------------------------------------------


def _data_dir(args) -> Path:
    from storage.paths import resolve_data_dir

    return resolve_data_dir(getattr(args, "data_dir", None) or getattr(args, "gui_data_dir", None))


def _open_chats(args):
    from storage.chats import ChatStore
    from storage.paths import CHATS_DB

    chats = ChatStore(_data_dir(args) / CHATS_DB)
    chats.mark_interrupted_streams()  # replies cut short by a crash or a kill become "stopped"
    return chats


def _open_store(args):
    from storage.paths import KVCACHE_DB
    from storage.prefix_store import DEFAULT_BUDGET_BYTES, PrefixStore

    budget = getattr(args, "cache_budget", None) or _size(os.environ.get("BRANCHWISE_CACHE_BUDGET", "")
                                                          or str(DEFAULT_BUDGET_BYTES))
    return PrefixStore(_data_dir(args) / KVCACHE_DB, budget_bytes=budget)


def _open_engine(args):
    if getattr(args, "engine_url", None):
        from app.serve.commands import open_remote_engine

        return open_remote_engine(args)
    from engine.core import Engine
    from engine.model_file import default_model_path
    from engine.settings import EngineSettings

    settings = EngineSettings.for_kv_type(args.kv_type, n_ctx=args.ctx_size, n_threads=args.threads,
                                          flash_attn=args.flash_attn)
    store = None
    if not args.no_cache:
        from storage.prefix_store import StoreError

        try:
            store = _open_store(args)
        except StoreError as exc:
            print(f"branchwise: running without the KV cache: {exc}", file=sys.stderr)
    return Engine(args.model or default_model_path(), settings, store)


def _sampling(args, conversation):
    from engine.settings import SamplingParams

    s = dict(conversation.sampling or {})
    for name in ("max_tokens", "temperature", "seed", "top_p", "top_k", "min_p", "repeat_penalty"):
        value = getattr(args, name, None)
        if value is not None:
            s[name] = value
    return SamplingParams.from_dict(s)


class _StreamSaver:
    """Saves a streaming reply as it grows (at most every ``every_s`` seconds), so a crash
    or a kill loses at most the last half second of text (DESIGN.md, chats.sqlite3)."""

    def __init__(self, chats, conversation_id: int, parent_id: int, model: str, every_s: float = 0.5):
        self.chats, self.conversation_id, self.parent_id, self.model = chats, conversation_id, parent_id, model
        self.every_s = every_s
        self.message_id: int | None = None
        self._last = 0.0

    def progress(self, text: str) -> None:
        now = time.monotonic()
        if self.message_id is None:
            self.message_id = self.chats.add_message(self.conversation_id, self.parent_id, "assistant", text,
                                                     status="streaming", model=self.model).id
            self._last = now
        elif now - self._last >= self.every_s:
            self.chats.update_message(self.message_id, content=text)
            self._last = now

    def finish(self, text: str, status: str, token_ids=None, stats=None) -> int:
        if self.message_id is None:
            self.message_id = self.chats.add_message(self.conversation_id, self.parent_id, "assistant", text,
                                                     token_ids=token_ids, stats=stats, status=status,
                                                     model=self.model).id
        else:
            self.chats.update_message(self.message_id, content=text, token_ids=token_ids, stats=stats,
                                      status=status)
        return self.message_id


def _reply(args, engine, chats, conversation, parent_id, model_label: str) -> int:
    """Generate the reply to the path ending at ``parent_id``, stream it, save it."""
    path = chats.path_to(parent_id)
    stream = not args.json
    parts: list[str] = []
    saver = _StreamSaver(chats, conversation.id, parent_id, model_label)

    def on_token(text: str, _tok: int) -> None:
        parts.append(text)
        saver.progress("".join(parts))
        if stream:
            sys.stdout.write(text)
            sys.stdout.flush()

    use_cache = not args.no_cache
    from engine.chat_template import conversation_messages
    from engine.errors import ContextOverflowError, EngineError

    try:
        result = engine.generate(conversation_messages(conversation.system_prompt, path),
                                 _sampling(args, conversation),
                                 use_cache=use_cache, on_token=on_token, snapshot=False)
    except ContextOverflowError as exc:
        raise _overflow_error(exc.prompt_tokens, exc.n_ctx) from exc
    except (KeyboardInterrupt, EngineError) as exc:  # keep what was streamed, marked stopped
        if parts:
            saver.finish("".join(parts), "stopped")
            if stream and isinstance(exc, EngineError):  # the error line starts on a line of its own
                sys.stdout.write("\n")
                sys.stdout.flush()
        raise
    status = "stopped" if result.stats.finish_reason == "cancelled" else "complete"
    msg_id = saver.finish(result.text, status, token_ids=result.token_ids, stats=result.stats.to_dict())
    if use_cache:  # after the reply is safe: storing the KV is an optimisation
        engine.snapshot(result.stats)
        chats.update_message(msg_id, stats=result.stats.to_dict())
    engine.close()
    if args.json:
        user_id = parent_id if chats.get_message(parent_id).role == "user" else None
        print(json.dumps({
            "conversation_id": conversation.id, "user_message_id": user_id,
            "assistant_message_id": msg_id, "text": result.text, "stats": _public_stats(result.stats),
        }))
    elif getattr(engine, "remote", False):
        from app.serve.commands import remote_stats_line

        sys.stdout.write("\n")
        print(remote_stats_line(conversation.id, msg_id, result.stats), file=sys.stderr)
    else:
        s = result.stats
        sys.stdout.write("\n")
        print(f"[conversation {conversation.id} · message {msg_id} · restored {s.restored_tokens} tokens "
              f"in {s.restore_ms:.0f} ms · prefilled {s.prefilled_tokens} in {s.prefill_ms / 1000:.2f} s · "
              f"TTFT {s.ttft_ms:.0f} ms · {s.decode_tokens_per_s:.1f} tok/s]", file=sys.stderr)
    return 0


def _overflow_error(prompt_tokens: int, n_ctx: int) -> ValueError:
    return ValueError(
        f"This conversation is {prompt_tokens:,} tokens long but the context window is {n_ctx:,}; "
        "pass a larger --ctx-size, or start a new conversation.")


def _check_fits(engine, conversation, path, text: str) -> None:
    """Refuse a message that would not fit the context window before it is stored, so a
    failed turn leaves no unanswered message on the branch."""
    from engine.chat_template import ChatMessage, conversation_messages

    messages = conversation_messages(conversation.system_prompt, path) + [ChatMessage("user", text)]
    n = len(engine.prompt_tokens(messages))
    if n + 1 > engine.llama.n_ctx():
        raise _overflow_error(n, engine.llama.n_ctx())


def _public_stats(stats) -> dict:
    d = stats.to_dict()
    keys = ("prompt_tokens", "restored_tokens", "prefilled_tokens", "generated_tokens", "restore_ms",
            "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "snapshot_bytes_written")
    return {**{k: d[k] for k in keys}, **{k: v for k, v in d.items() if k not in keys}}


def _model_label(args) -> str:
    return Path(args.model).name if args.model else "SmolLM2-135M-Instruct.Q4_1.gguf"


# -- commands ----------------------------------------------------------------------------


def cmd_chat(args) -> int:
    from storage.errors import NotFoundError

    if not args.text.strip():
        raise ValueError("The message is empty; type something to send.")
    chats = _open_chats(args)
    # Load the model first, so a bad model file leaves no trace in the conversations.
    engine = _open_engine(args)
    if args.parent is not None:
        parent = chats.get_message(args.parent)
        if parent.role != "assistant":
            raise ValueError(
                f"Message {parent.id} is your own message; --parent takes an assistant reply to answer "
                "under (to rephrase a message, pass --parent with the reply before it).")
        if args.conversation is not None and parent.conversation_id != args.conversation:
            raise NotFoundError(f"Message {args.parent} is not in conversation {args.conversation}.")
        conversation = chats.get_conversation(parent.conversation_id)
        parent_id = parent.id
    elif args.conversation is not None:
        conversation = chats.get_conversation(args.conversation)
        parent_id = conversation.active_leaf_id
    else:
        conversation = chats.create_conversation(system_prompt=args.system or "")
        parent_id = None
    if args.system is not None and args.system != conversation.system_prompt:
        chats.set_system_prompt(conversation.id, args.system)
        conversation = chats.get_conversation(conversation.id)
    if not getattr(engine, "remote", False):  # a server checks its own context window
        _check_fits(engine, conversation, chats.path_to(parent_id) if parent_id else [], args.text)
    user = chats.add_message(conversation.id, parent_id, "user", args.text)
    label = engine.model() if getattr(engine, "remote", False) else _model_label(args)
    return _reply(args, engine, chats, conversation, user.id, label)


def cmd_regenerate(args) -> int:
    chats = _open_chats(args)
    msg = chats.get_message(args.message_id)
    if msg.role != "assistant" or msg.parent_id is None:
        raise ValueError(f"Message {msg.id} is a {msg.role} message; regenerate takes an assistant reply.")
    conversation = chats.get_conversation(msg.conversation_id)
    engine = _open_engine(args)
    label = engine.model() if getattr(engine, "remote", False) else _model_label(args)
    return _reply(args, engine, chats, conversation, msg.parent_id, label)


def cmd_conversations(args) -> int:
    from app.export import conversation_json, conversation_markdown

    chats = _open_chats(args)
    if args.action == "list":
        rows = chats.list_conversations()
        if args.json:
            print(json.dumps([{"id": c.id, "title": c.title, "pinned": c.pinned, "updated_at": c.updated_at,
                               "messages": len(chats.tree(c.id))} for c in rows]))
        else:
            for c in rows:
                pin = "*" if c.pinned else " "
                print(f"{c.id:>5} {pin} {c.title}")
        return 0
    if args.action == "show":
        data = conversation_json(chats, args.id)
        if args.json:
            print(json.dumps(data, ensure_ascii=False))
        else:
            print(conversation_markdown(data, active_only=True))
        return 0
    data = conversation_json(chats, args.id)
    if args.format == "json":
        print(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        print(conversation_markdown(data, active_only=True))
    return 0


def cmd_cache(args) -> int:
    store = _open_store(args)
    if args.action == "clear":
        store.clear()
        result = {"cleared": True, **store.stats()}
    elif args.action == "verify":
        report = store.verify()
        result = {"checked": report.checked, "bad": report.bad, "removed": report.removed, **store.stats()}
    else:
        result = store.stats()
    if store.recovered_from:
        result["recovered_from"] = store.recovered_from
    if args.json:
        print(json.dumps(result))
        return 0
    if args.action == "verify":
        print(f"checked {report.checked} blocks: {report.bad} failed their checksum; "
              f"{report.removed} blocks removed (with their descendants)")
    elif args.action == "clear":
        print("prefix store cleared")
    if store.recovered_from:
        print(f"the cache file was damaged ({store.recovered_from}) and has been replaced by an empty one")
    print(_stats_text(result))
    return 0


def _stats_text(s: dict) -> str:
    hit_rate = f"{100 * s['hits'] / s['lookups']:.0f}%" if s["lookups"] else "n/a"
    return "\n".join([
        f"blocks           {s['blocks']:,} ({s['tail_blocks']:,} tails, {s['block_size']} tokens per full block)",
        f"tokens stored    {s['tokens']:,}",
        f"size             {s['bytes'] / 1e6:,.1f} MB of KV (file {s['file_bytes'] / 1e6:,.1f} MB), "
        f"budget {s['budget_bytes'] / 2**30:,.2f} GiB",
        f"lookups          {s['lookups']:,} ({s['hits']:,} hits, {s['misses']:,} misses, hit rate {hit_rate})",
        f"tokens restored  {s['tokens_restored']:,}; prefilled {s['tokens_prefilled']:,}",
        f"evicted          {s['evicted_blocks']:,} blocks, {s['evicted_bytes'] / 1e6:,.1f} MB",
    ])


if __name__ == "__main__":
    sys.exit(main())
