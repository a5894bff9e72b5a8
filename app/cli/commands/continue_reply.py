"""``branchwise continue ID``: more of a reply that was stopped (Ctrl+C) or hit max tokens,
appended to the same message; its prompt is the history plus the reply's token ids, so the
prefix store restores all of it (``app/session/continuation.py``)."""

from __future__ import annotations

from app.cli import arguments, opening, reply
from app.cli.arguments import common_options, engine_options

NAME = "continue"
LOADS_ENGINE = True
"""Runs in the supervised child (app/cli/supervisor.py)."""
STOP_ON_TERM = True
"""A SIGTERM stops the reply as Ctrl+C does, keeping what was streamed."""


def add_parser(sub) -> None:
    """Add ``continue`` to ``sub`` (the CLI's subparsers)."""
    common, engine = common_options(), engine_options()
    cont = sub.add_parser("continue", parents=[common, engine],
                          help="continue a reply that was stopped or hit max tokens, in the same message")
    cont.add_argument("message_id", type=arguments.row_id,
                      help="the stopped or cut reply to go on with, in the same message (its id: conversations show)")


def run(args) -> int:
    """Continue reply ``args.message_id``; returns the exit code.

    Raises:
        ValueError: the message is not a reply that was stopped or cut at max tokens, or
            other messages follow it (then its text is part of their history).
    """
    from app.session.continuation import can_continue, why_not_continued

    chats = opening.open_chats(args)
    msg = chats.get_message(args.message_id)
    if not can_continue(msg):
        raise ValueError(why_not_continued(msg))
    if chats.branches.children(msg.id, msg.conversation_id):
        raise ValueError(f"Message {msg.id} has replies under it; continue works on the last reply of a branch.")
    conversation = chats.get_conversation(msg.conversation_id)
    opening.chat_model(args, chats, msg.conversation_id)  # without --model: the chat's own model
    engine = opening.open_engine(args)
    if engine.is_remote:
        raise ValueError("Continue needs a local model (a remote server's KV cache is not ours to continue).")
    return reply.reply(args, engine, chats, conversation, msg.parent_id, reply.local_model_label(args),
                       continuing=msg)
