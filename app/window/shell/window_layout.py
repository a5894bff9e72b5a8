"""The window's three panels side by side, sized for the window's width and remembered.

The sidebar (chats), the messages and the tree panel sit in one ``QSplitter``. Each panel
gets a share of the width (``SHARES``) within its bounds, so at 800 px the messages keep
room for their buttons and at 1600 px the tree panel is wide enough for a branched tree;
a drag of a splitter handle moves the shares, and growing or shrinking the window then
spreads the change by the splitter's stretch factors (the tree panel grows with the window;
it is not a fixed width). The window's size and the panels' widths are saved in the
settings (``window_layout``) when the window closes and applied at the next start.
"""

from __future__ import annotations

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
"""How a change of the window's width is spread over the panels (the splitter's stretch)."""


def panel_widths(width: int, tree_shown: bool = True) -> list[int]:
    """The widths (pixels) of [sidebar, messages, tree] for a window ``width`` pixels wide:
    each panel's share within its bounds, the messages taking what is left. With the tree
    panel hidden its share goes to the messages. Raises nothing; a width too small for the
    bounds gives the messages less than their least width."""
    side = min(max(int(width * SHARES[0]), BOUNDS[0][0]), BOUNDS[0][1])
    tree = min(max(int(width * SHARES[2]), BOUNDS[2][0]), BOUNDS[2][1]) if tree_shown else 0
    return [side, max(0, width - side - tree), tree]


class WindowLayout:
    """Sizes ``window`` and its ``splitter`` from ``settings.window_layout`` (or the shares)
    and saves them back with ``save``."""

    def __init__(self, window: QMainWindow, splitter: QSplitter, settings: SettingsModel):
        self.window, self.splitter, self.settings = window, splitter, settings
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
            self.splitter.setSizes(panels)
            return
        self.window.resize(*DEFAULT_SIZE)
        self.splitter.setSizes(panel_widths(DEFAULT_SIZE[0]))

    def fit(self, width: int) -> None:
        """Place the panels by their shares for a window ``width`` pixels wide (a resize by
        a program, e.g. a test or the screenshots, that wants the first-start layout)."""
        self.splitter.setSizes(panel_widths(width))

    def save(self) -> None:
        """Put the window's size and the panels' widths in the settings (saved with them)."""
        size = self.window.size()
        sizes = self.splitter.sizes()
        if size.width() < 200 or size.height() < 200 or len(sizes) != 3:
            return
        self.settings.update(save=False, window_layout={
            "width": size.width(), "height": size.height(), "panels": [int(v) for v in sizes]})
