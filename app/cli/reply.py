"""One turn of ``chat`` or ``regenerate``: generate the reply, stream it to the terminal,
save it through the session layer's recorder, store its KV, and say what was saved (or,
after Ctrl+C or ``kill``, what was kept and how to go on).
"""

from __future__ import annotations

import json
import logging
import sys
import threading

from app.cli import opening, reasoning_view

log = logging.getLogger("branchwise")


def reply(args, engine, chats, conversation, parent_id, model_label: str, continuing=None) -> int:
    """Generate the reply to the path ending at ``parent_id``, stream it, save it (through
    ``app.session``'s recorder, the same rules as the window). A full disk while the reply
    streams does not stop it; what was and was not saved is reported (``saved``).
    ``continuing``: a reply (Message) to continue in place (``app/session/continuation.py``):
    its token ids go on the prompt, and only the new text is streamed."""
    from app.cli.terminal_text import for_stream
    from app.cli.storage_commands import ConversationDeleted, DeletionWatch, Saved
    from app.session import ConversationSession
    from engine.errors import ContextOverflowError, EngineError
    from engine.events import FinishReason
    from storage.errors import NotFoundError, StorageFullError

    session = ConversationSession(chats)
    stream = not args.json
    from app.cli import interrupts

    if continuing is not None:
        from app.session.continuation import ContinuationRecorder

        recorder = ContinuationRecorder(chats, continuing, model_label)
        interrupts.report(reply=continuing.id)  # the row exists already: a second Ctrl+C names it
    else:
        recorder = session.start_reply(parent_id, model_label)
    progress = getattr(args, "progress", None)
    first = True
    warned: list = []
    watch = DeletionWatch(chats, conversation.id, parent_id)  # a delete elsewhere stops the reply
    stop = threading.Event()
    thinking = reasoning_view.ReasoningPrinter(getattr(args, "reasoning", None), stream)

    def on_reasoning(text: str, tok: int) -> None:  # a reasoning model's thinking (engine/reasoning.py)
        nonlocal first
        if progress is not None and first:
            progress.stop()
        first = False
        try:
            recorder.add_reasoning(text)
        except StorageFullError as exc:
            if not warned:  # once, not once per token
                log.warning("a streamed part of the reasoning was not saved: %s", exc)
            warned.append(exc)
        except NotFoundError:  # the conversation went meanwhile
            watch.deleted = True
        if watch.poll():
            stop.set()
        thinking.reasoning(text, tok)

    def on_token(text: str, _tok: int) -> None:
        nonlocal first
        if progress is not None and first:
            progress.stop()  # erase the bars before the reply is printed
        first = False
        thinking.answer_starts()
        had_row = recorder.message_id is not None
        try:
            recorder.add_text(text)
        except StorageFullError as exc:  # keep generating; complete() tries once more
            if not warned:  # once, not once per token
                log.warning("a streamed part of the reply was not saved (the rest is tried again at the "
                            "end): %s", exc)
            warned.append(exc)
        except NotFoundError:  # the conversation went meanwhile
            watch.deleted = True
        if watch.poll():
            stop.set()
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
        with interrupts.stop_sets(stop) as cancel:  # Ctrl+C, kill, a delete: stop between steps
            result = engine.generate(messages, opening.sampling(args, conversation),
                                     use_cache=use_cache, on_token=on_token, snapshot=False, cancel=cancel,
                                     on_progress=progress.on_progress if progress is not None else None,
                                     on_reasoning=on_reasoning,
                                     thinking_budget=getattr(args, "thinking_budget", None),
                                     **({"reply_prefix": list(continuing.token_ids)} if continuing else {}))
    except ContextOverflowError as exc:
        if getattr(exc, "n_messages", None):  # engine.model.HistoryTooLongError: its own counts
            raise ValueError(f"{exc} Start a new conversation, or branch from an earlier message with "
                             "--parent ID.") from exc
        raise overflow_error(exc.prompt_tokens, exc.n_ctx) from exc
    except KeyboardInterrupt:  # Ctrl+C, or SIGINT/SIGTERM passed on by the supervisor
        reply_id = _abandon(recorder)
        return _stopped(args, conversation.id, parent_id, reply_id, recorder.text, kept=recorder.kept_text)
    except EngineError:  # keep what was streamed, marked stopped
        _abandon(recorder)
        if stream and recorder.text:  # the error line on its own line
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    finally:
        if progress is not None:
            progress.stop()
    if stream and watch.gone() and recorder.text:
        sys.stdout.write("\n")  # the error line on its own line
    if watch.gone():  # nothing is stored for a deleted conversation: no reply, no KV blocks
        raise ConversationDeleted(conversation.id)
    try:
        thinking.answer_starts()
        msg_id = recorder.complete(result.text, result.token_ids, result.stats.to_dict(),
                                   getattr(result, "reasoning", None))
    except StorageFullError as exc:  # the row made at the first token keeps what was saved
        reply_id = _abandon(recorder)
        exc.saved, exc.turn = saved, {"conversation_id": conversation.id, "assistant_message_id": reply_id,
                                      "text": result.text}  # the whole reply, kept or not
        saved.problems.append(_partly_kept(conversation.id, reply_id, recorder.kept_text, result.text, args.json))
        print(f"branchwise: {saved.problems[-1]}", file=sys.stderr)
        raise
    except NotFoundError as exc:  # deleted between the check and the save
        raise ConversationDeleted(conversation.id) from exc
    if result.stats.finish_reason == FinishReason.CANCELLED:  # stored as stopped, with its stats and ids
        kv = False
        if use_cache and not remote and engine.store is not None and not watch.gone():
            with interrupts.stops_held():  # its KV too, so that `continue` restores all of it
                engine.snapshot(result.stats)
            kv = _covered(engine, list(result.prompt_ids) + list(result.token_ids[:-1]))
        return _stopped(args, conversation.id, parent_id, msg_id, result.text, stats_saved=True,
                        can_continue=True, kv_saved=kv)
    saved.reply = saved.stats = True
    _remember_model(chats, conversation.id, "" if remote else str(engine.model.path), model_label)
    held = None
    if use_cache and not remote and engine.store is not None:  # after the reply is safe: storing the KV is an optimisation
        if watch.gone():
            raise ConversationDeleted(conversation.id)
        with interrupts.stops_held() as held:  # Ctrl+C or kill now: store the KV first, then stop
            engine.snapshot(result.stats)  # never raises; a full disk only means no cache
        if watch.gone():  # deleted while the blocks were written: the delete did not see them
            watch.forget_written(engine, list(result.prompt_ids) + list(result.token_ids))
            raise ConversationDeleted(conversation.id)
        saved.kv_cache = _covered(engine, engine.prompt_tokens(messages))
        try:
            recorder.add_snapshot(result.stats.snapshot_ms, result.stats.snapshot_bytes_written)
        except StorageFullError as exc:
            saved.stats = False
            saved.problems.append(str(exc))
        except NotFoundError as exc:  # deleted just now: its blocks go too
            watch.forget_written(engine, list(result.prompt_ids) + list(result.token_ids))
            raise ConversationDeleted(conversation.id) from exc
    if use_cache and not remote and not saved.kv_cache:
        saved.problems.append(_kv_not_saved(engine, len(result.prompt_ids) + len(result.token_ids)))
    engine.close()
    for problem in saved.problems:
        print(f"branchwise: {problem}", file=sys.stderr)
    if args.json:
        user_id = parent_id if chats.get_message(parent_id).role == "user" else None
        print(json.dumps({
            "conversation_id": conversation.id, "user_message_id": user_id,
            "assistant_message_id": msg_id, "text": result.text, "reasoning": getattr(result, "reasoning", None),
            "stats": _public_stats(result.stats),
            "model": ({"name": engine.model_name()} if remote else
                      {**{k: getattr(engine.model.facts, k) for k in ("name", "chat_template", "prompt_format",
                                                                      "chat_template_note")},
                       "reasoning_format": getattr(engine.model.facts, "reasoning_format", "none")}),
            "saved": saved.to_dict(),
            **({"attachments": args.json_attachments} if getattr(args, "json_attachments", None) else {}),
        }))
    elif remote:
        sys.stdout.write("\n")
        print(remote_stats_line(conversation.id, msg_id, result.stats), file=sys.stderr)
    else:
        from app.session import restored_words

        s = result.stats
        sys.stdout.write("\n")
        first_turn = not any(m.role == "assistant" for m in messages)  # the same words as the window
        print(f"[conversation {conversation.id} · message {msg_id} · {restored_words(s.restored_tokens, first_turn)} tokens "
              f"in {s.restore_ms:.0f} ms · prefilled {s.prefilled_tokens} in {s.prefill_ms / 1000:.2f} s · "
              f"TTFT {s.ttft_ms:.0f} ms · {s.decode_tokens_per_s:.1f} tok/s{_draft_note(s)}{_cut_note(s)}"
              f"{getattr(args, 'attach_footer', '')}]", file=sys.stderr)
    if held is not None and held.signum:  # stopped while the KV was stored: it was finished first
        print("branchwise: stopped; the reply and its KV cache were saved first", file=sys.stderr)
        return 128 + held.signum
    return 0


