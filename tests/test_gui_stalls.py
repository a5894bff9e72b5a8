"""Issue #10.3: work in proportion to a conversation stays off the UI thread. In the real
window (no model needed): the tree panel is read and laid out on a worker thread and drawn
when it arrives; a search runs there too; a long chat opens with its newest exchange and
builds the older bubbles a few at a time, letting other timers run in between; a streamed
reply redraws only the block being written. Speed itself is measured by
``python -m tools.ui_latency`` (and ``--big``), not here."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import json  # noqa: E402
import threading  # noqa: E402

from gui_helpers import wait_for_tree  # noqa: E402
from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtGui import QGuiApplication, QPalette  # noqa: E402
from PySide6.QtWidgets import QWidget  # noqa: E402

import app.window.tree.tree_panel as tree_panel  # noqa: E402
from app.window.tree.sidebar import SNIPPET_ROLE, SPANS_ROLE  # noqa: E402
from app.window.shell.theme import LIGHT  # noqa: E402
from app.window.transcript.long_text import LongTextExpander  # noqa: E402
from app.window.transcript.message_widget import MessageWidget  # noqa: E402
from app.window.transcript.thought_block import ThoughtBlock  # noqa: E402
from app.window.transcript.transcript_view import NEAR_TOP_PX, SHOWN_MESSAGES  # noqa: E402
from storage.chats import ChatStore, Message  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402


def _window(open_window, data_dir, show_tree: bool = False):
    settings = data_dir / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "show_tree": show_tree}))
    return open_window(data_dir, wait=False, start_engine=False)


def _branch(store: ChatStore, n: int, title: str, text: str = "x") -> tuple[int, list[int]]:
    """A conversation of ``n`` alternating user/assistant messages on one branch: (id, message ids)."""
    conv = store.create_conversation(title=title)
    ids: list[int] = []
    for i in range(n):
        ids.append(store.add_message(conv.id, ids[-1] if ids else None, "user" if i % 2 == 0 else "assistant",
                                     f"{text} {i}").id)
    return conv.id, ids


def test_the_tree_panel_is_laid_out_off_the_ui_thread(qtbot, open_window, data_dir, monkeypatch):
    with ChatStore(data_dir / CHATS_DB) as store:
        long_id, long_ids = _branch(store, 2_000, "Long")
        short_id, short_ids = _branch(store, 3, "Short")  # the newest: the window opens on it
    threads = []
    real = tree_panel._read_layout

    def recorded(*args):
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(tree_panel, "_read_layout", recorded)
    w = _window(open_window, data_dir, show_tree=True)
    wait_for_tree(qtbot, w)
    canvas = w.tree.canvas
    assert [n.message.id for n in canvas.nodes] == short_ids
    w.show_conversation(long_id)
    # the slot returned before the layout exists: the short chat's tree is still drawn,
    # and a click on it does not select a message of the chat shown before
    assert w.tree.loading
    # and the job is handed to the reader's worker only when the event loop comes back
    # (issue #27.6): the chat is drawn first, without the layout competing with it for the GIL
    assert w.tree.reader.held >= 1 and not threads[1:]
    assert len(canvas.nodes) == 3
    canvas.node_clicked.emit(short_ids[0])
    assert w.store.get_conversation(short_id).active_leaf_id == short_ids[-1]
    qtbot.waitUntil(lambda: len(canvas.nodes) == 2_000, timeout=30_000)
    assert not w.tree.loading
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert canvas.leaf_id == long_ids[-1] and canvas.active == set(long_ids)
    # painting and hit-testing look at the nodes in view
    centre = canvas.center_of(long_ids[-1])
    assert canvas.node_at(centre.x(), centre.y()).message.id == long_ids[-1]
    assert canvas.node_at(centre.x(), centre.y() + tree_panel.DY / 2) is None


def test_a_chats_first_screen_is_drawn_before_the_reader_starts_its_tree(qtbot, open_window, data_dir, monkeypatch):
    """Issue #27.6: the reader's Python would compete for the GIL with the turns that build
    the first screen's bubbles (each took two to three times its CPU time beside it)."""
    with ChatStore(data_dir / CHATS_DB) as store:
        long_id, long_ids = _branch(store, 400, "Long")
        _branch(store, 3, "Short")
    seen = []
    real = tree_panel._read_layout

    def recorded(*args):
        seen.append((w.transcript.filling, len(w.transcript.widgets)))  # read on the worker: plain Python values
        return real(*args)

    monkeypatch.setattr(tree_panel, "_read_layout", recorded)
    w = _window(open_window, data_dir, show_tree=True)
    w.resize(1000, 700)
    wait_for_tree(qtbot, w)
    seen.clear()
    w.show_conversation(long_id)
    assert w.transcript.filling and w.reader.holding and len(w.transcript.widgets) == 2
    qtbot.waitUntil(lambda: len(w.tree.canvas.nodes) == 400, timeout=30_000)
    assert seen[0][0] is False and seen[0][1] > 2  # started once the view was full
    assert not w.transcript.filling and not w.reader.holding and w.transcript.building
    bar = w.transcript.verticalScrollBar()
    assert bar.value() == bar.maximum() >= NEAR_TOP_PX


