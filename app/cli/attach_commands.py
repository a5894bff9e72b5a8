"""``chat --attach FILE``: attach documents to the message (README, "Chat with your documents").

Each file is read and extracted first, in a child process with limits
(``engine.documents.sandbox``), before the model loads or anything is stored, so a file that
cannot be attached leaves no trace. Then the message is rendered with the files in their
fixed form (``engine.documents.render``) and counted; a message that does not fit the
context is refused with the counts and what would work: a larger ``--ctx-size`` (the
largest this model and this machine's free memory allow, stated), or ``--search-document``,
which sends only the passages that best match the question (SQLite FTS5, BM25 over the
trigram index) and says which.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SEARCH_SHARE_CHARS_PER_TOKEN = 3.0
"""Characters per token assumed when filling the passage budget (English is 3.5-4.5; the
chosen passages are then counted exactly and the last ones dropped until they fit)."""


def add_attach_arguments(chat: argparse.ArgumentParser) -> None:
    """``--attach FILE`` (repeatable), ``--attach-password PW``, ``--search-document``."""
    chat.add_argument("--attach", metavar="FILE", action="append", default=[],
                      help="attach a file to the message (PDF, DOCX, HTML, Markdown, CSV, JSON, text, "
                           "source code); repeat for more files")
    chat.add_argument("--attach-password", metavar="PW", help="the password of an encrypted PDF attached")
    chat.add_argument("--search-document", action="store_true",
                      help="when the attached files do not fit the context, send only the passages that "
                           "best match the question (each with file and page)")


@dataclass
class AttachPlan:
    """The message to send (``text``: the question with the blocks rendered in, for
    counting), the documents, and for each the passage numbers sent (None: the whole text)."""

    docs: list = field(default_factory=list)
    sent: list = field(default_factory=list)
    text: str = ""
    info: list = field(default_factory=list)

    def footer(self) -> str:
        """One line for stderr naming what each file put in the prompt ('' without files)."""
        return "; ".join(self._describe(i) for i in self.info)

    @staticmethod
    def _describe(i: dict) -> str:
        if i["passages"] is None:
            return f"{i['name']}: whole text, {i['tokens']:,} tokens"
        used = ", ".join(f"#{p['number']}" + (f" (page {p['page']})" if p["page"] else "") for p in i["passages"])
        return f"{i['name']}: searched, passages {used or 'none matched'}, {i['tokens']:,} tokens"


def read_attachments(args) -> list:
    """Extract every ``--attach`` file (``Document``s, in order), each file once: a path given
    again (``a.txt``, ``./a.txt``) is not read again, and a file with the same bytes as one
    before it is dropped; when any is, one line on stderr says so. Raises DocumentError (one
    sentence; an encrypted PDF's names --attach-password)."""
    import os
    import sys

    from engine.documents import DocumentError, attach_file

    docs, given, by_sha, repeats = [], {}, {}, {}
    for path in args.attach:
        where = os.path.realpath(path)
        given[where] = given.get(where, 0) + 1
        if given[where] > 1:
            times = "twice" if given[where] == 2 else f"{given[where]} times"
            repeats[where] = f"{os.path.basename(path)} was given {times}"
            continue
        try:
            doc = attach_file(path, password=args.attach_password)
        except DocumentError as exc:
            if exc.needs_password and args.attach_password is None:
                raise DocumentError(f"{exc} (pass --attach-password)".replace(". (", " (") + ".",
                                    needs_password=True) from None
            raise
        if doc.sha256 in by_sha:
            repeats[where] = f"{doc.name} has the same contents as {by_sha[doc.sha256].name}"
            continue
        by_sha[doc.sha256] = doc
        docs.append(doc)
    if repeats:
        print(f"branchwise: {' and '.join(repeats.values())}; each file is attached once.", file=sys.stderr)
    return docs


def plan(args, engine, chats, system: str, path: list, question: str, docs: list) -> AttachPlan:
    """What to send: the whole documents when the message fits the context with room for the
    reply, else (``--search-document``) the best passages.

    Raises:
        ValueError: it does not fit: the counts and what would work, in one message.
    """
    from app.session.overflow import largest_context, reply_room
    from engine.chat_template import ChatMessage
    from engine.documents.attach import attached_text, prompt_messages
    from engine.documents.render import render_message

    n_ctx = engine.llama.n_ctx()
    room = reply_room(n_ctx, args.max_tokens or 1024)
    before = prompt_messages(chats, system, path)
    base = len(engine.prompt_tokens(before + [ChatMessage("user", question)]))

    def tokens(texts) -> int:
        return len(engine.prompt_tokens(before + [ChatMessage("user", render_message(question, texts))]))

    whole = [attached_text(d) for d in docs]
    need = tokens(whole)
    result = AttachPlan(docs=list(docs))
    if need + room <= n_ctx:
        result.sent = [None] * len(docs)
        result.text = render_message(question, whole)
        result.info = [_info(d, None, tokens([t]) - base) for d, t in zip(docs, whole, strict=True)]
        return result
    if not args.search_document:
        from engine.machine import memory_bytes

        facts = engine.model.facts
        largest = largest_context(int(facts.context_length or 0), int(facts.kv_bytes_per_token or 0), n_ctx,
                                  memory_bytes()[1])
        wanted = (need + room + 1023) // 1024 * 1024
        bigger = (f"pass --ctx-size {wanted} (this model and this machine's free memory allow up to "
                  f"{largest:,} tokens), or " if largest and wanted <= largest else
                  f"a context large enough ({wanted:,}) is more than this model and this machine's memory "
                  f"allow ({largest:,} tokens); ")
        raise ValueError(f"With the attached files this message is {need:,} tokens, and the context window is "
                         f"{n_ctx:,} with {room:,} kept for the reply; {bigger}pass --search-document to send "
                         "only the passages that best match your question.")
    return _searched(args, engine, chats, question, docs, base, n_ctx - room, tokens, result)


def _searched(args, engine, chats, question, docs, base, limit, tokens, result: AttachPlan) -> AttachPlan:
    from engine.documents.attach import attached_text, ranked_passages, store
    from engine.documents.render import render_message

    budget_chars = int(max(0, limit - base) * SEARCH_SHARE_CHARS_PER_TOKEN / max(1, len(docs)))
    chosen = []
    for d in docs:
        store(chats, d)
        picked, used = [], 0
        for p in ranked_passages(chats, d, question):
            if used + len(p.text) <= budget_chars:
                picked.append(p)
                used += len(p.text)
        chosen.append(picked)
    while True:  # drop the lowest-ranked passage until it fits
        texts = [attached_text(d, sorted(c, key=lambda p: p.number)) for d, c in zip(docs, chosen, strict=True)]
        if tokens(texts) <= limit or not any(chosen):
            break
        longest = max(range(len(chosen)), key=lambda i: len(chosen[i]))
        chosen[longest].pop()
    if tokens(texts) > limit:
        raise ValueError("Even without the attached files' text this message does not fit the context window "
                         f"({limit:,} tokens before the reply); pass a larger --ctx-size.")
    result.sent = [[p.number for p in t.passages] for t in texts]
    result.text = render_message(question, texts)
    result.info = [_info(d, t.passages, tokens([t]) - base) for d, t in zip(docs, texts, strict=True)]
    return result


def _info(doc, passages, tokens: int) -> dict:
    from engine.documents.attach import figures

    return figures(doc, tokens, passages)


def store_and_link(chats, message_id: int, p: AttachPlan) -> None:
    """Store the documents once and attach them to the user message ``message_id``."""
    from engine.documents.attach import link_message, store

    for d in p.docs:
        store(chats, d)
    link_message(chats, message_id, p.docs, p.sent, p.info)  # the figures too: the window's chips show them
