"""Importing chats (storage/importers): exact trees per format, idempotence, atomicity, round trip.

The samples in tests/data/import/ were written by hand from the formats' public
descriptions (see each reader's docstring). Each has two branches at different
depths, a non-text part, CJK/emoji/RTL text and a hidden system message.
"""

from __future__ import annotations

import copy
import io
import json
import sqlite3
from contextlib import closing
import threading
import zipfile
from pathlib import Path

import pytest

from storage.chats import ChatStore
from storage.importers import FileStatus, ImportFormat, detect, import_files

DATA = Path(__file__).parent / "data" / "import"
CHATGPT = DATA / "chatgpt_conversations.json"
CLAUDE = DATA / "claude_conversations.json"
OPENWEBUI = DATA / "openwebui_chat-export.json"
LMSTUDIO = DATA / "lmstudio_1719000000000.conversation.json"
SILLYTAVERN = DATA / "sillytavern_Seraphina.jsonl"
SAMPLES = [CHATGPT, CLAUDE, OPENWEBUI, LMSTUDIO, SILLYTAVERN]

HIDDEN = "*\\[Hidden system message (the source app did not show it)\\]*"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "chats.sqlite3"


def snapshot(db: Path) -> list[tuple]:
    """Every conversation as (title, system prompt, pinned, active leaf index, messages), where
    messages are (index, parent index, role, model, content) in id order (indices from 0)."""
    out = []
    with ChatStore(db) as chats:
        for c in sorted(chats.list_conversations(), key=lambda c: c.id):
            tree = chats.tree(c.id)
            index = {m.id: i for i, m in enumerate(tree)}
            rows = [(i, index.get(m.parent_id), m.role, m.model, m.content) for i, m in enumerate(tree)]
            out.append((c.title, c.system_prompt, c.pinned, index.get(c.active_leaf_id), rows))
    return out


def reasonings(db: Path) -> list[dict[int, str]]:
    """Per conversation (as in ``snapshot``), message index -> its stored reasoning (messages
    with none left out)."""
    out = []
    with ChatStore(db) as chats:
        for c in sorted(chats.list_conversations(), key=lambda c: c.id):
            out.append({i: m.reasoning for i, m in enumerate(chats.tree(c.id)) if m.reasoning is not None})
    return out


def dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


# -- exact trees ----------------------------------------------------------------------------


def test_chatgpt_keeps_every_branch_and_the_current_node(db: Path) -> None:
    summary = import_files([CHATGPT], db)
    f = summary.files[0]
    assert (f.status, f.format, f.conversations_added, f.messages, f.branches) == (
        FileStatus.IMPORTED, "chatgpt", 1, 6, 3)
    [(title, system, pinned, leaf, rows)] = snapshot(db)
    assert title == "Trip to 東京 🗾"
    assert system == "I live in Haifa.\n\nAnswer briefly."  # custom instructions (a hidden message)
    assert (pinned, leaf) == (False, 5)
    assert rows == [
        (0, None, "user", None, "Plan a trip to 東京 🗾"),
        (1, 0, "assistant", "gpt-4o", "Here is plan A."),
        (2, 0, "assistant", "gpt-4o-mini", "Plan B, שלום ومرحبا"),
        (3, 2, "user", None, "*\\[Image: 640×480 (not imported)\\]*\n\nWhat is in this photo?\n\n"
                             "*\\[File: cat \\[1\\].png (not imported)\\]*"),
        (4, 3, "assistant", "gpt-4o", "It is a cat."),
        # thoughts, tool call, code-interpreter output and answer: one ChatGPT turn, one message
        (5, 3, "assistant", "o3", "*\\[Tool call: python (the call is kept, it was not run here)\\]*\n\n"
                                  "```python\nprint(6 * 7)\n```\n\n*\\[Code interpreter output: python\\]*\n\n"
                                  "```\n42\n```\n\nA cat with 42 whiskers 🐱."),
    ]
    assert reasonings(db) == [{5: "**Counting**\n\nCount the whiskers."}]  # beside the answer
    with ChatStore(db) as chats:
        c = chats.list_conversations()[0]
        assert c.created_at == 1717000000.5 and c.updated_at == 1717000900.25
        assert [m.created_at for m in chats.tree(c.id)] == [
            1717000001.0, 1717000002.0, 1717000003.0, 1717000004.0, 1717000005.0, 1717000006.0]