def _remember_model(chats, conversation_id: int, path: str, label: str) -> None:
    """The conversation now runs on this model (``ChatStore.models``; the window offers it
    back when the chat is opened). The reply is saved already: a failure here is only logged."""
    from storage.errors import StorageError

    try:
        chats.models.remember(conversation_id, path, label)
    except StorageError as exc:
        log.warning("could not remember the model of conversation %d: %s",
                                            conversation_id, exc)


def _abandon(recorder) -> int | None:
    """End ``recorder``'s reply as stopped; on a full disk its row (if any) keeps the last
    saved text and becomes "stopped" at the next start. Returns the row's id, or None."""
    from app.session import ReplyState
    from storage.errors import StorageFullError

    try:
        return recorder.abandon(ReplyState.STOPPED)
    except StorageFullError as exc:
        log.debug("the stopped reply's last part was not saved: %s", exc)
        return recorder.message_id


def _partly_kept(conversation_id: int, reply_id: int | None, kept: str, text: str | None = None,
                 as_json: bool = False) -> str:
    """The line naming the message that holds the part of a reply a full disk left (``kept``:
    its text; ``text``: the whole reply, when known, so the line says how much was lost;
    ``reply_id`` None: no row could be made, nothing is kept)."""
    lost = "" if text is None or len(text) <= len(kept) else f" ({len(text) - len(kept):,} were not saved)"
    where = "the JSON answer's \"text\"" if as_json else "the text printed above"
    if reply_id is None:
        return (f"none of the reply's {len(text or ''):,} characters were saved in conversation {conversation_id}"
                f" (the disk is full); the whole reply is in {where}.")
    said = f"; the whole reply is in {where}" if lost else ""
    return (f"only the first {len(kept):,} characters of the reply are kept{lost}, as message {reply_id} in "
            f"conversation {conversation_id}{said}; once there is room, get a whole reply with "
            f"'branchwise regenerate {reply_id}'.")


