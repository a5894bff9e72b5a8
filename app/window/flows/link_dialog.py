"""Asking before a link in a message opens in the browser (issue #16.1).

A message may come from a model or from pasted text, so its links are hostile: the
dialog shows the whole URL (wrapped anywhere, selectable, never elided) and the site it
goes to in its encoded form (``xn--…`` for an internationalised name, so a look-alike
domain is visible). Only ``LinkKind.EXTERNAL`` links (http and https) reach it.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QTextOption
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.window.shell.plain import plain_label


def link_host(url: str) -> str:
    """The host ``url`` points at, ASCII-encoded (punycode for non-ASCII names); "" if none."""
    return QUrl(url).host(QUrl.ComponentFormattingOption.FullyEncoded)


class OpenLinkDialog(QDialog):
    """"Open this link in your browser?" with the full URL; Open calls
    ``QDesktopServices.openUrl`` (emitting ``opened(url)``), Cancel does nothing.
    Shown window-modal with ``open()`` so the UI thread never waits in it."""

    opened = Signal(str)

    def __init__(self, url: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.url = url
        self.setWindowTitle("Open link?")
        self.setObjectName("open_link_dialog")
        lay = QVBoxLayout(self)
        host = link_host(url)
        self.question = plain_label(QLabel(f"Open this link in your browser? It goes to {host}."
                                           if host else "Open this link in your browser?"))
        self.question.setWordWrap(True)
        lay.addWidget(self.question)
        self.url_view = QPlainTextEdit(url)
        self.url_view.setObjectName("link_url")
        self.url_view.setReadOnly(True)
        self.url_view.setWordWrapMode(QTextOption.WrapMode.WrapAnywhere)
        self.url_view.setMaximumHeight(120)
        self.url_view.setAccessibleName("Link address")
        lay.addWidget(self.url_view)
        buttons = QDialogButtonBox()
        self.open_button = buttons.addButton("Open in browser", QDialogButtonBox.ButtonRole.AcceptRole)
        self.cancel_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.cancel_button.setDefault(True)  # Enter does not open a link by accident
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.resize(480, self.sizeHint().height())
        self.accepted.connect(self._open)

    def _open(self) -> None:
        QDesktopServices.openUrl(QUrl(self.url))
        self.opened.emit(self.url)


class LinkOpener(QObject):
    """The answer to a click on a message's http(s) link: an :class:`OpenLinkDialog` over
    ``parent`` showing the full URL (one at a time, kept in ``dialog``); only Open opens it."""

    def __init__(self, parent: QWidget):
        super().__init__(parent)
        self.parent_widget = parent
        self.dialog: OpenLinkDialog | None = None

    def confirm(self, url: str) -> None:
        """Ask before ``url`` opens in the browser (closing a dialog still open for another)."""
        if self.dialog is not None:
            self.dialog.close()
        self.dialog = dlg = OpenLinkDialog(url, self.parent_widget)
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dlg.finished.connect(lambda _r: setattr(self, "dialog", None))
        dlg.open()