def test_claude_links_by_parent_uuid(db: Path) -> None:
    import_files([CLAUDE], db)
    [(title, system, pinned, leaf, rows)] = snapshot(db)
    assert (title, system, pinned, leaf) == ("Haiku about 雪 ❄️", "Be poetic.", False, 4)
    assert rows == [
        (0, None, "user", None, "Write a haiku about 雪\n\n*\\[Attached file: notes.txt (its text follows)\\]*"
                                "\n\n```\nsnow, quiet\n```"),
        (1, 0, "assistant", None, "Snow falls on the roof ❄️"),
        (2, 1, "user", None, "Now in Arabic\n\n*\\[File: photo.jpg (not imported)\\]*"),
        (3, 2, "assistant", None, "ثلج يتساقط"),
        (4, 0, "assistant", None, "*\\[Tool call: web\\_search (the call is kept, it was not run here)\\]*\n\n"
                                  "```json\n{\n  \"query\": \"haiku\"\n}\n```\n\n"
                                  "*\\[Tool result: web\\_search (not imported)\\]*\n\nWhite hush on the pines"),
    ]
    assert reasonings(db) == [{1: "Five, seven, five."}]


def test_open_webui_history_tree(db: Path) -> None:
    import_files([OPENWEBUI], db)
    [(title, system, pinned, leaf, rows)] = snapshot(db)
    assert (title, system, pinned, leaf) == ("Recipe 🍜 ラーメン", "You are a chef.", True, 4)
    assert rows == [
        (0, None, "system", None, f"{HIDDEN}\n\nHidden note: the user is vegetarian."),
        (1, 0, "user", None, "How do I make ラーメン?\n\n*\\[Image: bowl.png (not imported)\\]*"),
        (2, 1, "assistant", "llama3.1:8b", "Start with the broth."),
        (3, 2, "user", None, "And in Hebrew? בבקשה"),
        (4, 3, "assistant", "qwen2.5:7b", "מרק ראמן"),
        (5, 3, "assistant", "llama3.1:8b",
         "*\\[Tool call: translate (the call is kept in the original app, not here)\\]*\n\nראמן"),
        (6, 1, "assistant", "llama3.1:8b", "Buy instant noodles."),
    ]
    assert reasonings(db) == [{2: "Broth first."}]


def test_lm_studio_versions_become_siblings(db: Path) -> None:
    import_files([LMSTUDIO], db)
    [(title, system, pinned, leaf, rows)] = snapshot(db)
    assert (title, system, pinned, leaf) == ("Math in 中文 ➗", "You are a tutor.", False, 6)
    model = "qwen2.5-7b-instruct"
    assert rows == [
        (0, None, "system", None, f"{HIDDEN}\n\nHidden: grade 5 level."),
        (1, 0, "user", None, "What is 2+2?"),
        (2, 0, "user", None, "二加二是多少？\n\n*\\[Image: sum.png (not imported)\\]*"),
        (3, 2, "assistant", model, "是四 ✅"),
        (4, 3, "user", None, "And in Arabic?"),
        (5, 3, "user", None, "Say it in Arabic"),
        (6, 5, "assistant", model, "أربعة"),
        (7, 5, "assistant", model, "٤"),
    ]
    assert reasonings(db) == [{3: "Simple addition.", 6: "Arabic four"}]


def test_sillytavern_swipes_become_siblings(db: Path) -> None:
    import_files([SILLYTAVERN], db)
    [(title, system, pinned, leaf, rows)] = snapshot(db)
    assert (title, system, pinned, leaf) == ("Seraphina · 2024-05-26T22:32:10.000Z", "", False, 6)
    assert rows == [
        (0, None, "assistant", None, "Welcome, traveller 🌲"),
        (1, 0, "user", None, "Where am I? 我在哪里？\n\n*\\[Image: map.png (not imported)\\]*"),
        (2, 1, "assistant", None, "In the forest."),
        (3, 1, "assistant", "mistral-small", "In the glade. مرحبا"),
        (4, 3, "system", None, f"{HIDDEN}\n\n**System:**\n\nThe user hid this note."),
        (5, 4, "user", None, "Thanks!"),
        (6, 5, "assistant", "mistral-small", "Rest now."),
        (7, 5, "assistant", None, "Sleep well."),
    ]
    assert reasonings(db) == [{3: "They look lost."}]


