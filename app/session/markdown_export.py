"""A conversation as Markdown: ``conversations export``/``show`` in the CLI and "Copy
conversation as Markdown" in the window.

:func:`conversation_markdown` renders the data of the Branchwise JSON
(``storage.importers.branchwise.conversation_json``: the whole tree) or of
:func:`branch_markdown` (the active path and its siblings, read alone).

Every text a person or a model wrote (the system prompt and each message) is fenced,
verbatim, in a code fence longer than any run of backticks inside it, so no message can
close its fence, pose as a turn heading (``## Assistant · message 2``), leave a quote
block or inject HTML (CommonMark 0.31, "Fenced code blocks": a fence closes only on a
line of at least as many backticks). The title, which sits in a heading, is put
on one line with a backslash before only the characters that could start markup there
("Backslash escapes"): ``\\ ` * _ [ ] < ~``, an ``&`` that begins an entity (``&amp;``),
and a ``#`` run that would close the heading; a ``?``, ``.`` or ``(`` stays as typed.
"""

from __future__ import annotations

import re

_BACKTICKS = re.compile("`+")
_INLINE_MARKUP = re.compile(r"""([\\`*_\[\]<~])|(&)(?=#?[A-Za-z0-9]+;)|(?:(?<=\s)|^)(#)(?=#*\s*$)""")


def fenced(text: str, info: str = "") -> str:
    """``text`` as a fenced code block that nothing in it can close (CommonMark)."""
    longest = max((len(m.group(0)) for m in _BACKTICKS.finditer(text)), default=0)
    fence = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{fence}{info}\n{body}{fence}"


def inline_literal(text: str) -> str:
    """``text`` as literal inline Markdown on one line: line breaks become spaces, and the
    characters that could start markup there are backslash-escaped (no code, emphasis,
    link, HTML, entity or closing ``#``; see the module docstring); other punctuation stays."""
    return _INLINE_MARKUP.sub(lambda m: "\\" + m.group(0), " ".join(text.split()))


def quoted_lines(text: str) -> list[str]:
    """``text`` as the lines of a Markdown block quote (``> `` before each line)."""
    return [f"> {line}" if line else ">" for line in text.split("\n")]


def _attached_line(a: dict) -> str:
    """``*Attached: report.pdf (PDF, 3 pages)*``; its text is in the JSON export."""
    pages = max((p[1] or 0 for p in a["passages"]), default=0) if a["paged"] else 0
    what = f"{a['kind']}, {pages} page{'s' if pages != 1 else ''}" if a["paged"] else a["kind"]
    if a.get("sent") is not None:
        what += "; passages " + ", ".join(f"#{n}" for n in a["sent"]) + " sent"
    return f"*Attached: {inline_literal(a['name'])} ({inline_literal(what)})*"


def conversation_markdown(data: dict, active_only: bool = True, left_out_note: bool = True) -> str:
    """Markdown of the active path of ``conversation_json`` output (every message with
    ``active_only=False``, in the order written, each heading naming the message it answers
    or follows). Message texts are fenced verbatim (see the module docstring);
    a note says how many messages on other branches are left out (``left_out_note`` False:
    no note, for ``data`` that holds only the path and its siblings)."""
    by_id = {m["id"]: m for m in data["messages"]}
    ids = data["active_path"] if active_only else [m["id"] for m in data["messages"]]
    out = [f"# {inline_literal(data['title']) or 'Untitled'}", ""]
    left_out = len(data["messages"]) - len(ids)
    if left_out and left_out_note:
        others = "1 message on other branches is" if left_out == 1 else f"{left_out} messages on other branches are"
        out += [f"*The active branch: {len(ids)} of {len(data['messages'])} messages. {others} not "
                "shown; the JSON export holds every branch.*", ""]
    if data["system_prompt"]:
        out += ["**System prompt**", "", fenced(data["system_prompt"], "text"), ""]
    children: dict = {}
    for m in data["messages"]:
        children.setdefault(m["parent_id"], []).append(m)
    for mid in ids:
        m = by_id[mid]
        siblings = children[m["parent_id"]]
        branch = f" (branch {siblings.index(m) + 1}/{len(siblings)})" if len(siblings) > 1 else ""
        label = "User" if m["role"] == "user" else "Assistant"
        stopped = " *(stopped)*" if m["status"] == "stopped" else ""
        # every branch, in the order written: say which message each one follows
        after = f" · in reply to message {m['parent_id']}" if not active_only and m["parent_id"] is not None else ""
        out += [f"## {label}{branch} · message {m['id']}{after}{stopped}", ""]
        out += [_attached_line(a) for a in m.get("attachments") or []] + ([""] if m.get("attachments") else [])
        if m.get("reasoning"):  # a reasoning model's thinking, quoted, before its answer
            out += ["> **Reasoning**", ">", *quoted_lines(fenced(m["reasoning"], "text")), ""]
        out += [fenced(m["content"], "markdown" if m["role"] == "assistant" else "text"), ""]
    return "\n".join(out)


def branch_markdown(store, conversation_id: int) -> str:
    """The active branch of ``conversation_id`` as the Markdown export: every message
    fenced verbatim. Reads only the active path and its siblings, not the whole tree.

    Raises NotFoundError for an unknown id."""
    conv = store.get_conversation(conversation_id)
    path = store.active_path(conversation_id)
    siblings = {m.id: store.branches.siblings(m.id) for m in path}
    messages = [s for m in path for s in siblings[m.id]]  # the branch counts "(branch 2/3)"
    data = {
        "title": conv.title, "system_prompt": conv.system_prompt, "active_path": [m.id for m in path],
        "messages": [{"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
                      "status": m.status} for m in messages],
    }
    return conversation_markdown(data, left_out_note=False)
