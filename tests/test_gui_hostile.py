"""Issue #16.1 / #10.6: every widget that shows text from a user, a model or a model file
shows it as plain text. The same hostile strings go to each widget of the real window
(no model: the engine is not started); the test asserts the text a user sees equals the
input and that nothing in it became bold, an image or a link.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402
from PySide6.QtCore import QEvent, QPoint, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QFont, QHelpEvent, QTextDocument  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox, QToolTip  # noqa: E402

from app.window.shell.plain import TOOLTIP_CHARS, elide, isolate  # noqa: E402
from storage.chats import ChatStore  # noqa: E402
from storage.paths import CHATS_DB  # noqa: E402

HOSTILE = [
    "<b>bold?</b>",
    '<img src="/dev/zero">',
    "<img src=/dev/zero>",
    "I &lt;3 you",
    "&amp;",
    "שלום עולם مرحبا 你好世界 🍎👩‍👩‍👧",
    "x" * 10_000,
]
IDS = ["bold", "img-quoted", "img-bare", "entity", "amp", "rtl-cjk-emoji", "long-line"]


def rendered(rich: str) -> QTextDocument:
    """What Qt makes of a tooltip or rich label text (resources are never fetched here:
    QTextDocument only asks loadResource for images, which this test checks are absent)."""
    doc = QTextDocument()
    doc.setHtml(rich)
    return doc


def assert_plain_document(doc: QTextDocument) -> None:
    """No fragment of ``doc`` is bold, an image or an anchor."""
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            assert not fmt.isImageFormat(), it.fragment().text()[:40]
            assert not fmt.isAnchor()
            assert fmt.fontWeight() <= QFont.Weight.Normal
            it += 1
        block = block.next()


def shown_text(doc: QTextDocument) -> str:
    return doc.toPlainText().replace("\u2028", "\n")


def hover(widget, pos: QPoint) -> str:
    """Send the tooltip event a hover at ``pos`` makes; return the tooltip text shown."""
    QToolTip.hideText()
    event = QHelpEvent(QEvent.Type.ToolTip, pos, widget.mapToGlobal(pos))
    QApplication.sendEvent(widget, event)
    return QToolTip.text()


@pytest.fixture
def window(open_window, data_dir):
    return lambda: open_window(data_dir, wait=False, start_engine=False)


@pytest.mark.parametrize("text", HOSTILE, ids=IDS)
def test_hostile_text_is_plain_in_every_widget(qtbot, window, data_dir, text):
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title=text)
        user = store.add_message(conv.id, None, "user", text)
        store.add_message(conv.id, user.id, "assistant", text)
    w = window()
    w.tree.setVisible(True)
    qtbot.waitExposed(w)

    # the window title
    assert w.windowTitle() == f"{text} — Branchwise"

    # the sidebar: the row's text, and its tooltip on hover
    item = w.sidebar.list.item(0)
    assert item.text() == text
    rect = w.sidebar.list.visualItemRect(item)
    tip = hover(w.sidebar.list.viewport(), rect.center())
    assert tip, "no tooltip on hover"
    doc = rendered(tip)
    assert_plain_document(doc)
    # the title isolated (U+2068 ... U+2069: its direction stays inside it), cut as the tooltip is
    expected = elide(isolate(elide(text, TOOLTIP_CHARS)) + "\nLast message ", TOOLTIP_CHARS)
    assert shown_text(doc).split("\nLast message ")[0] == expected.split("\nLast message ")[0]

    # the message view: user and assistant bubbles show the typed characters
    bodies = [mw.body for mw in w.transcript.widgets]
    assert len(bodies) == 2
    for body in bodies:
        doc = rendered(body.text())
        assert_plain_document(doc)
        assert shown_text(doc).strip().replace("\u200b", "") == text  # long runs get break opportunities

    # a tree node's tooltip on hover
    canvas = w.tree.canvas
    qtbot.waitUntil(lambda: bool(canvas.nodes))
    centre = canvas.center_of(user.id)
    tip = hover(canvas, centre.toPoint())
    doc = rendered(tip)
    assert_plain_document(doc)
    assert text[:40] in shown_text(doc)

    # banners: a model load error quoting the text, then "Deleted …"
    w.model._load_failed(text)
    assert w.banner.label.textFormat() == Qt.TextFormat.PlainText
    assert w.banner.text == f"The model could not be loaded. {text}"
    w.sidebar.delete(conv.id)
    assert w.banner.text == f"Deleted “{text}”."
    assert w.banner.label.textFormat() == Qt.TextFormat.PlainText
    w.sidebar.undo_delete()

    # Model info and the status bar: general.name from a hostile model file
    facts = {"name": text, "path": "", "architecture": text, "parameters": 135_000_000,
             "quantization": "Q4_1", "size_bytes": 1, "context_length": 2048, "n_ctx": 2048,
             "kv_bytes_per_token": 1024, "cache_policy": "full"}
    w.model.path = None
    w.model.ready.disconnect()  # no engine process here to ask for the context count
    w.model._loaded(facts)
    label = w.status.model_label
    assert label.textFormat() == Qt.TextFormat.PlainText
    assert label.text() == f"{isolate(text)} · 135M parameters"  # the name isolated from the app's words
    doc = rendered(label.toolTip())
    assert_plain_document(doc)
    assert shown_text(doc).startswith(elide(f"Name: {text}", TOOLTIP_CHARS)[:200])
    w.model.show_info()
    box = next(b for b in w.findChildren(QMessageBox) if b.windowTitle() == "Model info")
    assert box.textFormat() == Qt.TextFormat.PlainText
    assert box.text().splitlines()[0] == f"Name: {text}"
    box.close()


def test_typed_entity_shows_literally_in_the_message_view(qtbot, window, data_dir):
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="entities")
        store.add_message(conv.id, None, "user", "Tom &amp; Jerry, I &lt;3 you, **real bold**")
    w = window()
    doc = rendered(w.transcript.widgets[0].body.text())
    assert shown_text(doc).strip() == "Tom &amp; Jerry, I &lt;3 you, real bold"


def anchors(rich: str) -> list[str]:
    """The hrefs of the links in a rendered message, in order."""
    doc, hrefs = rendered(rich), []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isAnchor():
                hrefs.append(fmt.anchorHref())
            it += 1
        block = block.next()
    return hrefs


def test_a_web_link_opens_only_after_a_confirmation_showing_the_full_url(qtbot, window, data_dir,
                                                                          monkeypatch):
    from PySide6.QtGui import QDesktopServices

    from app.window.flows.link_dialog import OpenLinkDialog

    url = "https://xn--pple-43d.com/login?next=" + "a" * 300 + "&x=<b>1</b>"
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="links")
        store.add_message(conv.id, None, "user",
                          f"[your bank]({url}) and [local](file:///etc/passwd) and [js](javascript:alert(1))")
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda u: opened.append(u.toString())))
    w = window()
    body = w.transcript.widgets[0].body
    hrefs = anchors(body.text())
    assert len(hrefs) == 1  # Markdown drops file: and javascript: links: they stay text
    assert QUrl(hrefs[0]) == QUrl(url)

    # such links, were they clicked, do nothing at all
    for href in ("file:///etc/passwd", "javascript:alert(1)", "//host/share/x.png", "relative/a.html"):
        body.linkActivated.emit(href)
        assert w.links.dialog is None and w.findChildren(OpenLinkDialog) == []
    assert opened == []

    # the web link: a dialog with the whole URL and the encoded host; Cancel opens nothing
    body.linkActivated.emit(hrefs[0])
    dlg = w.links.dialog
    assert isinstance(dlg, OpenLinkDialog) and dlg.isVisible()
    assert dlg.url_view.toPlainText() == hrefs[0]  # what the browser would get, whole
    assert "xn--pple-43d.com" in dlg.question.text()
    assert dlg.question.textFormat() == Qt.TextFormat.PlainText
    qtbot.mouseClick(dlg.cancel_button, Qt.MouseButton.LeftButton)
    assert opened == [] and w.links.dialog is None

    # again, and Open: the browser gets exactly that URL
    body.linkActivated.emit(hrefs[0])
    qtbot.mouseClick(w.links.dialog.open_button, Qt.MouseButton.LeftButton)
    assert len(opened) == 1
    assert QUrl(opened[0]) == QUrl(url)


def test_a_chat_error_banner_goes_when_another_chat_is_shown(qtbot, window, data_dir):
    """#10.6: an error about one chat does not follow the user to New chat or other chats;
    an error about the model stays."""
    from engine.events import ErrorEvent, ErrorKind

    with ChatStore(data_dir / CHATS_DB) as store:
        a = store.create_conversation(title="a")
        ua = store.add_message(a.id, None, "user", "hi")
        b = store.create_conversation(title="b")
        store.add_message(b.id, None, "user", "hello")
    w = window()
    w.show_conversation(a.id)
    # the engine's template error for a reply in chat a
    w.chat.reply = w.chat.session.start_reply(ua.id, "model")
    w.chat._failed(w.chat.reply, ErrorEvent(id=0, kind=ErrorKind.TEMPLATE, message="<b>template</b> failed"))
    assert w.banner.isVisible() and w.banner.text == "<b>template</b> failed"
    assert w.banner.chat_id == a.id
    w.sidebar.selected.emit(b.id)
    assert not w.banner.isVisible()
    # a model error is about the app, not a chat: it stays through a switch
    w.model._load_failed("bad file")
    w.navigator.new_chat()
    assert w.banner.isVisible() and w.banner.text == "The model could not be loaded. bad file"


def _kv_blocks(data_dir) -> int:
    import sqlite3

    from storage.paths import KVCACHE_DB

    path = data_dir / KVCACHE_DB
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM blocks").fetchone()[0]


def _menu_action(qtbot, w, cid: int, text: str) -> None:
    """Right-click ``cid``'s row in the sidebar and choose ``text`` from the menu."""
    from PySide6.QtCore import QTimer

    from app.window.tree.sidebar import ID_ROLE

    row = next(w.sidebar.list.item(i) for i in range(w.sidebar.list.count())
               if w.sidebar.list.item(i).data(ID_ROLE) == cid)
    pos = w.sidebar.list.visualItemRect(row).center()
    chosen = []

    def choose():
        action = next(a for a in w.sidebar.menu.actions() if a.text() == text)
        chosen.append(action.toolTip())
        action.trigger()
        w.sidebar.menu.close()

    QTimer.singleShot(50, choose)
    w.sidebar.list.customContextMenuRequested.emit(pos)
    qtbot.waitUntil(lambda: bool(chosen))
    return chosen[0]