@pytest.mark.parametrize("path, fmt", [
    (CHATGPT, ImportFormat.CHATGPT), (CLAUDE, ImportFormat.CLAUDE), (OPENWEBUI, ImportFormat.OPENWEBUI),
    (LMSTUDIO, ImportFormat.LMSTUDIO), (SILLYTAVERN, ImportFormat.SILLYTAVERN)])
def test_detect_recognises_each_format(path: Path, fmt: ImportFormat) -> None:
    assert detect(path) == fmt


def test_forced_format_reads_the_same(db: Path, tmp_path: Path) -> None:
    import_files([CLAUDE], db, format="claude")
    other = tmp_path / "other.sqlite3"
    import_files([CLAUDE], other)
    assert snapshot(db) == snapshot(other)


# -- idempotence ----------------------------------------------------------------------------


def test_reimport_adds_nothing(db: Path) -> None:
    import_files(SAMPLES, db)
    before = dump(db)
    again = import_files(SAMPLES, db)
    assert [f.status for f in again.files] == [FileStatus.UNCHANGED] * len(SAMPLES)
    assert [f.conversations_unchanged for f in again.files] == [1] * len(SAMPLES)
    assert again.messages == 0
    assert dump(db) == before


def test_reimport_of_a_grown_export_adds_only_the_new_branch(db: Path, tmp_path: Path) -> None:
    import_files([CHATGPT], db)
    data = json.loads(CHATGPT.read_text())
    mapping = data[0]["mapping"]
    mapping["u1"]["children"].append("a1c")
    mapping["a1c"] = {"id": "a1c", "parent": "u1", "children": [], "message": {
        "id": "a1c", "author": {"role": "assistant"}, "create_time": 1717000010.0,
        "content": {"content_type": "text", "parts": ["Plan C."]}, "metadata": {}, "recipient": "all"}}
    data[0]["current_node"] = "a1c"
    grown = tmp_path / "grown.json"
    grown.write_text(json.dumps(data))
    summary = import_files([grown], db)
    f = summary.files[0]
    assert (f.conversations_added, f.conversations_updated, f.messages) == (0, 1, 1)
    [(_, _, _, leaf, rows)] = snapshot(db)
    assert rows[-1] == (6, 0, "assistant", "gpt-4o", "Plan C.")  # the default_model_slug
    assert leaf == 6


# -- atomicity ------------------------------------------------------------------------------


def _chatgpt_variant(tmp_path: Path, name: str, change) -> Path:
    data = json.loads(CHATGPT.read_text())
    second = copy.deepcopy(data[0])
    second["conversation_id"] = "second"
    second["title"] = "Second"
    data.append(second)
    change(second)
    path = tmp_path / name
    path.write_text(json.dumps(data, ensure_ascii=False))
    return path


def _missing_parent(c):
    c["mapping"]["a2"]["parent"] = "ghost"


def _cycle(c):
    c["mapping"]["u1"]["parent"] = "a1b"
    c["mapping"]["a1b"]["parent"] = "u1"


def _duplicate(c):
    c["conversation_id"] = "c0ffee00-0000-4000-8000-000000000001"


def _bad_role(c):
    c["mapping"]["a2"] = "not a node"


@pytest.mark.parametrize("change, words", [
    (_missing_parent, ["conversation 'Second' (id second)", "message 'a2'", "'ghost'"]),
    (_cycle, ["conversation 'Second'", "cycle", "'u1'", "'a1b'"]),
    (_duplicate, ["appears twice"]),
    (_bad_role, ["conversation 'Second'", "node 'a2'"]),
])
def test_a_broken_conversation_imports_nothing_from_the_file(db: Path, tmp_path: Path, change, words) -> None:
    import_files([CLAUDE], db)  # something already there
    before = dump(db)
    bad = _chatgpt_variant(tmp_path, "bad.json", change)
    summary = import_files([bad, OPENWEBUI], db)
    failed, good = summary.files
    assert failed.status == FileStatus.FAILED
    assert (failed.conversations_added, failed.messages) == (0, 0)
    assert str(bad) in failed.error
    for w in words:
        assert w in failed.error, failed.error
    assert good.status == FileStatus.IMPORTED  # the next file still imports
    import_files([], db)
    after = ChatStore(db)
    try:
        titles = sorted(c.title for c in after.list_conversations())
    finally:
        after.close()
    assert titles == sorted(["Haiku about 雪 ❄️", "Recipe 🍜 ラーメン"])
    # the bad file alone leaves the database exactly as it was
    db2 = tmp_path / "again.sqlite3"
    import_files([CLAUDE], db2)
    before2 = dump(db2)
    import_files([bad], db2)
    assert dump(db2) == before2
    assert before == before2


