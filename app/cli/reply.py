"""One turn of ``chat`` or ``regenerate``: generate the reply, stream it to the terminal,
save it through the session layer's recorder, store its KV, and say what was saved (or,
after Ctrl+C or ``kill``, what was kept and how to go on).
"""

from __future__ import annotations

import json
import logging
import sys
import threading

from app.cli import opening

log = logging.getLogger("branchwise")


def reply(args, engine, chats, conversation, parent_id, model_label: str) -> int:
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
        raise overflow_error(exc.prompt_tokens, exc.n_ctx) from exc
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


def overflow_error(prompt_tokens: int, n_ctx: int) -> ValueError:
    """The error for a prompt of ``prompt_tokens`` over a context window of ``n_ctx`` tokens."""
    return ValueError(
        f"This conversation is {prompt_tokens:,} tokens long but the context window is {n_ctx:,}; "
        "pass a larger --ctx-size, or start a new conversation.")


def check_fits(engine, system_prompt: str, path, text: str) -> None:
    """Refuse a message that would not fit the context window before it is stored, so a
    failed turn leaves no unanswered message on the branch.

    Raises:
        ValueError: the system prompt, ``path`` and ``text`` are over the context window.
    """
    from engine.chat_template import ChatMessage, conversation_messages

    messages = conversation_messages(system_prompt, path) + [ChatMessage("user", text)]
    n = len(engine.prompt_tokens(messages))
    if n + 1 > engine.llama.n_ctx():
        raise overflow_error(n, engine.llama.n_ctx())


def _public_stats(stats) -> dict:
    d = stats.to_dict()
    keys = ("prompt_tokens", "restored_tokens", "prefilled_tokens", "generated_tokens", "restore_ms",
            "prefill_ms", "ttft_ms", "decode_tokens_per_s", "snapshot_ms", "snapshot_bytes_written")
    return {**{k: d[k] for k in keys}, **{k: v for k, v in d.items() if k not in keys}}


def local_model_label(args) -> str:
    """The model label stored on a reply of the local engine (``app.session.model_label``
    of ``--model``, or of the bundled model)."""
    from app.session import model_label
    from engine.model_file import default_model_path

    return model_label(args.model or default_model_path())