def test_delete_and_forget_drops_the_chats_kv_blocks_after_the_undo_time(qtbot, open_window, data_dir):
    """#16.4: Delete and forget in the sidebar menu: Undo works as for Delete; when the undo
    time is up the engine process deletes the rows and the chat's own KV blocks."""
    from gui_helpers import new_chat, send_and_wait

    from app.window.tree.sidebar import FORGET_NOTE
    from storage.errors import NotFoundError

    w = open_window(data_dir)
    cid = new_chat(w)
    send_and_wait(qtbot, w, "My bank PIN is 4711, remember it.")
    qtbot.waitUntil(lambda: _kv_blocks(data_dir) > 0, timeout=60_000)
    before = _kv_blocks(data_dir)

    tip = _menu_action(qtbot, w, cid, "Delete and forget")
    assert FORGET_NOTE in tip
    assert cid not in w.sidebar.ids()
    assert FORGET_NOTE in w.banner.text
    qtbot.mouseClick(w.banner.button("Undo"), Qt.MouseButton.LeftButton)
    assert cid in w.sidebar.ids() and _kv_blocks(data_dir) == before
    assert w.store.get_conversation(cid).id == cid

    _menu_action(qtbot, w, cid, "Delete and forget")
    with qtbot.waitSignal(w.forgotten, timeout=60_000) as blocker:
        w.sidebar.commit_delete()  # what the undo timer does when it runs out
    assert blocker.args[0] == cid and blocker.args[1] > 0
    assert _kv_blocks(data_dir) == before - blocker.args[1]
    with pytest.raises(NotFoundError):
        w.store.get_conversation(cid)
    assert cid not in w.sidebar.ids()
    assert w.banner.text.startswith("Deleted and forgot “")
    assert "Blocks it shares with other chats stay." in w.banner.text