@pytest.mark.parametrize("text, words", [
    (b'[{"title": "x", "mapping": {', ["not valid JSON"]),
    (b'{"hello": "world"}', ["shape is not one Branchwise knows", "hello", "--format"]),
    (b"\xff\xfe\x00garbage", ["not"]),
    (b"", ["it is empty"]),
    (b"[]", ["no conversations"]),
])
def test_bad_files_change_nothing_and_say_why(db: Path, tmp_path: Path, text: bytes, words) -> None:
    import_files([CHATGPT], db)
    before = dump(db)
    bad = tmp_path / "bad.json"
    bad.write_bytes(text)
    summary = import_files([bad], db)
    [f] = summary.files
    assert f.status == FileStatus.FAILED
    for w in words:
        assert w in f.error, f.error
    assert dump(db) == before


def test_a_missing_file_is_reported(db: Path, tmp_path: Path) -> None:
    summary = import_files([tmp_path / "nope.json"], db)
    assert summary.files[0].status == FileStatus.FAILED
    assert summary.files[0].error == f"{tmp_path / 'nope.json'}: there is no such file"  # the path once


def test_truncated_jsonl_line_names_the_line(db: Path, tmp_path: Path) -> None:
    lines = SILLYTAVERN.read_text(encoding="utf-8").splitlines()
    lines[3] = lines[3][:40]
    bad = tmp_path / "chat.jsonl"
    bad.write_text("\n".join(lines), encoding="utf-8")
    [f] = import_files([bad], db).files
    assert f.status == FileStatus.FAILED and "line 4 is not valid JSON" in f.error
    assert snapshot(db) == []


# -- zips, dry run, cancel, progress --------------------------------------------------------


def test_zip_as_the_service_ships_it(db: Path, tmp_path: Path) -> None:
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(CHATGPT, "conversations.json")
        z.writestr("user.json", json.dumps({"id": "user-1", "email": "a@b.c"}))
        z.writestr("chat.html", "<html></html>")
        z.writestr("file-abc.png", b"\x89PNG")
        z.writestr("odd.json", json.dumps({"something": "else"}))
    summary = import_files([archive], db)
    [f] = summary.files
    assert f.status == FileStatus.IMPORTED and f.conversations_added == 1 and f.messages == 6
    assert [s.where for s in f.skipped] == [f"{archive}/odd.json"]
    other = tmp_path / "plain.sqlite3"
    import_files([CHATGPT], other)
    assert snapshot(db) == snapshot(other)


def test_dry_run_counts_and_changes_nothing(db: Path) -> None:
    import_files([CLAUDE], db)
    before = dump(db)
    summary = import_files(SAMPLES, db, dry_run=True)
    assert summary.dry_run
    assert [f.conversations_added for f in summary.files] == [1, 0, 1, 1, 1]
    assert [f.conversations_unchanged for f in summary.files] == [0, 1, 0, 0, 0]
    assert summary.messages == 6 + 7 + 8 + 8
    assert dump(db) == before


def test_cancel_rolls_back_the_file_being_read(db: Path, tmp_path: Path) -> None:
    big = tmp_path / "many.json"
    big.write_text(json.dumps(_synthetic_chatgpt(5, 4)))
    flag = threading.Event()
    seen = []

    def progress(p):
        seen.append(p.conversations)
        if p.conversations == 3:
            flag.set()

    summary = import_files([big, CLAUDE], db, progress=progress, cancel=flag)
    assert summary.cancelled
    assert [f.status for f in summary.files] == [FileStatus.CANCELLED]  # CLAUDE was not started
    assert summary.files[0].conversations_added == 0
    assert seen == [0, 1, 2, 3]
    assert snapshot(db) == []


