"""The Qt-free session layer (app/session): conversation rules and the reply recorder,
on a real ChatStore in a temporary folder and a fake engine (no model: milliseconds).

Each drift that issue #8 found between the CLI and the window has a test here that
would have caught it."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.session import ConversationSession, ReplyRecorder, ReplyState, model_label, suggested_context_size
from storage.chats import ChatStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def chats(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    yield store
    store.close()


@pytest.fixture
def session(chats):
    return ConversationSession(chats)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- a fake engine, with the interface of engine.core.Engine that the CLI uses ----------


@dataclass
class FakeStats:
    prompt_tokens: int = 10
    restored_tokens: int = 4
    prefilled_tokens: int = 6
    generated_tokens: int = 3
    restore_ms: float = 1.5
    prefill_ms: float = 20.0
    ttft_ms: float = 25.0
    decode_tokens_per_s: float = 50.0
    snapshot_ms: float = 0.0
    snapshot_bytes_written: int = 0
    finish_reason: str = "stop"

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class FakeResult:
    text: str
    token_ids: list[int]
    stats: FakeStats = field(default_factory=FakeStats)


class FakeStore:
    """Reports every prompt as stored (the snapshot succeeded)."""

    @staticmethod
    def coverage(_fingerprint, tokens) -> int:
        return len(tokens)


class FakeEngine:
    """Streams ``pieces``; ``snapshot`` records 7.25 ms and 4,096 bytes, as the real one would."""

    is_remote = False

    def __init__(self, pieces=("Hel", "lo", "!")):
        self.pieces = list(pieces)
        self.prompts = []
        self.closed = False
        self.store = FakeStore()
        self.fingerprint = b"fake"
        self.model = argparse.Namespace(path=Path("/models/fake.gguf"), facts=argparse.Namespace(
            name="Fake", chat_template=True, prompt_format="model template", chat_template_note=""))

    def prompt_tokens(self, messages) -> list[int]:
        return list(range(len(messages) * 4))

    def generate(self, messages, sampling, use_cache=True, on_token=None, snapshot=True, **_kw):
        self.prompts.append(messages)
        for i, p in enumerate(self.pieces):
            on_token(p, i)
        return FakeResult("".join(self.pieces), list(range(len(self.pieces))))

    def snapshot(self, stats) -> None:
        stats.snapshot_ms = 7.25
        stats.snapshot_bytes_written = 4096

    def close(self) -> None:
        self.closed = True


def cli_args(**kw) -> argparse.Namespace:
    base = dict(json=True, no_cache=False, model=None, max_tokens=None, temperature=None, seed=None,
                top_p=None, top_k=None, min_p=None, repeat_penalty=None)
    return argparse.Namespace(**{**base, **kw})


# -- the drifts of issue #8 --------------------------------------------------------------


def test_cli_reply_stores_the_snapshot_figures(chats, session, capsys):
    """Drift 1: the window stored snapshot_ms = 0 because the snapshot comes after ``done``.
    Both front ends now merge it through ``ReplyRecorder.add_snapshot``."""
    from app.cli.reply import reply as cli_reply

    user = session.send(None, "Hi")
    conv = chats.get_conversation(user.conversation_id)
    engine = FakeEngine()
    assert cli_reply(cli_args(), engine, chats, conv, user.id, "M") == 0
    out = json.loads(capsys.readouterr().out)
    reply = chats.get_message(out["assistant_message_id"])
    assert reply.content == "Hello!"
    assert reply.status == "complete"
    assert reply.stats["snapshot_ms"] == 7.25
    assert reply.stats["snapshot_bytes_written"] == 4096
    assert reply.token_ids == (0, 1, 2)
    assert engine.closed
    assert [(m.role, m.content) for m in engine.prompts[0]] == [("user", "Hi")]


def test_recorder_merges_a_snapshot_that_arrives_after_done(chats, session):
    """Drift 1, the window's order of events: done (stats without the snapshot), then snapshot."""
    user = session.send(None, "Hi")
    rec = session.start_reply(user.id, "M")
    rec.add_text("Hello")
    mid = rec.complete("Hello", [1, 2], {"prompt_tokens": 5, "snapshot_ms": 0.0, "finish_reason": "stop"})
    assert chats.get_message(mid).stats["snapshot_ms"] == 0.0
    rec.add_snapshot(12.5, 65536)
    stats = chats.get_message(mid).stats
    assert stats["snapshot_ms"] == 12.5 and stats["snapshot_bytes_written"] == 65536
    assert stats["prompt_tokens"] == 5


