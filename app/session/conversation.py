"""The conversation rules: what send, edit, regenerate, fork and switching siblings do to the
tree of messages in ``chats.sqlite3``, and what to offer when a prompt overflows.

A conversation is a tree (``storage/chats/``): every edit or regeneration adds a sibling,
and the conversation's active leaf picks the branch that is shown and continued. Nothing
here recurses over the tree or talks to the engine; the front end sends the prompts that
``prompt`` returns to its engine and records the reply with ``start_reply``.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.session.packed_prompt import PackedPrompt, prompt_ids
from app.session.path_view import PATH_TAIL, PathView, SiblingPositions
from app.session.recorder import ReplyRecorder, ReplyState
from engine.chat_template import ChatMessage, conversation_messages
from engine.documents.attach import prompt_messages, with_attachments  # conversation_messages with attachments rendered in
from engine.events import pack_after
from storage.chat_records import DEFAULT_SAMPLING
from storage.errors import NotFoundError

BRANCH_FILL = 0.5
""""Continue on a new branch" keeps the newest turns that fill about this share of the context."""
TOKENS_PER_CHAR = 1 / 3  # estimate for a message with no saved token ids (English text: ~3-4 chars/token)
TEMPLATE_TOKENS = 8  # estimate of a message's chat-template tokens (role markers, separators)


@dataclass(frozen=True)
class Overflow:
    """A prompt that does not fit: ``prompt_tokens`` and ``n_ctx`` in tokens, and the context
    size that would fit it with room for a reply (``suggested_n_ctx``; equal to ``n_ctx``
    when the model was not trained for more)."""

    user_message_id: int
    prompt_tokens: int
    n_ctx: int
    suggested_n_ctx: int


@dataclass(frozen=True)
class SendPlan:
    """A message about to be sent under the active leaf of a conversation, read before it is
    stored: the engine's ``messages`` for its reply (the new user message last, exactly what
    ``prompt`` gives once it is stored), the ``parent_id`` to store it under (None: the first
    message) and the conversation's ``sampling``."""

    messages: list[ChatMessage]
    parent_id: int | None
    sampling: dict
    path: bytes | None = None  # pack_messages bytes of the messages before ``messages`` (then only the new one)


def suggested_context_size(prompt_tokens: int, n_ctx: int, max_tokens: int, trained: int = 0) -> int:
    """A context size (tokens) for a prompt of ``prompt_tokens`` that overflowed ``n_ctx``:
    room for the prompt and ``max_tokens`` of reply, at least twice ``n_ctx``, rounded up to a
    multiple of 1,024, and no more than the model's trained context ``trained`` (0: unknown)."""
    need = prompt_tokens + max_tokens
    size = (max(need, n_ctx * 2) + 1023) // 1024 * 1024
    if trained:
        size = min(size, max(trained, n_ctx))
    return size


def is_empty_reply(message) -> bool:
    """True for an assistant reply with no text that was stopped or failed (Esc before its
    first token): the transcript shows it as stopped, with Retry."""
    return message.role == "assistant" and not message.content and message.status in (
        ReplyState.STOPPED, ReplyState.ERROR)