def _kv_not_saved(engine, n_tokens: int) -> str:
    """Why this turn's KV cache was not saved, in words: larger than the cache budget, or
    another reason the log holds."""
    store, layout = engine.store, getattr(engine, "layout", None)
    if store is not None and layout is not None:
        need = n_tokens * layout.bytes_per_token
        if need > store.budget_bytes:
            return (f"the KV cache was not saved: this conversation's {need / 2**20:,.1f} MiB of KV are more than "
                    f"the cache budget of {store.budget_bytes / 2**20:,.1f} MiB (--cache-budget); the next turn "
                    "prefills instead")
    return "the KV cache was not saved (the next turn prefills instead; see the log)"


def _covered(engine, ids: list[int]) -> bool:
    """Whether the prefix store now holds the KV of all of ``ids`` (False when it cannot
    tell: the cache is optional)."""
    try:
        return engine.store.coverage(engine.fingerprint, ids) == len(ids)
    except Exception:  # noqa: BLE001 - the cache is optional
        return False


def _stopped(args, conversation_id: int, user_id: int, reply_id: int | None, text: str,
             stats_saved: bool = False, kept: str | None = None, can_continue: bool = False,
             kv_saved: bool = False) -> int:
    """After a stop (Ctrl+C, ``kill``): say what was saved and how to go on; with
    ``--json`` one object ``{"error": "interrupted", ..., "saved": {...}}``. ``text`` is
    what was generated, ``kept`` what the reply's row holds (None: all of ``text``; less
    when a full disk refused the later saves); ``can_continue``: the reply was saved with
    its token ids, so ``branchwise continue`` can pick it up. Returns 130 (143 after a
    SIGTERM)."""
    from app.cli import interrupts
    from app.cli.storage_commands import Saved

    kept = text if kept is None else kept
    if not args.json and text:
        sys.stdout.write("\n")
        sys.stdout.flush()
    saved = Saved(user_message=True, reply=reply_id is not None and kept == text,
                  stats=stats_saved and reply_id is not None and kept == text, kv_cache=kv_saved)
    if reply_id is not None and kept != text:
        saved.problems.append(_partly_kept(conversation_id, reply_id, kept, text, args.json))
        print(f"branchwise: {saved.problems[-1]}", file=sys.stderr)
    said = interrupts.what_was_kept(conversation_id, user_id, reply_id, len(kept) if reply_id else None,
                                    can_continue=can_continue and kept == text)
    interrupts.say_at_end(f"branchwise: stopped. {said}")
    if args.json:
        print(json.dumps({"error": "interrupted", "conversation_id": conversation_id, "user_message_id": user_id,
                          "assistant_message_id": reply_id, "status": "stopped", "text": text,
                          "saved": saved.to_dict()}, ensure_ascii=False))
    return 128 + interrupts.stopped_by


def _draft_note(stats) -> str:
    from app.session.labels import draft_note

    note = draft_note(stats.to_dict())
    return f" · {note}" if note else ""


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
    return ValueError(
        f"This conversation is {prompt_tokens:,} tokens long but the context window is {n_ctx:,}; "
        "pass a larger --ctx-size, or start a new conversation.")


def check_fits(engine, system_prompt: str, path, text: str) -> None:
    """Refuse a message that would not fit the context window before it is stored, so a
    failed turn leaves no unanswered message on the branch.

    Raises:
        ValueError: the system prompt, ``path`` and ``text`` are over the context window
            (or the history is too long to count).
    """
    from engine.chat_template import ChatMessage, conversation_messages
    from engine.model import HistoryTooLongError

    messages = conversation_messages(system_prompt, path) + [ChatMessage("user", text)]
    try:
        n = len(engine.prompt_tokens(messages))
    except HistoryTooLongError as exc:
        raise ValueError(f"{exc} Start a new conversation, or branch from an earlier message with --parent ID; "
                         "nothing was saved.") from exc
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