def test_opening_a_long_branch_reads_only_the_messages_it_draws(qtbot, open_window, data_dir, monkeypatch):
    """Issue #27.6: the click's turn read the 200 newest messages (text, token ids, stats) to
    find the questions left without a reply; each is read when its bubble is built."""
    with ChatStore(data_dir / CHATS_DB) as store:
        long_id, ids = _branch(store, 400, "Long")
        store.add_message(long_id, ids[-2], "user", "a question after a question")  # ids[-2] is a question
        _branch(store, 3, "Short")
    w = _window(open_window, data_dir)
    read: list[int] = []
    real = w.store.messages
    monkeypatch.setattr(w.store, "messages", lambda wanted: read.extend(wanted) or real(wanted))
    w.show_conversation(long_id)
    assert len(set(read)) <= 6, read  # the newest two, the root and its reply, the leaf's checks
    qtbot.waitUntil(lambda: not w.transcript.filling, timeout=30_000)
    assert len(set(read)) <= 6 + len(w.transcript.widgets)
    w.transcript.finish_building()
    # Retry on the question followed by a question, and on the unanswered leaf; on no other
    bubbles = {b.message.id: b for b in w.transcript.widgets}
    assert [mid for mid, b in bubbles.items() if "retry" in b.buttons] == [ids[-2], max(bubbles)]


def test_opening_a_long_branch_walks_it_off_the_ui_thread(qtbot, open_window, data_dir, monkeypatch):
    """Issue #27.6: the click's turn walked the whole branch for its ids (30 ms for 10,000
    messages of 2 KB); it reads the newest ones, and the reader the rest (the earlier
    messages' count comes with them)."""
    with ChatStore(data_dir / CHATS_DB) as store:
        long_id, ids = _branch(store, 700, "Long")
        _branch(store, 3, "Short")
    w = _window(open_window, data_dir)
    walks = []
    real = type(w.store.branches).path_ids

    def path_ids(self, mid):
        walks.append(threading.current_thread() is threading.main_thread())
        return real(self, mid)

    monkeypatch.setattr(type(w.store.branches), "path_ids", path_ids)
    w.show_conversation(long_id)
    path = w.transcript.path
    assert walks == [] and not path.complete and [b.message.id for b in w.transcript.widgets] == ids[-2:]
    assert w.transcript.earlier_button.text() == "Show earlier messages" and w.transcript.earlier_button.isVisibleTo(w)
    qtbot.waitUntil(lambda: path.complete, timeout=30_000)
    assert walks == [False] and path.ids == ids
    assert w.transcript.earlier_button.text() == f"Show earlier messages ({700 - SHOWN_MESSAGES:,} not shown)"
    # a search hit further up than the ids read first is still found and shown
    w.show_conversation(long_id)
    hit = w.transcript.reveal(ids[5])
    assert hit is not None and hit.message.id == ids[5] and hit.highlighted