def test_progress_reports_bytes_of_the_file(db: Path, tmp_path: Path) -> None:
    big = tmp_path / "many.json"
    big.write_text(json.dumps(_synthetic_chatgpt(40, 10)))
    events = []
    import_files([big], db, progress=events.append)
    assert events[0].bytes_done == 0 and events[0].bytes_total == big.stat().st_size
    assert [e.conversations for e in events] == list(range(41))
    done = [e.bytes_done for e in events]
    assert done == sorted(done) and done[-1] <= big.stat().st_size and done[-1] > 0
    assert events[-1].messages == 400


# -- search, hostile names, big trees -------------------------------------------------------


def test_search_finds_imported_text_at_once(db: Path) -> None:
    import_files(SAMPLES, db)
    with ChatStore(db) as chats:
        hits = chats.search("whiskers")
        assert [c.title for c, _ in hits] == ["Trip to 東京 🗾"]
        assert [c.title for c, _ in chats.search("Seraphina")] == ["Seraphina · 2024-05-26T22:32:10.000Z"]


def test_names_from_a_file_cannot_become_links(db: Path, tmp_path: Path) -> None:
    data = json.loads(CHATGPT.read_text())
    data[0]["mapping"]["u2"]["message"]["metadata"]["attachments"] = [
        {"name": "[click](javascript:alert(1))\n# heading <b>", "mimeType": "x"}]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    import_files([path], db)
    [(_, _, _, _, rows)] = snapshot(db)
    assert rows[3][4].endswith(
        "*\\[File: \\[click\\]\\(javascript:alert\\(1\\)\\) \\# heading \\<b\\> (not imported)\\]*")


def _synthetic_chatgpt(conversations: int, turns: int, branch_every: int = 0) -> list[dict]:
    """ChatGPT-shaped conversations: a root, a hidden system node, then ``turns`` messages
    in a chain (plus a regenerated sibling every ``branch_every`` messages)."""
    out = []
    for c in range(conversations):
        mapping = {"r": {"id": "r", "message": None, "parent": None, "children": ["s"]},
                   "s": {"id": "s", "parent": "r", "children": [], "message": {
                       "id": "s", "author": {"role": "system"}, "content": {"content_type": "text", "parts": [""]},
                       "metadata": {"is_visually_hidden_from_conversation": True}}}}
        parent = "s"
        for t in range(turns):
            mid = f"m{t}"
            role = "user" if t % 2 == 0 else "assistant"
            mapping[mid] = {"id": mid, "parent": parent, "children": [], "message": {
                "id": mid, "author": {"role": role}, "create_time": 1.7e9 + t,
                "content": {"content_type": "text", "parts": [f"message {t} of conversation {c} ✓"]},
                "metadata": {}, "recipient": "all"}}
            mapping[parent]["children"].append(mid)
            if branch_every and role == "assistant" and t % branch_every == 1:
                alt = f"alt{t}"
                mapping[alt] = {"id": alt, "parent": parent, "children": [], "message": {
                    "id": alt, "author": {"role": "assistant"}, "create_time": 1.7e9 + t,
                    "content": {"content_type": "text", "parts": [f"alternative {t}"]}, "metadata": {}}}
                mapping[parent]["children"].append(alt)
            parent = mid
        out.append({"title": f"Conversation {c}", "create_time": 1.7e9, "update_time": 1.7e9 + turns,
                    "conversation_id": f"conv-{c}", "current_node": parent, "mapping": mapping})
    return out


def test_a_100000_message_chain_imports_without_recursion(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps(_synthetic_chatgpt(1, 100_000)))
    [f] = import_files([path], db).files
    assert (f.status, f.messages, f.branches) == (FileStatus.IMPORTED, 100_000, 1)
    with ChatStore(db) as chats:
        c = chats.list_conversations()[0]
        path_ = chats.active_path(c.id)
        assert len(path_) == 100_000
        assert path_[-1].content == "message 99999 of conversation 0 ✓"


