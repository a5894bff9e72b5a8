"""The window's three panels side by side, sized for the window's width and remembered.

The sidebar (chats), the messages and the tree panel sit in one ``QSplitter``. Each panel
gets a share of the width (``SHARES``) within its bounds, so at 800 px the messages keep
room for their buttons and at 1600 px the tree panel is wide enough for a branched tree;
a drag of a splitter handle sets the shares the user wants, and growing or shrinking the
window keeps the shares (the tree panel grows with the window; it is not a fixed width, and
a window made wider by the window manager gets the same panels as one started that wide).
The window's size and the panels' widths are saved in the settings (``window_layout``) when
the window closes and applied at the next start.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QMainWindow, QSplitter

from app.window.settings.settings_model import SettingsModel

DEFAULT_SIZE = (1180, 760)
"""The window's size (pixels) at the first start."""
SIDEBAR_MIN, TREE_MIN = 160, 180
"""The narrowest the sidebar and the tree panel get (pixels)."""
SHARES = (0.19, 0.56, 0.25)
"""The sidebar's, the messages' and the tree panel's shares of the window's width."""
BOUNDS = ((SIDEBAR_MIN, 300), (360, 100_000), (TREE_MIN, 560))
"""(least, most) pixels of each panel when the shares place them."""
STRETCH = (1, 4, 2)
"""How Qt spreads a change of the splitter's width before the shares are applied again."""
SAME_PX = 8
"""Saved panel widths within this many pixels of the shares' are the shares (not a drag)."""


def panel_widths(width: int, tree_shown: bool = True) -> list[int]:
    """The widths (pixels) of [sidebar, messages, tree] for a window ``width`` pixels wide:
    each panel's share within its bounds, the messages taking what is left. With the tree
    panel hidden its share goes to the messages. Raises nothing; a width too small for the
    bounds gives the messages less than their least width."""
    side = min(max(int(width * SHARES[0]), BOUNDS[0][0]), BOUNDS[0][1])
    tree = min(max(int(width * SHARES[2]), BOUNDS[2][0]), BOUNDS[2][1]) if tree_shown else 0
    return [side, max(0, width - side - tree), tree]


def shared_widths(total: int, shares: tuple[float, float], tree_shown: bool = True) -> list[int]:
    """The widths (pixels) of [sidebar, messages, tree] in ``total`` pixels for a sidebar and
    a tree panel of ``shares`` (fractions of the width, e.g. set by a drag), each at least its
    least width (``SIDEBAR_MIN``, ``TREE_MIN``), the messages taking what is left."""
    side = max(SIDEBAR_MIN, round(total * shares[0]))
    tree = max(TREE_MIN, round(total * shares[1])) if tree_shown else 0
    return [side, max(0, total - side - tree), tree]


class WindowLayout(QObject):
    """Sizes ``window`` and its ``splitter`` from ``settings.window_layout`` (or the shares)
    and saves them back with ``save``. Whenever the splitter is resized the panels are placed
    again: by ``SHARES`` (``panel_widths``) until the user drags a handle, then by the shares
    the drag left (``shared_widths``)."""

    def __init__(self, window: QMainWindow, splitter: QSplitter, settings: SettingsModel):
        super().__init__(window)
        self.window, self.splitter, self.settings = window, splitter, settings
        self.dragged: tuple[float, float] | None = None  # (sidebar, tree) shares a drag set; None: SHARES
        splitter.splitterMoved.connect(lambda _pos, _i: self._remember_drag())
        splitter.installEventFilter(self)
        splitter.widget(2).installEventFilter(self)
        for i, stretch in enumerate(STRETCH):
            splitter.setStretchFactor(i, stretch)
        splitter.setChildrenCollapsible(False)
        splitter.widget(0).setMinimumWidth(SIDEBAR_MIN)
        splitter.widget(2).setMinimumWidth(TREE_MIN)

    def restore(self) -> None:
        """The saved size and panel widths, else ``DEFAULT_SIZE`` and the shares."""
        saved = self.settings.window_layout or {}
        if saved:
            self.window.resize(saved["width"], saved["height"])
            panels = list(saved["panels"])
            if not panels[2]:  # saved while the tree panel was hidden: its share when shown
                panels[2] = panel_widths(saved["width"])[2]
            default = panel_widths(sum(panels) + self._handles(3))
            if any(abs(a - b) > SAME_PX for a, b in zip(panels, default, strict=True)):
                self.dragged = (panels[0] / sum(panels), panels[2] / sum(panels))
            self.splitter.setSizes(panels)
            return
        self.window.resize(*DEFAULT_SIZE)
        self.splitter.setSizes(panel_widths(DEFAULT_SIZE[0]))

    def fit(self, width: int) -> None:
        """Place the panels by their shares for a window ``width`` pixels wide (a resize by
        a program, e.g. a test or the screenshots, that wants the first-start layout)."""
        self.dragged = None
        self.splitter.setSizes(panel_widths(width))

    def _handles(self, panels: int) -> int:
        return max(0, panels - 1) * self.splitter.handleWidth()

    def _remember_drag(self) -> None:
        sizes = self.splitter.sizes()
        if len(sizes) == 3 and sum(sizes) > 0 and sizes[2]:
            self.dragged = (sizes[0] / sum(sizes), sizes[2] / sum(sizes))

    def place(self, width: int | None = None) -> None:
        """Place the panels by the shares (``SHARES`` or a drag's) in a splitter ``width``
        pixels wide (None: its present width)."""
        if self.splitter.count() != 3:
            return
        width = self.splitter.width() if width is None else width
        tree_shown = not self.splitter.widget(2).isHidden()
        total = width - self._handles(3 if tree_shown else 2)
        if self.dragged is None:
            sizes = panel_widths(width, tree_shown)
            sizes[1] = max(0, total - sizes[0] - sizes[2])
        else:
            sizes = shared_widths(total, self.dragged, tree_shown)
        if total > 0 and sizes != self.splitter.sizes():
            self.splitter.setSizes(sizes)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 - Qt override: keep the shares
        kind = event.type()
        if watched is self.splitter and kind == QEvent.Type.Resize:
            self.place(event.size().width())
        elif watched is self.splitter.widget(2) and kind in (QEvent.Type.Show, QEvent.Type.Hide):
            self.place()  # the tree panel shown again gets its share back
        return False

    def save(self) -> None:
        """Put the window's size and the panels' widths in the settings (saved with them)."""
        size = self.window.size()
        sizes = self.splitter.sizes()
        if size.width() < 200 or size.height() < 200 or len(sizes) != 3:
            return
        self.settings.update(save=False, window_layout={
            "width": size.width(), "height": size.height(), "panels": [int(v) for v in sizes]})