def test_a_search_runs_off_the_ui_thread(qtbot, open_window, data_dir):
    big_text = "\n".join(f"{i:05d} a log line" for i in range(20_000)) + " zebrafinch"
    with ChatStore(data_dir / CHATS_DB) as store:
        big = store.create_conversation(title="Big paste")
        store.add_message(big.id, None, "user", big_text)
        other = store.create_conversation(title="Other")
        store.add_message(other.id, None, "user", "hello")
    w = _window(open_window, data_dir)
    assert w.sidebar.ids() == [other.id, big.id]
    w.sidebar.search.setText("zebrafinch")
    w.sidebar.refresh()  # what the search box's timer calls
    assert w.sidebar.searching
    assert w.sidebar.ids() == [other.id, big.id]  # the list stays until the results arrive
    qtbot.waitUntil(lambda: w.sidebar.ids() == [big.id], timeout=30_000)
    item = w.sidebar.list.item(0)
    snippet, spans = item.data(SNIPPET_ROLE), item.data(SPANS_ROLE)
    assert [snippet[a:b] for a, b in spans] == ["zebrafinch"]
    # a newer query supersedes one still running: only its results are shown
    w.sidebar.search.setText("hello")
    w.sidebar.refresh()
    w.sidebar.search.setText("log line")
    w.sidebar.refresh()
    qtbot.waitUntil(lambda: not w.sidebar.searching, timeout=30_000)
    assert w.sidebar.ids() == [big.id]
    w.sidebar.search.clear()
    w.sidebar.refresh()  # the plain list: at once
    assert w.sidebar.ids() == [other.id, big.id]


def test_a_long_chat_opens_on_its_newest_exchange_and_builds_the_rest_between_timers(qtbot, open_window, data_dir):
    with ChatStore(data_dir / CHATS_DB) as store:
        long_id, ids = _branch(store, 200, "Long", "A **message** with\n\n- a list\n- of two\n\nnumber")
        other = store.create_conversation(title="Other")
        store.add_message(other.id, None, "user", "hello")
    w = _window(open_window, data_dir)
    w.resize(1000, 700)
    events: list[str] = []
    real = w.transcript._build_older

    def build(*args):
        events.append("build")
        real(*args)

    w.transcript._build_older = build
    beat = QTimer(interval=5)
    beat.timeout.connect(lambda: events.append("beat"))
    beat.start()
    w.show_conversation(long_id)
    # the newest question and its answer, at once
    assert [b.message.id for b in w.transcript.widgets] == ids[-2:]
    assert w.transcript.building
    bar = w.transcript.verticalScrollBar()
    # built until the view's top is well above the built bubbles' top, then no more
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() >= NEAR_TOP_PX, timeout=30_000)
    assert events.count("build") >= 3 and w.transcript.building
    assert bar.value() == bar.maximum()  # still at the newest
    beat.stop()
    builds = events[events.index("build"):len(events) - events[::-1].index("build")]
    # other timers run between the builds (no burst of builds keeps the event loop to itself)
    assert "build,build,build" not in ",".join(builds), builds
    assert [b.message.id for b in w.transcript.widgets] == ids[-len(w.transcript.widgets):]
    newest = w.transcript.widgets[-1]
    assert newest.mapTo(w.transcript.viewport(), newest.rect().bottomLeft()).y() <= w.transcript.viewport().height()


def _message(mid: int, role: str, text: str, reasoning: str | None = None) -> Message:
    return Message(mid, 1, mid - 1 or None, role, text, None, None, "complete", None, 0.0, reasoning=reasoning)