def test_model_info_shows_the_real_kv_cache_per_token(qtbot, open_window, data_dir):
    """#10.6: Model info's "KV cache per token" is the loaded model's figure, not 0 bytes."""
    from app.window.settings.settings_dialog import human_bytes

    w = open_window(data_dir)
    per_token = w.facts["kv_bytes_per_token"]
    # the default model, SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K + V) x 2 bytes (f16)
    assert per_token == 30 * 3 * 64 * 2 * 2
    w.model.show_info()
    box = next(b for b in w.findChildren(QMessageBox) if b.windowTitle() == "Model info")
    assert f"KV cache per token: {human_bytes(per_token)}" in box.text().splitlines()
    box.close()


def test_the_pin_marker_is_drawn_not_an_emoji(qtbot, window, data_dir):
    """#10.6: a pinned chat's marker is a shape the delegate draws (no emoji font needed):
    the pinned row has dark pixels left of its title where the unpinned row has none."""
    from app.window.tree.sidebar import PIN_DOT, PINNED_ROLE

    with ChatStore(data_dir / CHATS_DB) as store:
        store.create_conversation(title="Wplain")  # an unpinned row below the pinned one
        pinned = store.create_conversation(title="Wpinned")
        store.set_pinned(pinned.id, True)
    w = window()
    qtbot.waitExposed(w)
    lst = w.sidebar.list
    # (the rows are drawn by ConversationDelegate)
    top, other = lst.item(0), lst.item(1)
    assert top.text() == "Wpinned" and top.data(PINNED_ROLE) is True
    assert top.data(Qt.ItemDataRole.AccessibleTextRole) == "Pinned: \u2068Wpinned\u2069"
    assert other.text() == "Wplain" and not other.data(PINNED_ROLE)
    lst.clearSelection()
    image = lst.viewport().grab().toImage()

    def dark_pixels(item) -> int:
        r = lst.visualItemRect(item)
        x0 = r.left() + 8  # the delegate's PAD_X
        y = r.center().y()
        return sum(1 for x in range(x0, x0 + 2 * PIN_DOT + 1) for dy in (-1, 0, 1)
                   if image.pixelColor(x, y + dy).lightness() < 128)

    lst.viewport().grab().save(str(data_dir / "pinned.png"))
    assert dark_pixels(top) >= 3 * 2 * PIN_DOT  # a filled dot across three pixel rows
    assert dark_pixels(top) > dark_pixels(other)  # the first letter's strokes fill less


