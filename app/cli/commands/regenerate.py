"""``branchwise regenerate ID``: a new sibling reply for an assistant message, or the reply to
an unanswered message of the user's (after a crash or Ctrl+C)."""

from __future__ import annotations

from app.cli import arguments, opening, reply
from app.cli.arguments import add_remote_arguments, common_options, engine_options

NAME = "regenerate"
LOADS_ENGINE = True
"""Runs in the supervised child (app/cli/supervisor.py)."""
STOP_ON_TERM = True
"""A SIGTERM stops the reply as Ctrl+C does, keeping what was streamed."""


def add_parser(sub) -> None:
    """Add ``regenerate`` to ``sub`` (the CLI's subparsers)."""
    common, engine = common_options(), engine_options()
    regen = sub.add_parser("regenerate", parents=[common, engine],
                           help="a new sibling reply for an assistant message, or a reply to an unanswered "
                                "message of yours")
    regen.add_argument("message_id", type=arguments.row_id,
                       help="the reply to write again (a new sibling), or your message to answer (its id: "
                            "conversations show)")
    add_remote_arguments(regen)


def run(args) -> int:
    """A new reply for ``args.message_id``; returns the exit code."""
    chats = opening.open_chats(args)
    msg = chats.get_message(args.message_id)
    if msg.role == "user" and not chats.branches.children(msg.id, msg.conversation_id):
        parent_id = msg.id  # an unanswered message of the user's (a crash, Ctrl+C): answer it in place
    elif msg.role != "assistant" or msg.parent_id is None:
        raise ValueError(f"Message {msg.id} is a {msg.role} message that already has a reply; regenerate takes "
                         "an assistant reply, or a message of yours that has none.")
    else:
        parent_id = msg.parent_id
    conversation = chats.get_conversation(msg.conversation_id)
    opening.chat_model(args, chats, msg.conversation_id)  # without --model: the chat's own model
    engine = opening.open_engine(args)
    label = engine.model_name() if engine.is_remote else reply.local_model_label(args)
    return reply.reply(args, engine, chats, conversation, parent_id, label)