def test_one_model_label_rule_for_cli_and_window(tmp_path):
    """Drift 2: the CLI stored "…Q4_1.gguf", the window "…Q4_1"."""
    from app.cli.reply import local_model_label
    from engine.model_file import default_model_path

    assert model_label("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert model_label("/m/Other.GGUF") == "Other"
    assert model_label(None, {"name": "Gemma"}) == "Gemma"
    assert local_model_label(cli_args()) == model_label(default_model_path()) == default_model_path().name[:-5]
    assert local_model_label(cli_args(model=str(tmp_path / "x.Q4_0.gguf"))) == "x.Q4_0"
    # the window's side: tests/test_gui_chat.py checks the label stored on a real reply


def test_one_budget_default():
    """Drift 3: app_settings said 2 GiB, the prefix store and the README 4 GiB."""
    from app.window.settings.app_settings import AppSettings
    from storage.prefix_store import DEFAULT_BUDGET_BYTES, PrefixStore

    assert DEFAULT_BUDGET_BYTES == 4 * 1024**3
    assert AppSettings().budget_bytes == DEFAULT_BUDGET_BYTES
    import inspect

    assert inspect.signature(PrefixStore).parameters["budget_bytes"].default == DEFAULT_BUDGET_BYTES
    assert "default 4 GiB" in (ROOT / "README.md").read_text()


def test_one_set_of_sampling_and_engine_defaults():
    """Drift 4: sampling defaults lived in storage/chat_records.py and engine/settings.py."""
    from dataclasses import asdict

    from app.cli import build_parser
    from app.window.settings.app_settings import AppSettings
    from engine.settings import EngineSettings, SamplingParams
    from storage.chat_records import DEFAULT_SAMPLING

    assert asdict(SamplingParams()) == dict(DEFAULT_SAMPLING)
    e, a = EngineSettings(), AppSettings()
    assert (a.n_ctx, a.n_threads, a.type_k, a.type_v) == (e.n_ctx, e.n_threads, e.type_k, e.type_v)
    args = build_parser().parse_args(["chat", "x"])
    assert (args.ctx_size, args.kv_type, args.threads) == (e.n_ctx, e.type_k, e.n_threads)


def test_one_storage_error_family():
    from storage.errors import StorageError
    from storage.prefix_store import StoreError, StoreReset, StoreUnavailable

    assert issubclass(StoreError, StorageError)
    assert issubclass(StoreReset, StorageError) and issubclass(StoreUnavailable, StorageError)


def test_the_engine_overflow_error_has_no_window_wording():
    from engine.errors import ContextOverflowError

    text = str(ContextOverflowError(9000, 8192))
    assert text == "This conversation is 9,000 tokens long, but the context window holds 8,192."


def test_the_repository_explains_itself():
    """No comment points to a design file that is not in the repository."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    outside_file = "DESIGN" + ".md"  # spelled in two parts, so this test does not cite it either
    hits = [p for p in tracked if p.endswith((".py", ".md", ".spec", ".toml"))
            and outside_file in (ROOT / p).read_text(encoding="utf-8")]
    assert hits == []


# -- the reply recorder -------------------------------------------------------------------


def test_recorder_saves_the_partial_text_every_half_second(chats, session):
    user = session.send(None, "Hi")
    clock = FakeClock()
    rec = session.start_reply(user.id, "M", clock=clock)
    rec.add_text("")
    assert rec.message_id is None  # nothing stored before there is text
    rec.add_text("A")
    mid = rec.message_id
    m = chats.get_message(mid)
    assert (m.content, m.status, m.model) == ("A", ReplyState.STREAMING, "M")
    clock.now += 0.2
    rec.add_text("B")
    assert chats.get_message(mid).content == "A"  # not due yet
    clock.now += 0.3
    rec.add_text("C")
    assert chats.get_message(mid).content == "ABC"
    rec.add_text("D")
    rec.save_partial()  # the window's timer: due or not, write what changed
    assert chats.get_message(mid).content == "ABCD"


def test_recorder_cancel_is_stopped_and_keeps_the_text(chats, session):
    user = session.send(None, "Hi")
    rec = session.start_reply(user.id, "M")
    rec.add_text("Partial")
    mid = rec.complete("Partial", [5], {"finish_reason": "cancelled"})
    assert rec.state == ReplyState.STOPPED
    assert chats.get_message(mid).status == "stopped"
    rec.add_text("more")  # a late token after the end changes nothing
    assert chats.get_message(mid).content == "Partial"


def test_recorder_cancel_before_any_text_stores_an_empty_stopped_reply(chats, session):
    user = session.send(None, "Hi")
    rec = session.start_reply(user.id, "M")
    mid = rec.complete("", [], {"finish_reason": "cancelled", "prompt_tokens": 12})
    (reply,) = chats.branches.children(user.id, user.conversation_id)
    assert reply.id == mid and reply.content == "" and reply.status == "stopped"
    assert reply.stats["prompt_tokens"] == 12
    assert session.unanswered_leaf(user.conversation_id).id == user.id
    assert session.retry(mid) == user.id  # Retry replaces the empty reply
    assert chats.branches.children(user.id, user.conversation_id) == []


def test_recorder_abandon_keeps_partial_text_with_the_given_status(chats, session):
    user = session.send(None, "Hi")
    rec = session.start_reply(user.id, "M", clock=FakeClock())
    rec.add_text("Half")
    rec.add_text(" a reply")  # not saved yet (same clock instant)
    mid = rec.abandon(ReplyState.ERROR)
    m = chats.get_message(mid)
    assert (m.content, m.status) == ("Half a reply", "error")
    assert rec.abandon(ReplyState.STOPPED) == mid and chats.get_message(mid).status == "error"


# -- the conversation rules ----------------------------------------------------------------


def _answer(session, user_id: int, text: str) -> int:
    rec = session.start_reply(user_id, "M")
    return rec.complete(text, [1], {"finish_reason": "stop"})


def test_send_edit_regenerate_and_sibling_positions(chats, session):
    u1 = session.send(None, "Q1")
    cid = u1.conversation_id
    a1 = _answer(session, u1.id, "A1")
    assert session.regenerate_target(a1) == u1.id
    a1b = _answer(session, session.regenerate_target(a1), "A1b")
    path = chats.active_path(cid)
    assert [m.content for m in path] == ["Q1", "A1b"]
    assert session.sibling_positions(path) == {u1.id: (1, 1), a1b: (2, 2)}
    u1b = session.edit(u1.id, "Q1 edited")
    assert u1b.parent_id is None and chats.get_conversation(cid).active_leaf_id == u1b.id
    assert session.sibling_positions(chats.active_path(cid)) == {u1b.id: (2, 2)}
    with pytest.raises(ValueError, match="only your own messages"):
        session.edit(a1, "no")


def test_switch_sibling_shows_that_branch_newest_leaf(chats, session):
    u1 = session.send(None, "Q1")
    cid = u1.conversation_id
    a1 = _answer(session, u1.id, "A1")
    u2 = session.send(cid, "Q2")
    _answer(session, u2.id, "A2")
    u1b = session.edit(u1.id, "Q1b")
    assert session.switch_sibling(u1b.id, -1)
    assert [m.content for m in chats.active_path(cid)] == ["Q1", "A1", "Q2", "A2"]
    assert not session.switch_sibling(u1.id, -1)  # no sibling before the first
    session.select(a1)
    assert chats.active_path(cid)[-1].content == "A2"


def test_unanswered_message_is_found_for_a_retry(chats, session):
    u1 = session.send(None, "Q1")
    cid = u1.conversation_id
    assert session.unanswered(cid) == u1.id
    _answer(session, session.regenerate_target(u1.id), "A1")
    assert session.unanswered(cid) is None
    assert [m.content for m in chats.active_path(cid)] == ["Q1", "A1"]  # no second user message


def test_fork_copies_the_path(chats, session):
    u1 = session.send(None, "Q1")
    a1 = _answer(session, u1.id, "A1")
    conv = session.fork(a1)
    assert conv.id != u1.conversation_id
    assert [m.content for m in chats.active_path(conv.id)] == ["Q1", "A1"]


def test_branch_dropping_oldest_keeps_the_newest_turns_from_a_user_message(chats, session):
    cid = None
    last_user = None
    for i in range(6):
        last_user = session.send(cid, f"question {i} " + "x" * 300)
        cid = last_user.conversation_id
        if i < 5:
            _answer(session, last_user.id, f"answer {i} " + "y" * 300)
    new_id = session.branch_dropping_oldest(last_user.id, n_ctx=512)
    kept = chats.branches.path_to(new_id)
    assert kept[0].parent_id is None and kept[0].role == "user"
    assert kept[-1].content == last_user.content
    assert 1 < len(kept) < 11
    assert [m.content[:10] for m in kept] == [m.content[:10] for m in chats.branches.path_to(last_user.id)[-len(kept):]]


def test_branch_dropping_oldest_refuses_when_the_newest_message_alone_does_not_fit(chats, session):
    u = session.send(None, "z" * 3000)
    assert session.branch_dropping_oldest(u.id, n_ctx=256) is None
    assert len(chats.tree(u.conversation_id)) == 1


def test_context_size_suggestion():
    assert suggested_context_size(9000, 8192, 1024) == 16384  # twice, on a 1,024 boundary
    assert suggested_context_size(20000, 8192, 1024) == 21504  # room for the reply
    assert suggested_context_size(9000, 8192, 1024, trained=8192) == 8192  # cannot go past training
    assert suggested_context_size(9000, 8192, 1024, trained=32768) == 16384


def test_overflow_uses_the_conversation_max_tokens(chats, session):
    conv = chats.create_conversation(sampling={"max_tokens": 4000})
    u = session.send(conv.id, "Q")
    o = session.overflow(u.id, 15000, 8192, trained=0)
    assert (o.prompt_tokens, o.n_ctx, o.suggested_n_ctx) == (15000, 8192, 19456)


def test_the_session_layer_does_not_import_qt():
    import sys

    code = "import sys, app.session; sys.exit(1 if any(m.startswith('PySide6') for m in sys.modules) else 0)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_shown_path_reads_only_the_messages_asked_for(chats, session):
    """A 3,000-message branch: the shown path's ids at once, its messages as they are read,
    equal to ``active_path``; the sibling positions too."""
    conv = chats.create_conversation()
    parent = None
    for i in range(3_000):
        parent = chats.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", f"m{i}").id
    other = chats.add_message(conv.id, chats.active_path(conv.id)[-2].id, "assistant", "second version")
    chats.set_active_leaf(conv.id, parent)
    path = session.shown_path(conv.id)
    full = chats.active_path(conv.id)
    assert len(path) == 3_000 and path.ids == [m.id for m in full]
    assert path._known == {}  # nothing read yet
    assert path[-1] == full[-1] and path[-3:] == full[-3:] and list(path) == full
    assert next(m for m in reversed(path) if m.role == "user") == full[-2]
    positions = session.sibling_positions(path)
    assert positions[full[-1].id] == (1, 2) and positions[full[0].id] == (1, 1)
    assert other.id not in path.ids


def test_unanswered_leaf_is_the_branch_end_without_a_reply(chats, session):
    user = session.send(None, "Hi")
    assert session.unanswered_leaf(user.conversation_id).id == user.id  # a question on its own
    rec = session.start_reply(user.id, "M")
    rec.complete("Hello", [], {"finish_reason": "stop"})
    assert session.unanswered_leaf(user.conversation_id) is None  # answered
    follow = session.send(user.conversation_id, "And then?")
    assert session.unanswered_leaf(user.conversation_id).id == follow.id


def test_a_send_plan_goes_with_the_packed_branch_only_while_it_is_current(chats, session):
    from app.session.packed_prompt import read_packed_prompt
    from engine.events import unpack_messages

    user = session.send(None, "Q1 <b>&amp;</b>")
    cid = user.conversation_id
    chats.set_system_prompt(cid, "Be brief.")
    _answer(session, user.id, "A1")
    packed = read_packed_prompt(chats, cid)
    whole = session.send_plan(cid, "Q2")  # read from the database
    assert whole.path is None and whole.messages[-1].content == "Q2"
    fast = session.send_plan(cid, "Q2", packed)
    assert fast.path == packed.data and [(m.role, m.content) for m in fast.messages] == [("user", "Q2")]
    assert fast.parent_id == whole.parent_id and fast.sampling == whole.sampling
    assert unpack_messages(fast.path) + fast.messages == whole.messages  # the same prompt, token ids too
    assert packed.count == len(whole.messages) - 1
    slow_messages, slow_ids = session.prompt_for_send(cid, "Q2")
    fast_messages, fast_ids = session.prompt_for_send(cid, "Q2", packed=packed)
    assert unpack_messages(fast_messages) == slow_messages and fast_ids == slow_ids == [None, user.id, slow_ids[2], None]
    chats.set_system_prompt(cid, "Be long.")  # stale: the system prompt changed
    assert session.send_plan(cid, "Q2", packed).path is None
    chats.set_system_prompt(cid, "Be brief.")
    assert session.send_plan(cid, "Q2", packed).path == packed.data
    session.send(cid, "Q2")  # stale: the leaf moved
    moved = session.send_plan(cid, "Q3", packed)
    assert moved.path is None and [m.content for m in moved.messages][-2:] == ["Q2", "Q3"]


def test_a_reply_cut_by_a_crash_says_why_it_cannot_go_on(chats, session):
    from app.session.continuation import can_continue, why_not_continued

    user = session.send(None, "Hi")
    cut = session.start_reply(user.id, "M")
    cut.add_text("Half a rep")
    mid = cut.abandon(ReplyState.STOPPED)  # what a start finds after a kill: text, no token ids
    m = chats.get_message(mid)
    assert not can_continue(m) and m.content and not m.token_ids
    assert "cut off when Branchwise ended unexpectedly" in why_not_continued(m)
    assert f"branchwise regenerate {mid}" in why_not_continued(m)
    assert "your own message" in why_not_continued(chats.get_message(user.id))
    done = session.start_reply(user.id, "M")
    finished = chats.get_message(done.complete("Hello", [1, 2], {"finish_reason": "stop"}))
    assert "only a reply that was stopped or hit max tokens" in why_not_continued(finished)


def test_a_long_shown_path_reads_the_ids_of_its_newest_messages_only(chats, session, monkeypatch):
    """Issue #27.6: opening a branch walked all of it on the UI thread (30 ms for 10,000
    messages of 2 KB); now the newest ``tail`` ids, the rest when asked for or given."""
    conv = chats.create_conversation()
    parent = None
    for i in range(600):
        parent = chats.add_message(conv.id, parent, "user" if i % 2 == 0 else "assistant", f"m{i}").id
    full = chats.active_path(conv.id)
    walks = []
    real = chats.branches.path_ids
    monkeypatch.setattr(chats.branches, "path_ids", lambda mid: walks.append(mid) or real(mid))
    path = session.shown_path(conv.id, tail=256)
    other = session.shown_path(conv.id, tail=256)
    assert not path.complete and path.tail_ids == [m.id for m in full[-256:]] and path
    assert path[-1] == full[-1] and path[-256] == full[-256] and path[-3:] == full[-3:]
    assert path.has_id(full[-5].id) and walks == []
    positions = session.sibling_positions(path)
    assert positions[full[-2].id] == (1, 1) and walks == []
    assert [m.id for m in itertools.islice(reversed(path), 10)] == [m.id for m in full[:-11:-1]] and walks == []
    longer = path.plus(chats.add_message(conv.id, parent, "user", "one more"))
    assert not longer.complete and longer.tail_ids[-2:] == [parent, longer[-1].id]
    # the rest when asked for: the length, an index from the root, a message further up
    assert len(path) == 600 and path.complete and path.ids == [m.id for m in full] and walks == [parent]
    assert path[0] == full[0] and list(path) == full
    # or given (read elsewhere): taken only when they end with the ids known
    assert not other.complete_with([1, 2, 3]) and not other.complete
    assert other.complete_with([m.id for m in full]) and other.complete and len(other) == 600
    assert len(walks) == 1
    assert positions[full[0].id] == (1, 1) and full[0].id in list(positions)
    # a short branch is read whole at once
    short = chats.create_conversation()
    root = chats.add_message(short.id, None, "user", "hi")
    assert session.shown_path(short.id).complete and session.shown_path(short.id).ids == [root.id]