class ConversationSession:
    """The rules of one data folder's conversations, on a ``storage.chats.ChatStore``.

    Methods raise ``storage.errors.NotFoundError`` for an unknown id and other
    ``StorageError``s when the database cannot be written; nothing is half-done then.
    """

    def __init__(self, chats):
        self.chats = chats

    # -- reading -------------------------------------------------------------------------

    def prompt(self, user_message_id: int) -> list[ChatMessage]:
        """The engine's messages for a reply under ``user_message_id``: the system prompt
        (when set), then the path, assistant messages with their saved token ids."""
        m = self.chats.get_message(user_message_id)
        conv = self.chats.get_conversation(m.conversation_id)
        return prompt_messages(self.chats, conv.system_prompt, self.chats.branches.path_to(user_message_id))

    def prompt_before(self, message_id: int) -> list[ChatMessage]:
        """The engine's messages before ``message_id``: the system prompt (when set) and the
        path to its parent (what an edit of ``message_id`` is sent after)."""
        m = self.chats.get_message(message_id)
        conv = self.chats.get_conversation(m.conversation_id)
        path = self.chats.branches.path_to(m.parent_id) if m.parent_id is not None else []
        return prompt_messages(self.chats, conv.system_prompt, path)
    def prompt_for_send(self, conversation_id: int | None, text: str, system_prompt: str = "",
                        packed: PackedPrompt | None = None) -> tuple[list[ChatMessage] | bytes, list[int | None]]:
        """The engine's messages for sending ``text`` under the active leaf of
        ``conversation_id`` (None: a new chat with ``system_prompt``), before it is stored;
        and the message id of each (None for the system prompt and the new message). With
        ``packed`` still current, the messages are its bytes with the new one appended
        (``engine.events.pack_after``), and the path is not read again."""
        if conversation_id is not None and packed is not None:
            if packed.current_for(self.chats.get_conversation(conversation_id)):
                return pack_after(packed.data, [ChatMessage("user", text)]), [*packed.ids, None]
        path = self.chats.active_path(conversation_id) if conversation_id is not None else []
        if conversation_id is not None:
            system_prompt = self.chats.get_conversation(conversation_id).system_prompt
        messages = prompt_messages(self.chats, system_prompt, path) + [ChatMessage("user", text)]
        return messages, prompt_ids(messages[:-1], path) + [None]

    def send_plan(self, conversation_id: int, text: str, packed: PackedPrompt | None = None) -> SendPlan:
        """What sending ``text`` under the active leaf of ``conversation_id`` takes, before it
        is stored (the window sends the request first and stores the message right after,
        under ``SendPlan.parent_id``, with ``send``). With ``packed`` still current (its leaf
        and system prompt), the path is not read again: the plan carries its bytes."""
        conv = self.chats.get_conversation(conversation_id)
        if packed is not None and packed.current_for(conv):
            return SendPlan([ChatMessage("user", text)], packed.leaf_id, dict(conv.sampling), packed.data)
        path = self.chats.active_path(conversation_id)
        messages = prompt_messages(self.chats, conv.system_prompt, path) + [ChatMessage("user", text)]
        return SendPlan(messages, path[-1].id if path else None, dict(conv.sampling))

    def prompt_with_ids(self, user_message_id: int) -> tuple[list[ChatMessage], list[int | None]]:
        """``prompt(user_message_id)`` and the message id of each (None: the system prompt)."""
        m = self.chats.get_message(user_message_id)
        conv = self.chats.get_conversation(m.conversation_id)
        path = self.chats.branches.path_to(user_message_id)
        messages = prompt_messages(self.chats, conv.system_prompt, path)
        return messages, prompt_ids(messages, path)

    def active_prompt(self, conversation_id: int) -> list[ChatMessage]:
        """The engine's messages for the active path of ``conversation_id`` (for a token count)."""
        conv = self.chats.get_conversation(conversation_id)
        return prompt_messages(self.chats, conv.system_prompt, self.chats.active_path(conversation_id))

    def shown_path(self, conversation_id: int, reply: ReplyRecorder | None = None,
                   tail: int = PATH_TAIL) -> PathView:
        """The messages to show for ``conversation_id``: its active path; while ``reply``
        streams into this conversation, the path to the message being answered (the reply
        itself is drawn from its recorder, not from the database). A ``PathView`` of which the
        ids of the newest ``tail`` messages are read now (a walk of at most that many steps),
        the rest when asked for, and each message when it is first asked for (a transcript
        draws the newest few hundred of a branch of any length)."""
        if reply is not None and not reply.finished and reply.conversation_id == conversation_id:
            if reply.message_id is None:
                return self._path_up(reply.parent_id, tail)
            leaf = self.chats.get_conversation(conversation_id).active_leaf_id
            path = self._path_up(leaf, tail + 1)
            ids = path.tail_ids
            if ids and ids[-1] == reply.message_id:  # the reply is the leaf: its parent's path
                return PathView(self.chats, ids[:-1], path.complete)
            return PathView(self.chats, [i for i in path.ids if i != reply.message_id])
        return self._path_up(self.chats.get_conversation(conversation_id).active_leaf_id, tail)

    def _path_up(self, leaf_id: int | None, tail: int) -> PathView:
        if leaf_id is None:
            return PathView(self.chats, [])
        ids, reaches_root = self.chats.branches.path_tail(leaf_id, tail)
        return PathView(self.chats, ids, complete=reaches_root)

    def sibling_positions(self, path) -> SiblingPositions:
        """For each message of ``path``: (its 1-based position among its siblings, their count),
        the ``‹ 2/3 ›`` of the branch navigator; a mapping that reads each one when first asked
        for (a transcript asks only for the messages it draws; a ``PathView`` is not read whole)."""
        return SiblingPositions(self.chats, path if isinstance(path, PathView) else [m.id for m in path])

    def unanswered(self, conversation_id: int, path: list | None = None) -> int | None:
        """The id of the active leaf when it is a user message with no reply (a turn that
        failed, e.g. the engine crashed), else None. ``retry`` answers it in place.
        ``path``: the active path when the caller has read it already (not read again)."""
        path = self.chats.active_path(conversation_id) if path is None else path
        if path and path[-1].role == "user" and not self.chats.branches.children(path[-1].id, conversation_id):
            return path[-1].id
        return None

    def unanswered_leaf(self, conversation_id: int):
        """The user message the active branch ends on without an answer, or None: the leaf
        itself when it is a user message, or the parent of a leaf that is an empty reply
        stopped or failed before its first token. Sending under it would put two questions
        in a row, so the window asks first (answer it, or replace it). Reads the leaf and its
        parent only: Enter runs it on the UI thread, and a 10,000-message branch took 134 ms
        to read whole."""
        leaf_id = self.chats.get_conversation(conversation_id).active_leaf_id
        if leaf_id is None:
            return None
        leaf = self.chats.get_message(leaf_id)
        if leaf.role == "user":
            return leaf
        if is_empty_reply(leaf) and leaf.parent_id is not None:
            parent = self.chats.get_message(leaf.parent_id)
            if parent.role == "user":
                return parent
        return None

    def coverage_paths(self, conversation_id: int, limit: int = 300) -> tuple[list[int], list[list[ChatMessage]]]:
        """The first ``limit`` messages of the tree and, for each, the engine's messages of the
        path ending there (for the tree panel's "how much is stored" shading). Walks parent
        links in a loop, no recursion."""
        conv = self.chats.get_conversation(conversation_id)
        nodes = self.chats.tree(conversation_id, limit)  # read no further than the first ``limit``
        by_id = {m.id: m for m in nodes}
        # one ChatMessage per message, shared by every path through it: pickled once (the
        # paths of a 300-message branch hold 45,000 entries but only 300 distinct messages)
        system = prompt_messages(self.chats, conv.system_prompt, [])
        own = {m.id: conversation_messages("", [m]) for m in with_attachments(self.chats, nodes)}
        paths = []
        for m in nodes:
            chain, cur = [], m
            while cur is not None:
                chain.append(cur)
                cur = by_id.get(cur.parent_id) if cur.parent_id is not None else None
            paths.append(system + [c for x in reversed(chain) for c in own[x.id]])
        return [m.id for m in nodes], paths

    # -- changing the tree ---------------------------------------------------------------

    def send(self, conversation_id: int | None, text: str, parent_id: int | None = None,
             new_chat: tuple[str, dict] | None = None):
        """Store ``text`` as a user message under ``parent_id`` (default: the active leaf) of
        ``conversation_id`` (None: a new conversation, with ``new_chat``'s system prompt and
        sampling when given). Returns the user Message.

        Raises:
            ValueError: ``new_chat``'s sampling has an unknown key (nothing is written)."""
        if conversation_id is None:
            prompt, sampling = new_chat or ("", None)
            conversation_id = self.chats.create_conversation(system_prompt=prompt, sampling=sampling).id
        if parent_id is None:
            parent_id = self.chats.get_conversation(conversation_id).active_leaf_id
        return self.chats.add_message(conversation_id, parent_id, "user", text)

    def edit(self, message_id: int, text: str):
        """Store ``text`` as a new sibling of the user message ``message_id`` (the original
        stays, one ``‹ ›`` step away). Returns the new user Message.

        Raises:
            ValueError: ``message_id`` is not a user message.
        """
        m = self.chats.get_message(message_id)
        if m.role != "user":
            raise ValueError(f"Message {m.id} is a {m.role} message; only your own messages can be edited.")
        return self.chats.add_message(m.conversation_id, m.parent_id, "user", text)

    def regenerate_target(self, message_id: int) -> int:
        """The user message a regeneration of ``message_id`` answers: an assistant reply's
        parent (the new reply becomes its sibling), or a user message itself (a retry).

        Raises:
            ValueError: ``message_id`` is a system message or has no parent.
        """
        m = self.chats.get_message(message_id)
        if m.role == "assistant" and m.parent_id is not None:
            return m.parent_id
        if m.role == "user":
            return m.id
        raise ValueError(f"Message {m.id} is a {m.role} message; regenerate takes an assistant reply.")

    def retry(self, message_id: int) -> int:
        """``regenerate_target`` for a Retry: when ``message_id`` is an empty reply stopped
        or failed before its first token (and nothing hangs under it), it is deleted first,
        so the new reply takes its place instead of becoming its sibling. Returns the id of
        the user message to answer."""
        target = self.regenerate_target(message_id)
        m = self.chats.get_message(message_id)
        if is_empty_reply(m) and not self.chats.branches.children(m.id, m.conversation_id):
            self.chats.deletion.delete_subtree(m.id)
        return target

    def fork(self, message_id: int):
        """Copy the path to ``message_id`` into a new conversation (its KV is shared through
        the prefix store, as the token ids are the same). Returns the new Conversation."""
        return self.chats.copies.fork(message_id)

    def switch_sibling(self, message_id: int, delta: int) -> bool:
        """Make the sibling ``delta`` steps from ``message_id`` (and its newest leaf) the
        active branch. Returns False when there is no such sibling."""
        sibs = self.chats.branches.siblings(message_id)
        i = next(i for i, s in enumerate(sibs) if s.id == message_id) + delta
        if not 0 <= i < len(sibs):
            return False
        self.select(sibs[i].id)
        return True

    def select(self, message_id: int) -> None:
        """Make the branch through ``message_id``, down to its newest leaf, the active one."""
        leaf = self.chats.branches.deepest_leaf(message_id)
        self.chats.set_active_leaf(leaf.conversation_id, leaf.id)

    def start_reply(self, user_message_id: int, model: str, **kw) -> ReplyRecorder:
        """A recorder for a new reply under ``user_message_id`` labelled ``model``."""
        m = self.chats.get_message(user_message_id)
        return ReplyRecorder(self.chats, m.conversation_id, m.id, model, **kw)

    # -- overflow ------------------------------------------------------------------------

    def overflow(self, user_message_id: int, prompt_tokens: int, n_ctx: int, trained: int = 0) -> Overflow:
        """What to offer when the prompt for ``user_message_id`` (``prompt_tokens``) does not
        fit ``n_ctx``: the suggested context size, with room for the conversation's max_tokens."""
        conv = self.chats.get_conversation(self.chats.get_message(user_message_id).conversation_id)
        max_tokens = int(conv.sampling.get("max_tokens") or DEFAULT_SAMPLING["max_tokens"])
        return Overflow(user_message_id, prompt_tokens, n_ctx,
                        suggested_context_size(prompt_tokens, n_ctx, max_tokens, trained))

    def branch_dropping_oldest(self, user_message_id: int, n_ctx: int,
                               costs: dict[int, int] | None = None) -> int | None:
        """"Continue on a new branch": copy the newest turns of the path to ``user_message_id``
        into a new root branch that fits about ``BRANCH_FILL`` of ``n_ctx``, starting at a user
        message. ``costs`` (message id -> tokens, as the engine counted them) gives each
        message's size; without it, saved ids are counted and other text is estimated. Returns the
        copy of ``user_message_id`` (to be answered), or None when the newest message alone
        does not fit (nothing is written then)."""
        path = [m for m in self.chats.branches.path_to(user_message_id) if m.role != "system"]
        budget = max(64, int(n_ctx * BRANCH_FILL))
        kept: list = []
        used = 0
        for m in reversed(path):
            if costs and m.id in costs:
                cost = costs[m.id]
            else:
                cost = (len(m.token_ids) if m.token_ids is not None else int(len(m.content) * TOKENS_PER_CHAR))
                cost += TEMPLATE_TOKENS
            if kept and used + cost > budget:
                break
            kept.insert(0, m)
            used += cost
        while len(kept) > 1 and kept[0].role != "user":
            kept.pop(0)
        if len(kept) == len(path):
            return None
        return self.chats.copies.branch_from_path([m.id for m in kept])