def test_branches_count_leaves(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "branchy.json"
    path.write_text(json.dumps(_synthetic_chatgpt(2, 10, branch_every=4)))
    [f] = import_files([path], db).files
    # assistant turns 1, 5, 9 get an alternative: 3 extra leaves per conversation
    assert (f.messages, f.branches) == (2 * 13, 2 * 4)


# -- Branchwise round trip ------------------------------------------------------------------


def _build_branchwise(db: Path) -> None:
    with ChatStore(db) as chats:
        c = chats.create_conversation(system_prompt="Reply in haiku 🌸", sampling={"temperature": 0.2})
        u1 = chats.add_message(c.id, None, "user", "First question, 日本語 עברית")
        a1 = chats.add_message(c.id, u1.id, "assistant", "Answer one", token_ids=[1, 2, 3],
                               stats={"prompt_tokens": 12, "ttft_ms": 33.25}, model="SmolLM2")
        chats.add_message(c.id, u1.id, "assistant", "Answer two", token_ids=[4, 5], status="stopped")
        u2 = chats.add_message(c.id, a1.id, "user", "Follow-up 🙂")
        chats.add_message(c.id, u2.id, "system", "a note kept in the tree")
        a3 = chats.add_message(c.id, u2.id, "assistant", "Deep answer", token_ids=[7])
        chats.add_message(c.id, u1.id, "user", "edited sibling at depth 1")  # a branch under u1
        chats.set_active_leaf(c.id, a3.id)
        chats.set_pinned(c.id, True)
        chats.rename(c.id, "Round trip")
        d = chats.create_conversation()
        chats.add_message(d.id, None, "user", "Second conversation")


def _export_all(db: Path) -> str:
    from storage.importers.branchwise import write_export_all

    out = io.StringIO()
    with ChatStore(db) as chats:
        write_export_all(chats, out)
    return out.getvalue()


def _normalise_ids(text: str) -> str:
    data = json.loads(text)
    conv_ids: dict[int, int] = {}
    msg_ids: dict[int, int] = {}
    for c in data["conversations"]:
        c["id"] = conv_ids.setdefault(c["id"], len(conv_ids))
        for m in c["messages"]:
            m["id"] = msg_ids.setdefault(m["id"], len(msg_ids))
            m["parent_id"] = None if m["parent_id"] is None else msg_ids[m["parent_id"]]
        c["active_leaf_id"] = msg_ids[c["active_leaf_id"]] if c["active_leaf_id"] is not None else None
        c["active_path"] = [msg_ids[i] for i in c["active_path"]]
    return json.dumps(data, ensure_ascii=False, indent=2)


def test_export_import_export_is_identical_apart_from_ids(tmp_path: Path) -> None:
    first_db = tmp_path / "first.sqlite3"
    _build_branchwise(first_db)
    with ChatStore(first_db) as chats:  # ids in the restored database will differ
        chats.create_conversation(title="made and deleted")
        chats.delete_conversation(chats.list_conversations()[0].id)
    exported = _export_all(first_db)
    backup = tmp_path / "backup.json"
    backup.write_text(exported, encoding="utf-8")
    second_db = tmp_path / "second.sqlite3"
    with ChatStore(second_db) as chats:
        chats.create_conversation(title="already here")  # shifts every id in the restore
    summary = import_files([backup], second_db)
    assert summary.files[0].format == "branchwise" and summary.conversations == 2
    with ChatStore(second_db) as chats:
        chats.delete_conversation(next(c.id for c in chats.list_conversations() if c.title == "already here"))
    again = _export_all(second_db)
    assert again != exported  # the ids did change…
    assert _normalise_ids(again) == _normalise_ids(exported)  # …and nothing else


def test_a_single_conversation_export_round_trips(tmp_path: Path) -> None:
    from storage.importers.branchwise import conversation_json

    first_db = tmp_path / "first.sqlite3"
    _build_branchwise(first_db)
    with ChatStore(first_db) as chats:
        cid = next(c.id for c in chats.list_conversations() if c.title == "Round trip")
        original = conversation_json(chats, cid)
    path = tmp_path / "one.json"
    path.write_text(json.dumps(original, ensure_ascii=False, indent=2), encoding="utf-8")
    second_db = tmp_path / "second.sqlite3"
    assert detect(path) == ImportFormat.BRANCHWISE
    import_files([path], second_db)
    with ChatStore(second_db) as chats:
        [c] = chats.list_conversations()
        restored = conversation_json(chats, c.id)
    wrap = '{"conversations": [%s]}'
    assert _normalise_ids(wrap % json.dumps(restored)) == _normalise_ids(wrap % json.dumps(original))


def test_restoring_a_backup_into_its_own_database_adds_nothing(tmp_path: Path) -> None:
    db = tmp_path / "chats.sqlite3"
    _build_branchwise(db)
    backup = tmp_path / "backup.json"
    backup.write_text(_export_all(db), encoding="utf-8")
    before = dump(db)
    summary = import_files([backup], db)
    assert summary.files[0].status == FileStatus.UNCHANGED
    assert summary.files[0].conversations_unchanged == 2
    assert dump(db) == before
    fresh = tmp_path / "fresh.sqlite3"
    import_files([backup], fresh)
    again = import_files([backup], fresh)  # a second restore into the new database: still no duplicates
    assert again.files[0].conversations_unchanged == 2 and again.messages == 0


def test_a_newer_export_version_is_refused(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "future.json"
    path.write_text('{"branchwise_export": 99, "conversations": []}')
    [f] = import_files([path], db).files
    assert f.status == FileStatus.FAILED and "version 99" in f.error and "Update Branchwise" in f.error


def test_memory_stays_flat_as_the_export_grows(tmp_path: Path) -> None:
    """Ten times the messages, about the same peak: the import streams conversation by conversation."""
    import tracemalloc

    from app.bench.imports import write_synthetic_chatgpt

    peaks = []
    for conversations in (10, 100):
        source = tmp_path / f"c{conversations}.json"
        with open(source, "w", encoding="utf-8") as out:
            write_synthetic_chatgpt(out, conversations, 100)
        tracemalloc.start()
        summary = import_files([source], tmp_path / f"c{conversations}.sqlite3")
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert summary.messages == conversations * 110
    small, big = peaks
    assert big < 1.5 * small + 512 * 1024, (small, big)
    assert big < 16 * 2**20


# -- the tree checks on random trees --------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from storage.importers.records import ImportFileError, SourceConversation, SourceMessage  # noqa: E402
from storage.importers.tree import plan  # noqa: E402


@st.composite
def random_trees(draw):
    """A forest of n nodes (node i's parent is an earlier node or none), listed in a random order."""
    n = draw(st.integers(1, 60))
    parents = [None] + [draw(st.one_of(st.none(), st.integers(0, i - 1))) for i in range(1, n)]
    order = draw(st.permutations(range(n)))
    roles = [draw(st.sampled_from(["user", "assistant"])) for _ in range(n)]
    return parents, order, roles


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_plan_keeps_every_link_and_sibling_order(tree) -> None:
    parents, order, roles = tree
    msgs = [SourceMessage(f"n{i}", None if parents[i] is None else f"n{parents[i]}", roles[i], f"text {i}")
            for i in order]
    p = plan(SourceConversation("x", "t", messages=msgs))
    assert sorted(pm.source_id for pm in p.messages) == sorted(f"n{i}" for i in range(len(parents)))
    position = {pm.source_id: k for k, pm in enumerate(p.messages)}
    listed = [m.id for m in msgs]
    for pm in p.messages:
        i = int(pm.source_id[1:])
        assert pm.parent == (None if parents[i] is None else f"n{parents[i]}")
        if pm.parent is not None:
            assert position[pm.parent] < position[pm.source_id]  # parents first
    siblings: dict = {}
    for pm in p.messages:
        siblings.setdefault(pm.parent, []).append(pm.source_id)
    for kids in siblings.values():  # siblings keep the file's order
        assert kids == sorted(kids, key=listed.index)
    has_child = {pm.parent for pm in p.messages}
    assert p.leaves == sum(1 for pm in p.messages if pm.source_id not in has_child)
    assert p.current is not None and p.current not in has_child


@settings(max_examples=100, deadline=None)
@given(random_trees(), st.data())
def test_plan_finds_any_cycle(tree, data) -> None:
    parents, order, roles = tree
    n = len(parents)
    # point some node at one of its descendants (or itself): a cycle
    node = data.draw(st.integers(0, n - 1))
    descendants = [node]
    for i in range(n):
        j = i
        while j is not None and j != node:
            j = parents[j]
        if j == node and i != node:
            descendants.append(i)
    target = data.draw(st.sampled_from(descendants))
    parents = list(parents)
    parents[node] = target
    msgs = [SourceMessage(f"n{i}", None if parents[i] is None else f"n{parents[i]}", roles[i], "")
            for i in order]
    with pytest.raises(ImportFileError, match="cycle"):
        plan(SourceConversation("x", "t", messages=msgs))


def test_a_folder_imports_the_files_in_it(db: Path, tmp_path: Path) -> None:
    folder = tmp_path / "conversations"
    folder.mkdir()
    (folder / "1719000000000.conversation.json").write_bytes(LMSTUDIO.read_bytes())
    (folder / "notes.txt").write_text("not a chat")
    summary = import_files([folder], db)
    assert [Path(f.path).name for f in summary.files] == ["1719000000000.conversation.json"]
    assert summary.conversations == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    [f] = import_files([empty], db).files
    assert f.status == FileStatus.FAILED and "no .json, .jsonl or .zip file" in f.error


def test_the_source_migration_keeps_existing_chats(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage import chat_schema

    shipped = list(chat_schema.MIGRATIONS)
    before = shipped[:shipped.index(chat_schema._migration_import_sources)]
    monkeypatch.setattr(chat_schema, "MIGRATIONS", before)  # a database from before this migration
    with ChatStore(db) as chats:
        c = chats.create_conversation(title="Older")
    with closing(sqlite3.connect(db)) as conn, conn:  # that schema's columns (ChatStore now writes later ones too)
        conn.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES (?, 'user', 'kept', 0)",
                     (c.id,))
    monkeypatch.setattr(chat_schema, "MIGRATIONS", shipped)
    import_files([CLAUDE], db)
    assert [(t, [r[4] for r in rows]) for t, _, _, _, rows in snapshot(db)][0] == ("Older", ["kept"])
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(shipped)
        sources = conn.execute("SELECT title, source FROM conversations ORDER BY id").fetchall()
    finally:
        conn.close()
    assert sources == [("Older", None), ("Haiku about 雪 ❄️", "claude:5e1f0000-0000-4000-8000-0000000000aa")]
    with ChatStore(db) as chats:  # a copy is not the import: re-importing still finds the original
        chats.copies.duplicate_conversation(2)
    assert import_files([CLAUDE], db).files[0].status == FileStatus.UNCHANGED


def test_a_database_locked_by_another_writer_is_a_clear_error(db: Path, monkeypatch) -> None:
    import storage.importers.run as run
    from storage.errors import StorageError

    ChatStore(db).close()
    monkeypatch.setattr(run, "BUSY_TIMEOUT_S", 0.2)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageError, match="stayed busy for 0.2 seconds"):
            import_files([CLAUDE], db)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert snapshot(db) == []


def test_a_sillytavern_group_chat_is_named_after_its_speakers(db: Path, tmp_path: Path) -> None:
    lines = [
        {"user_name": "unused", "character_name": "unused", "chat_metadata": {}},
        {"name": "You", "is_user": True, "mes": "Hello both", "send_date": 1716762731000},
        {"name": "Alice", "is_user": False, "mes": "Hi!", "send_date": 1716762732000},
        {"name": "Bob", "is_user": False, "mes": "Hey.", "send_date": 1716762733000},
    ]
    path = tmp_path / "Party night.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    import_files([path], db)
    [(title, _, _, leaf, rows)] = snapshot(db)
    assert title == "Party night (Alice, Bob)"
    assert [(r[1], r[2], r[4]) for r in rows] == [
        (None, "user", "Hello both"), (0, "assistant", "Hi!"), (1, "assistant", "Hey.")]
    assert leaf == 2


def test_a_full_disk_during_an_import_names_the_data_folder_not_the_file_being_read(tmp_path):
    import sqlite3

    from storage.errors import StorageFullError
    from storage.importers.run import _database_folder, _transaction

    (tmp_path / "data").mkdir()
    conn = sqlite3.connect(tmp_path / "data" / "chats.sqlite3", isolation_level=None)
    with pytest.raises(StorageFullError) as caught, _transaction(conn, _database_folder(conn), commit=True):
        raise sqlite3.OperationalError("database or disk is full")
    assert str(caught.value).startswith(f"The disk holding {tmp_path / 'data'} is full")
    assert not conn.in_transaction
