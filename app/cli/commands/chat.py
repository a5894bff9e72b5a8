"""``branchwise chat``: send a message and stream the reply (a new conversation, the end of
one, or a branch under ``--parent``)."""

from __future__ import annotations

from app.cli import arguments, opening, reply
from app.cli.arguments import add_remote_arguments, common_options, engine_options
from app.cli.storage_commands import add_message_arguments

NAME = "chat"
LOADS_ENGINE = True
"""Runs in the supervised child (app/cli/supervisor.py)."""
STOP_ON_TERM = True
"""A SIGTERM stops the reply as Ctrl+C does, keeping what was streamed."""


def add_parser(sub) -> None:
    """Add ``chat`` to ``sub`` (the CLI's subparsers)."""
    common, engine = common_options(), engine_options()
    chat = sub.add_parser("chat", parents=[common, engine], help="send a message and stream the reply")
    chat.add_argument("--conversation", type=arguments.row_id, help="continue this conversation (default: a new one)")
    chat.add_argument("--parent", type=arguments.row_id, help="reply under this message instead of the active leaf (a branch)")
    chat.add_argument("--edit", type=arguments.row_id, metavar="ID",
                      help="send the text as a new version of your message ID (the first one too), beside it: "
                           "the original and its replies stay a ‹ › step away")
    chat.add_argument("--system", help="system prompt (for a new conversation, or to change it)")
    add_message_arguments(chat)
    from app.cli.attach_commands import add_attach_arguments

    add_attach_arguments(chat)
    add_remote_arguments(chat)


def run(args) -> int:
    """Send ``args.text`` (or stdin, or ``--file``) and stream the reply; returns the exit code."""
    from app.cli.storage_commands import message_text
    from storage.errors import NotFoundError

    args.text = message_text(args)
    if not args.text.strip():
        raise ValueError("The message is empty; type something to send.")
    from app.cli import attach_commands

    docs = attach_commands.read_attachments(args)  # before anything loads or is stored
    chats = opening.open_chats(args)
    if args.edit is not None and args.parent is not None:
        raise ValueError("Give --edit or --parent, not both: --edit puts the new text beside your message ID.")
    anchor = args.edit if args.edit is not None else args.parent
    if anchor is not None or args.conversation is not None:  # without --model: the chat's own model
        opening.chat_model(args, chats, chats.get_message(anchor).conversation_id
                           if anchor is not None else args.conversation)
    # Load the model first, so a bad model file leaves no trace in the conversations.
    engine = opening.open_engine(args)
    if args.edit is not None:
        edited = chats.get_message(args.edit)
        if edited.role != "user":
            raise ValueError(f"Message {edited.id} is a reply; --edit takes your own message (to have a reply "
                             f"written again, use 'branchwise regenerate {edited.id}').")
        if args.conversation is not None and edited.conversation_id != args.conversation:
            raise NotFoundError(f"Message {args.edit} is not in conversation {args.conversation}.")
        conversation = chats.get_conversation(edited.conversation_id)
        parent_id = edited.parent_id  # None for the first message: a new first message beside it
    elif args.parent is not None:
        parent = chats.get_message(args.parent)
        if parent.role != "assistant":
            raise ValueError(
                f"Message {parent.id} is your own message; --parent takes an assistant reply to answer "
                f"under (to rephrase your message, use --edit {parent.id}).")
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
    if parent_id is not None:
        _refuse_a_reply_being_written(chats, conversation.id, parent_id)
    system = args.system if args.system is not None else (conversation.system_prompt if conversation else "")
    # Refuse an overflowing message before anything is written: no empty "New chat" is left.
    attached = attach_commands.AttachPlan()
    if docs and not engine.is_remote:  # counted with the files in; searched when they do not fit
        attached = attach_commands.plan(args, engine, chats, system,
                                        chats.branches.path_to(parent_id) if parent_id else [], args.text, docs)
    elif docs:
        attached = attach_commands.AttachPlan(docs=docs, sent=[None] * len(docs))
    if not engine.is_remote:  # a server checks its own context window
        reply.check_fits(engine, system, chats.branches.path_to(parent_id) if parent_id else [],
                         attached.text or args.text)
    if conversation is None:
        conversation = chats.create_conversation(system_prompt=system)
    if args.system is not None and args.system != conversation.system_prompt:
        chats.set_system_prompt(conversation.id, args.system)
        conversation = chats.get_conversation(conversation.id)
    from app.session import ConversationSession

    session = ConversationSession(chats)
    user = session.edit(args.edit, args.text) if args.edit is not None else session.send(conversation.id, args.text,
                                                                                          parent_id)
    if docs:
        attach_commands.store_and_link(chats, user.id, attached)
        args.json_attachments = attached.info
        args.attach_footer = f" · {attached.footer()}"
    label = engine.model_name() if engine.is_remote else reply.local_model_label(args)
    return reply.reply(args, engine, chats, conversation, user.id, label)


def _refuse_a_reply_being_written(chats, conversation_id: int, parent_id: int) -> None:
    """Refuse to answer under a reply another process is still streaming: its prompt would
    hold the half-written text, while the tree says it saw the whole reply. A row left
    STREAMING by a crash was marked stopped when the store was opened (its lock was free,
    ``storage.chats.live_streams``), so STREAMING here means it is being written now.

    Raises:
        ValueError: message ``parent_id`` is STREAMING.
    """
    from storage.chat_records import MessageStatus

    parent = chats.get_message(parent_id)
    if parent.role == "assistant" and parent.status == MessageStatus.STREAMING:
        raise ValueError(
            f"Reply {parent.id} in conversation {conversation_id} is still being written (another "
            "branchwise is streaming it right now). Wait for that reply to finish, or branch from an "
            "earlier reply with --parent ID.")