def test_a_bubble_parses_no_style_sheet_and_builds_only_the_blocks_its_message_needs(qtbot):
    """Issue #27.6: a style sheet on a bubble styled every widget in it through the style-sheet
    engine, and every bubble built a thinking block and a "Show all" button it rarely shows."""
    plain = MessageWidget(_message(1, "user", "turn 1"), "user", colors=LIGHT)
    qtbot.addWidget(plain)
    assert [w for w in [plain, *plain.findChildren(QWidget)] if w.styleSheet()] == []
    assert plain.findChildren(ThoughtBlock) == [] and plain.findChildren(LongTextExpander) == []
    assert plain.reasoning == "" and [a.text() for a in plain.context_menu().actions()
                                      if "reasoning" in a.text()] == []
    assert plain.note.palette().color(QPalette.ColorRole.WindowText).name() == LIGHT.muted
    # the blocks a message needs are there, in their places
    thinking = MessageWidget(_message(2, "assistant", "It is 4.", reasoning="Add them."), "assistant", colors=LIGHT)
    qtbot.addWidget(thinking)
    lay = thinking.layout()
    assert thinking.findChildren(ThoughtBlock) == [thinking.thought] and thinking.reasoning == "Add them."
    assert 0 < lay.indexOf(thinking.thought) < lay.indexOf(thinking.body) < lay.indexOf(thinking.footer)
    long = MessageWidget(_message(3, "user", "\n".join(f"line {i}" for i in range(400))), "user", colors=LIGHT)
    qtbot.addWidget(long)
    assert long.findChildren(LongTextExpander) == [long.expander] and long.expander.isVisibleTo(long)
    assert lay.indexOf(thinking.footer) == lay.count() - 1
    assert long.layout().indexOf(long.expander) == long.layout().indexOf(long.footer) - 1
    # the bubble is painted: its border, in the accent colour when highlighted
    plain.resize(300, 80)
    edge = (plain.width() // 2, 0)
    assert plain.grab().toImage().pixelColor(*edge).name() == LIGHT.border
    plain.set_highlighted(True)
    assert plain.grab().toImage().pixelColor(*edge).name() == LIGHT.accent
    assert plain.grab().toImage().pixelColor(plain.width() // 2, 40).name() == LIGHT.user_bubble


def test_a_streamed_reply_redraws_only_its_last_block(qtbot):
    bubble = MessageWidget(None, "assistant", colors=LIGHT)
    qtbot.addWidget(bubble)
    first = "Intro **paragraph**.\n\n```python\nprint('one')\n```\n\n"
    bubble.set_text(first + "A second par")
    stream = bubble.stream
    assert len(stream.frozen) == 1
    done = stream.frozen[0]
    drawn = done.text()
    assert "paragraph" in drawn and "print" in drawn and "second" not in drawn
    assert "A second par" in stream.live.text()
    bubble.set_text(first + "A second paragraph.\n\n```bash\necho two\n```\n\nThe end")
    assert stream.frozen[0] is done and done.text() == drawn  # never drawn again
    assert len(stream.frozen) == 2 and "echo" in stream.frozen[1].text()
    assert "The end" in stream.live.text() and "second" not in stream.live.text()
    # a code block's Copy link numbers the blocks of the whole reply
    assert 'href="copy:0"' in drawn and 'href="copy:1"' in stream.frozen[1].text()
    stream.frozen[1].linkActivated.emit("copy:1")
    assert QGuiApplication.clipboard().text() == "echo two\n"  # as code_blocks gives it
    bubble.set_text("Something else")  # not a continuation: drawn afresh
    assert stream.frozen == [] and "Something else" in stream.live.text()


def test_the_tree_coverage_request_is_built_off_the_ui_thread(qtbot, open_window, data_dir, monkeypatch):
    from app.window.workers.engine_client import EngineClient
    from gui_helpers import new_chat, send_and_wait

    packed_on = []
    real = EngineClient.pack_coverage

    def pack(self, paths):
        packed_on.append(threading.current_thread())
        return real(self, paths)

    monkeypatch.setattr(EngineClient, "pack_coverage", pack)
    settings = data_dir / "settings.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "show_tree": True}))
    w = open_window(data_dir)
    new_chat(w)
    with qtbot.waitSignal(w.coverage_ready, timeout=120_000):
        reply = send_and_wait(qtbot, w, "Say hello.")
    assert packed_on and all(t is not threading.main_thread() for t in packed_on)
    user = w.store.get_message(reply).parent_id
    coverage = w.tree.canvas.coverage
    assert set(coverage) >= {user, reply}
    stored, total = coverage[user]
    assert total > 0 and stored == total  # the question's prompt was prefilled and stored
    assert coverage[reply][1] > total


def test_no_full_garbage_collection_starts_by_itself_while_a_window_is_open(qtbot, open_window, data_dir):
    import gc

    before = gc.get_threshold()
    w = _window(open_window, data_dir)
    # the objects of the start are frozen (never walked again); a full collection runs from
    # a timer, not at an allocation in the middle of a redraw; the young ones as before
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**8
    w.close()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