def test_every_unanswered_user_message_has_retry(qtbot, open_window, data_dir):
    """#10.2: a user message whose reply failed (the next message is the user's again) and an
    unanswered leaf both offer Retry; Retry answers that message on a branch of its own."""
    with ChatStore(data_dir / CHATS_DB) as store:
        conv = store.create_conversation(title="two user turns",
                                         sampling={"temperature": 0.0, "max_tokens": 8, "seed": 1})
        first = store.add_message(conv.id, None, "user", "Say hi.")
        second = store.add_message(conv.id, first.id, "user", "Say bye.")
    w = open_window(data_dir)
    widgets = {mw.message.id: mw for mw in w.transcript.widgets}
    assert set(widgets) == {first.id, second.id}
    assert "retry" in widgets[first.id].buttons and "retry" in widgets[second.id].buttons
    with qtbot.waitSignal(w.reply_finished, timeout=180_000) as blocker:
        qtbot.mouseClick(widgets[first.id].buttons["retry"], Qt.MouseButton.LeftButton)
    reply = w.store.get_message(blocker.args[0])
    assert reply.parent_id == first.id and reply.role == "assistant" and reply.content
    roles = [(mw.message.id, mw.message.role) for mw in w.transcript.widgets]
    assert roles == [(first.id, "user"), (reply.id, "assistant")]
    assert "retry" not in w.transcript.widgets[0].buttons


def test_deleting_a_chat_while_its_reply_streams_stops_it_first(qtbot, open_window, data_dir):
    """Issue 30, item 5: Delete and forget of the chat whose reply is streaming cancels the
    reply, then deletes the rows and the chat's KV blocks; nothing of it is kept."""
    from gui_helpers import new_chat

    from storage.errors import NotFoundError

    w = open_window(data_dir)
    cid = new_chat(w, sampling={"max_tokens": 1500})
    w.composer.input.setPlainText("Passport QJVX-5518. Now write a long story about owls and foxes in the winter forest.")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.chat.reply is not None and len(w.chat.reply.text) > 20, timeout=120_000)
    assert w.sidebar.busy_id == cid
    with qtbot.waitSignal(w.reply_finished, timeout=60_000):
        _menu_action(qtbot, w, cid, "Delete and forget")  # used to be disabled while busy
    assert w.sidebar.busy_id is None and cid not in w.sidebar.ids()
    with qtbot.waitSignal(w.forgotten, timeout=60_000):
        w.sidebar.commit_delete()
    with pytest.raises(NotFoundError):
        w.store.get_conversation(cid)
    assert _kv_blocks(data_dir) == 0  # the only chat: every block was its own
    raw = b"".join(p.read_bytes() for p in data_dir.glob(CHATS_DB + "*") if p.is_file())
    assert b"QJVX-5518" not in raw
