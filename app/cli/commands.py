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
import threading
from pathlib import Path

from app.cli import supervisor
from app.cli.arguments import Parser, add_remote_arguments, ctx_size, non_negative, parse_size, positive
from app.cli.exit_codes import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from app.cli import opening
from app.cli.serve_command import add_serve_parser, cmd_serve

log = logging.getLogger("branchwise")

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from app.cli.storage_commands import add_delete_parser, add_message_arguments
    from engine.settings import KV_TYPES, EngineSettings  # no llama_cpp: only the defaults

    defaults = EngineSettings()
    common = Parser(add_help=False)
    common.add_argument("--data-dir", help="where chats and the KV cache live (default: the user data folder; env BRANCHWISE_DATA_DIR)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    common.add_argument("--quiet", action="store_true", help="no progress bars on the terminal")

    engine = Parser(add_help=False)
    engine.add_argument("--model", help="a GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    engine.add_argument("--ctx-size", type=ctx_size, default=8192, help="context window in tokens (default 8192)")
    engine.add_argument("--threads", type=int, default=0, help="CPU threads (default: the physical core count less one, at least 1)")
    engine.add_argument("--kv-type", choices=["f16", "q8_0"], default="f16", help="KV cache precision")
    engine.add_argument("--flash-attn", action="store_true",
                        help="use flash attention (faster prefill; replies after a restore may then differ "
                             "in rare cases from uncached ones; always on with --kv-type q8_0)")
    engine.add_argument("--cache-budget", type=parse_size, default=None,
                        help="most bytes the prefix store keeps, e.g. 2G (env BRANCHWISE_CACHE_BUDGET)")
    engine.add_argument("--no-cache", action="store_true", help="neither read nor write the prefix store")
    engine.add_argument("--repack", choices=["auto", "on", "off"], default="auto",
                        help="llama.cpp's CPU weight repacking: auto (off when llama.cpp has AMX kernels, "
                             "which crash on some CPUs), on or off (env BRANCHWISE_REPACK overrides)")
    engine.add_argument("--max-tokens", type=positive, help="most tokens in the reply")
    engine.add_argument("--temperature", type=non_negative, help="0 or more; 0 is deterministic")
    engine.add_argument("--seed", type=int, help="sampling seed")
    engine.add_argument("--top-p", type=float, help="nucleus sampling threshold")
    engine.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    engine.add_argument("--min-p", type=float, help="drop tokens below this fraction of the top probability")
    engine.add_argument("--repeat-penalty", type=float, help="penalty for recently generated tokens (1 = none)")

    p = Parser(
        prog="branchwise",
        description="Branchwise: chat with local models; never read the same tokens twice.",
    )
    p.add_argument("--data-dir", dest="gui_data_dir", help=argparse.SUPPRESS)
    p.add_argument("--model", dest="gui_model", metavar="PATH", help="open the window on this GGUF model")
    p.add_argument("--self-test", action="store_true", help="run one turn and one resume on the bundled model, then exit")
    p.add_argument("--version", action="store_true",
                   help="print the versions, llama.cpp's CPU features and the weight-repacking decision")
    p.add_argument("--screenshot", metavar="PNG", help="open the window offscreen, save a screenshot, exit")
    sub = p.add_subparsers(dest="command", parser_class=Parser)

    chat = sub.add_parser("chat", parents=[common, engine], help="send a message and stream the reply")
    chat.add_argument("--conversation", type=int, help="continue this conversation (default: a new one)")
    chat.add_argument("--parent", type=int, help="reply under this message instead of the active leaf (a branch)")
    chat.add_argument("--system", help="system prompt (for a new conversation, or to change it)")
    add_message_arguments(chat)

    regen = sub.add_parser("regenerate", parents=[common, engine],
                           help="a new sibling reply for an assistant message, or a reply to an unanswered "
                                "message of yours")
    regen.add_argument("message_id", type=int)
    for parser in (chat, regen):
        add_remote_arguments(parser)
    add_serve_parser(sub, [common, engine])

    conv = sub.add_parser("conversations", help="list, show or export conversations")
    conv_sub = conv.add_subparsers(dest="action", required=True, parser_class=Parser)
    conv_sub.add_parser("list", parents=[common], help="every conversation: id, * when pinned, title")
    show = conv_sub.add_parser("show", parents=[common], help="the active branch of one conversation")
    show.add_argument("id", type=int)
    export = conv_sub.add_parser("export", parents=[common],
                                 help="json: the whole tree, every branch; markdown: the active branch")
    export.add_argument("id", type=int, nargs="?")
    export.add_argument("--format", choices=["json", "markdown"], default="markdown")
    export.add_argument("--all-branches", action="store_true", help="markdown: every message, not only the active branch")
    add_delete_parser(conv_sub, common)
    from app.cli import import_commands as cli_import  # `import` and `export --all`: backup and restore

    cli_import.add_export_all_arguments(export)
    cli_import.add_import_parser(sub, common)

    cache = sub.add_parser("cache", help="the KV prefix store")
    cache_sub = cache.add_subparsers(dest="action", required=True, parser_class=Parser)
    for name, text in (("stats", "sizes and hit counts"), ("verify", "check every block's checksum, remove bad ones"),
                       ("clear", "remove every block")):
        c = cache_sub.add_parser(name, parents=[common], help=text)
        c.add_argument("--cache-budget", type=parse_size, default=None, help=argparse.SUPPRESS)

    bench = sub.add_parser("bench", help="measure cold prefill vs resume, restore speed and sharing")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    bench.add_argument("--model", help="a GGUF model (default: the embedded one)")
    bench.add_argument("--quick", action="store_true", help="smaller workload (for a smoke test)")
    bench.add_argument("--llama-server", metavar="PATH",
                       help="a llama-server binary: time its slot save/restore of the same prompt")
    bench.add_argument("--cpu", action="store_true",
                       help="only measure prefill speed with llama.cpp's weight repacking on and off")
    bench.add_argument("--threads", action="store_true",
                       help="only measure prefill and decode speed for each CPU thread count")
    bench.add_argument("--serve", action="store_true",
                       help="only the API server comparison: TTFT for a resent 2,000-token history after a "
                            "restart, branchwise serve vs python -m llama_cpp.server")
    sub.add_parser("gui", parents=[common], help="open the window (the default)")
    from app.cli import models_commands  # `models`: find, fit, download, library

    models_commands.add_parser(sub, common)
    return p


ENGINE_COMMANDS = ("chat", "regenerate", "bench", "serve")
"""Commands that load llama.cpp: they run in a supervised child (app/cli/supervisor.py)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    _model_before_command(parser, args)
    _setup_logging(args)
    from storage.errors import StorageError

    crash_log = None
    if args.self_test or args.command in ENGINE_COMMANDS:
        # Decided before anything heavy is imported: the parent only waits (app/cli/supervisor.py).
        try:
            data_dir = opening.data_dir(args)
        except StorageError as exc:
            print(f"branchwise: {exc}", file=sys.stderr)
            return EXIT_ERROR
        if not supervisor.in_child():
            return supervisor.run_supervised(argv, data_dir, getattr(args, "repack", "auto"))
        crash_log = supervisor.enable_crash_log(data_dir)
        supervisor.exit_with_parent()
        from app.cli.interrupts import install_child_handlers

        install_child_handlers(graceful_term=args.command in ("chat", "regenerate"))

    import sqlite3

    from app.serve import ServeError
    from engine.errors import EngineError

    try:
        if args.version:
            return _print_version(args)
        if args.self_test:
            from app.cli.self_test import run_self_test

            return run_self_test()
        if args.command in (None, "gui"):
            from app.window.gui import run

            if args.screenshot:
                os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
            elif _no_display():
                print("branchwise: no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset). "
                      "Use the command line (branchwise --help) or set QT_QPA_PLATFORM=offscreen.",
                      file=sys.stderr)
                return EXIT_ERROR
            data_dir = getattr(args, "data_dir", None) or args.gui_data_dir
            return run(data_dir, args.gui_model, screenshot=args.screenshot)
        if args.command == "bench" and args.threads:
            from app.bench.threads import run_threads_bench

            return run_threads_bench(as_json=args.json)
        if args.command == "bench" and args.cpu:
            from app.bench.cpu import run_cpu_bench

            return run_cpu_bench(as_json=args.json)
        if args.command == "bench":
            from app.bench.store import run_bench

            if args.serve:
                from app.bench.serve import run_serve_bench

                return run_serve_bench(model=args.model, as_json=args.json, quick=args.quick)

            return run_bench(model=args.model, as_json=args.json, quick=args.quick,
                             llama_server=args.llama_server)
        if args.command == "models":
            from app.cli import models_commands

            return models_commands.run(args, opening.data_dir(args))
        if args.command == "import":
            from app.cli.import_commands import run_import

            return run_import(args, opening.data_dir(args))
        handler = {"chat": cmd_chat, "regenerate": cmd_regenerate, "serve": cmd_serve,
                   "conversations": cmd_conversations, "cache": cmd_cache}[args.command]
        return handler(args)
    except (EngineError, StorageError, ServeError, ValueError) as exc:
        log.debug("command failed", exc_info=True)
        print(f"branchwise: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            from app.cli.storage_commands import error_json

            print(error_json(exc))
        return EXIT_ERROR
    except sqlite3.DatabaseError as exc:
        log.debug("database error", exc_info=True)
        print(f"branchwise: the chat database could not be read ({exc}). It may be damaged: "
              "move chats.sqlite3 out of the data folder to start afresh; nothing was changed.",
              file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # before a reply started (a stopped reply is handled in _reply)
        from app.cli import interrupts

        interrupts.say_at_end("branchwise: interrupted")
        if getattr(args, "json", False):
            print(json.dumps({"error": "interrupted", "saved": None}))
        return 128 + interrupts.stopped_by
    except BrokenPipeError:
        return EXIT_ERROR
    finally:
        if crash_log is not None:
            import faulthandler

            faulthandler.disable()
            crash_log.close()


def _model_before_command(parser, args) -> None:
    """``branchwise --model X chat ...``: the window's ``--model`` placed before a command
    counts as the command's own ``--model``; a command without models refuses it (exit 2)."""
    if not args.gui_model or args.command in (None, "gui"):
        return
    if not hasattr(args, "model"):
        parser.error(f"--model does not apply to '{args.command}'")
    if args.model and args.model != args.gui_model:
        parser.error(f"--model is given twice ({args.gui_model} before '{args.command}', {args.model} after it)")
    args.model = args.gui_model


def _no_display() -> bool:
    return (sys.platform.startswith("linux") and not os.environ.get("QT_QPA_PLATFORM")
            and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"))


def _setup_logging(args) -> None:
    level = getattr(logging, os.environ.get("BRANCHWISE_LOG", "WARNING").upper(), logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # the window logs INFO to its file, not here
        handler.setLevel(level)


def _print_version(args) -> int:
    """What a bug report needs: versions, llama.cpp's system info, the repacking decision."""
    from engine import cpu

    versions = cpu.build_versions()
    info = cpu.system_info()
    data_dir = opening.data_dir(args)
    try:
        decision = cpu.decide_repack("auto", os.environ.get(cpu.ENV_VAR), info, cpu.CrashVerdict.applies(data_dir))
    except ValueError as exc:
        print(f"branchwise: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for name, value in versions.items():
        print(f"{name:<18}{value}")
    print(f"{'llama.cpp system':<18}{info}")
    print(f"{'weight repacking':<18}{'on' if decision.repack else 'off'} ({decision.source}: {decision.reason})")
    print(f"{'data folder':<18}{data_dir}")
    return 0


def _reply(args, engine, chats, conversation, parent_id, model_label: str) -> int:
    """Generate the reply to the path ending at ``parent_id``, stream it, save it (through
    ``app.session``'s recorder, the same rules as the window). A full disk while the reply
    streams does not stop it; what was and was not saved is reported (``saved``)."""
    from app.cli.terminal_text import for_stream
    from app.cli.storage_commands import Saved
    from app.session import ConversationSession, ReplyState
    from engine.errors import ContextOverflowError, EngineError
    from engine.events import FinishReason
    from storage.errors import StorageFullError

    session = ConversationSession(chats)
    stream = not args.json
    from app.cli import interrupts

    recorder = session.start_reply(parent_id, model_label)
    progress = getattr(args, "progress", None)
    first = True

    def on_token(text: str, _tok: int) -> None:
        nonlocal first
        if progress is not None and first:
            progress.stop()  # erase the bars before the reply is printed
        first = False
        had_row = recorder.message_id is not None
        try:
            recorder.add_text(text)
        except StorageFullError as exc:  # keep generating; complete() tries once more
            log.warning("a streamed part of the reply was not saved: %s", exc)
        if not had_row and recorder.message_id is not None:
            interrupts.report(reply=recorder.message_id)
        if stream:
            sys.stdout.write(for_stream(text))  # control characters escaped on a terminal
            sys.stdout.flush()

    use_cache = not args.no_cache
    remote = engine.is_remote  # an OpenAI-compatible server (engine/remote.py)
    if not remote and engine.model.facts.chat_template_note and stream:  # e.g. ChatML fallback
        print(f"branchwise: note: {engine.model.facts.chat_template_note}", file=sys.stderr)

    saved = Saved(user_message=True)
    messages = session.prompt(parent_id)
    interrupts.report(conversation=conversation.id, user=parent_id)  # for a second Ctrl+C
    try:
        with interrupts.stop_sets(threading.Event()) as cancel:  # Ctrl+C, kill: stop between steps
            result = engine.generate(messages, opening.sampling(args, conversation),
                                     use_cache=use_cache, on_token=on_token, snapshot=False, cancel=cancel,
                                     on_progress=progress.on_progress if progress is not None else None)
    except ContextOverflowError as exc:
        raise _overflow_error(exc.prompt_tokens, exc.n_ctx) from exc
    except KeyboardInterrupt:  # Ctrl+C, or SIGINT/SIGTERM passed on by the supervisor
        reply_id = recorder.abandon(ReplyState.STOPPED)
        return _stopped(args, conversation.id, parent_id, reply_id, recorder.text)
    except EngineError:  # keep what was streamed, marked stopped
        recorder.abandon(ReplyState.STOPPED)
        if stream and recorder.text:  # the error line on its own line
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    finally:
        if progress is not None:
            progress.stop()
    try:
        msg_id = recorder.complete(result.text, result.token_ids, result.stats.to_dict())
    except StorageFullError as exc:
        exc.saved = saved
        raise
    if result.stats.finish_reason == FinishReason.CANCELLED:  # stored as stopped, with its stats
        return _stopped(args, conversation.id, parent_id, msg_id, result.text, stats_saved=True)
    saved.reply = saved.stats = True
    if use_cache and not remote and engine.store is not None:  # after the reply is safe: storing the KV is an optimisation
        engine.snapshot(result.stats)  # never raises; a full disk only means no cache
        try:
            prompt = engine.prompt_tokens(messages)
            saved.kv_cache = engine.store.coverage(engine.fingerprint, prompt) == len(prompt)
        except Exception:  # noqa: BLE001 - the cache is optional
            saved.kv_cache = False
        try:
            recorder.add_snapshot(result.stats.snapshot_ms, result.stats.snapshot_bytes_written)
        except StorageFullError as exc:
            saved.stats = False
            saved.problems.append(str(exc))
    if use_cache and not remote and not saved.kv_cache:
        saved.problems.append("the KV cache was not saved (the next turn prefills instead; see the log)")
    engine.close()
    for problem in saved.problems:
        print(f"branchwise: {problem}", file=sys.stderr)
    if args.json:
        user_id = parent_id if chats.get_message(parent_id).role == "user" else None
        print(json.dumps({
            "conversation_id": conversation.id, "user_message_id": user_id,
            "assistant_message_id": msg_id, "text": result.text, "stats": _public_stats(result.stats),
            "model": ({"name": engine.model_name()} if remote else
                      {k: getattr(engine.model.facts, k) for k in ("name", "chat_template", "prompt_format",
                                                                   "chat_template_note")}),
            "saved": saved.to_dict(),
        }))
    elif remote:
        sys.stdout.write("\n")
        print(remote_stats_line(conversation.id, msg_id, result.stats), file=sys.stderr)
    else:
        s = result.stats
        sys.stdout.write("\n")
        print(f"[conversation {conversation.id} · message {msg_id} · restored {s.restored_tokens} tokens "
              f"in {s.restore_ms:.0f} ms · prefilled {s.prefilled_tokens} in {s.prefill_ms / 1000:.2f} s · "
              f"TTFT {s.ttft_ms:.0f} ms · {s.decode_tokens_per_s:.1f} tok/s{_cut_note(s)}]", file=sys.stderr)
    return 0


def _stopped(args, conversation_id: int, user_id: int, reply_id: int | None, text: str,
             stats_saved: bool = False) -> int:
    """After a stop (Ctrl+C, ``kill``): say what was saved and how to go on; with
    ``--json`` one object ``{"error": "interrupted", ..., "saved": {...}}``. Returns 130
    (143 after a SIGTERM)."""
    from app.cli import interrupts
    from app.cli.storage_commands import Saved

    if not args.json and text:
        sys.stdout.write("\n")
        sys.stdout.flush()
    kept = interrupts.what_was_kept(conversation_id, user_id, reply_id, len(text) if reply_id else None)
    interrupts.say_at_end(f"branchwise: stopped. {kept}")
    if args.json:
        print(json.dumps({"error": "interrupted", "conversation_id": conversation_id, "user_message_id": user_id,
                          "assistant_message_id": reply_id, "status": "stopped", "text": text,
                          "saved": Saved(user_message=True, reply=reply_id is not None,
                                         stats=stats_saved and reply_id is not None).to_dict()},
                         ensure_ascii=False))
    return 128 + interrupts.stopped_by


def _cut_note(stats) -> str:
    """`` · cut at ...`` for a reply that ended before the model finished it, else ""."""
    if stats.finish_reason == "length":
        return f" · cut at the --max-tokens limit ({stats.generated_tokens} tokens)"
    if stats.finish_reason == "context":
        return " · cut: the context window is full (--ctx-size)"
    return ""


def remote_stats_line(conversation_id: int, message_id: int, s) -> str:
    """The closing line of a turn answered by ``--engine-url`` (``s``: its GenerationStats)."""
    cached = f"cached {s.restored_tokens:,} of {s.prompt_tokens:,} prompt tokens · " if s.reported else \
        "no usage reported · "
    return (f"[conversation {conversation_id} · message {message_id} · {s.model} at {s.server} · {cached}"
            f"TTFT {s.ttft_ms:.0f} ms · {s.decode_tokens_per_s:.1f} tok/s]")


def _overflow_error(prompt_tokens: int, n_ctx: int) -> ValueError:
    return ValueError(
        f"This conversation is {prompt_tokens:,} tokens long but the context window is {n_ctx:,}; "
        "pass a larger --ctx-size, or start a new conversation.")


def _check_fits(engine, system_prompt: str, path, text: str) -> None:
    """Refuse a message that would not fit the context window before it is stored, so a
    failed turn leaves no unanswered message on the branch."""
    from engine.chat_template import ChatMessage, conversation_messages

    messages = conversation_messages(system_prompt, path) + [ChatMessage("user", text)]
    n = len(engine.prompt_tokens(messages))
    if n + 1 > engine.llama.n_ctx():
        raise _overflow_error(n, engine.llama.n_ctx())


def _public_stats(stats) -> dict:
    d = stats.to_dict()
    keys = ("prompt_tokens", "restored_tokens", "prefilled_tokens", "generated_tokens", "restore_ms",
            "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "snapshot_bytes_written")
    return {**{k: d[k] for k in keys}, **{k: v for k, v in d.items() if k not in keys}}


def _model_label(args) -> str:
    from app.session import model_label
    from engine.model_file import default_model_path

    return model_label(args.model or default_model_path())


# -- commands ----------------------------------------------------------------------------


def cmd_chat(args) -> int:
    from app.cli.storage_commands import message_text
    from storage.errors import NotFoundError

    args.text = message_text(args)
    if not args.text.strip():
        raise ValueError("The message is empty; type something to send.")
    chats = opening.open_chats(args)
    # Load the model first, so a bad model file leaves no trace in the conversations.
    engine = opening.open_engine(args)
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
        from app.session import ConversationSession

        conversation = chats.get_conversation(args.conversation)
        parent_id = conversation.active_leaf_id
        pending = ConversationSession(chats).unanswered_leaf(conversation.id)
        if pending is not None:  # never two questions in a row (another branchwise may be answering it)
            raise ValueError(
                f"Conversation {conversation.id} ends on your message {pending.id}, which has no reply yet "
                "(another branchwise may be answering it right now). Wait for that reply, answer it with "
                f"'branchwise regenerate {pending.id}', or branch from an earlier reply with --parent ID.")
    else:
        conversation = None
        parent_id = None
    system = args.system if args.system is not None else (conversation.system_prompt if conversation else "")
    # Refuse an overflowing message before anything is written: no empty "New chat" is left.
    if not engine.is_remote:  # a server checks its own context window
        _check_fits(engine, system, chats.path_to(parent_id) if parent_id else [], args.text)
    if conversation is None:
        conversation = chats.create_conversation(system_prompt=system)
    if args.system is not None and args.system != conversation.system_prompt:
        chats.set_system_prompt(conversation.id, args.system)
        conversation = chats.get_conversation(conversation.id)
    from app.session import ConversationSession

    user = ConversationSession(chats).send(conversation.id, args.text, parent_id)
    label = engine.model_name() if engine.is_remote else _model_label(args)
    return _reply(args, engine, chats, conversation, user.id, label)


def cmd_regenerate(args) -> int:
    chats = opening.open_chats(args)
    msg = chats.get_message(args.message_id)
    if msg.role == "user" and not chats.children(msg.id, msg.conversation_id):
        parent_id = msg.id  # an unanswered message of the user's (a crash, Ctrl+C): answer it in place
    elif msg.role != "assistant" or msg.parent_id is None:
        raise ValueError(f"Message {msg.id} is a {msg.role} message that already has a reply; regenerate takes "
                         "an assistant reply, or a message of yours that has none.")
    else:
        parent_id = msg.parent_id
    conversation = chats.get_conversation(msg.conversation_id)
    engine = opening.open_engine(args)
    label = engine.model_name() if engine.is_remote else _model_label(args)
    return _reply(args, engine, chats, conversation, parent_id, label)


def cmd_conversations(args) -> int:
    from app.session.markdown_export import conversation_markdown
    from storage.importers.branchwise import conversation_json
    from app.cli.terminal_text import echo

    chats = opening.open_chats(args)
    if args.action == "list":
        rows = chats.list_conversations()
        if args.json:
            print(json.dumps([{"id": c.id, "title": c.title, "pinned": c.pinned, "updated_at": c.updated_at,
                               "messages": len(chats.tree(c.id))} for c in rows]))
        else:
            for c in rows:
                pin = "*" if c.pinned else " "
                echo(f"{c.id:>5} {pin} {' '.join(c.title.splitlines())}")  # escaped on a terminal
        return 0
    if args.action == "show":
        data = conversation_json(chats, args.id)
        if args.json:
            print(json.dumps(data, ensure_ascii=False))
        else:
            echo(conversation_markdown(data, active_only=True))
        return 0
    if args.action == "delete":
        from app.cli.storage_commands import cmd_delete

        return cmd_delete(args, chats, lambda: opening.open_store(args))
    if args.all:
        from app.cli.import_commands import run_export_all

        return run_export_all(args, chats)
    if args.action == "export" and args.id is None:
        raise ValueError("conversations export needs a conversation id, or --all for every conversation.")
    data = conversation_json(chats, args.id)
    if args.format == "json":
        text = json.dumps(data, ensure_ascii=False, indent=2)
    else:
        from app.cli.storage_commands import branch_note

        text = (branch_note(data, args.all_branches) + "\n\n"  # the one note on what is left out
                + conversation_markdown(data, active_only=not args.all_branches, left_out_note=False))
    if args.output:
        from app.cli.import_commands import write_file

        write_file(Path(args.output), lambda out: out.write(text + "\n"))
        print(f"Exported conversation {args.id} ({args.format}) to {args.output}.", file=sys.stderr)
    elif args.format == "json":
        print(text)
    else:
        echo(text)  # control characters escaped on a terminal
    return 0


def cmd_cache(args) -> int:
    store = opening.open_store(args)
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
    from app.cli.storage_commands import stats_text

    print(stats_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
