"""Start the desktop app: ``run(data_dir, model_path)`` is what ``branchwise`` (no subcommand) calls."""

from __future__ import annotations

import logging
import logging.handlers
import sys
import traceback
from pathlib import Path

log = logging.getLogger(__name__)


def setup_logging(data_dir: Path) -> Path:
    """Log to ``<data_dir>/logs/app.log`` (rotated at 1 MB, 3 kept); return the file's path."""
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / "app.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s app[%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return path


def _quit_after_screenshot(app, window, path: Path) -> None:
    from PySide6.QtCore import QTimer

    def shoot(*_args) -> None:
        QTimer.singleShot(300, lambda: (window.grab().save(str(path)), app.quit()))

    window.client.loaded.connect(shoot)
    window.client.load_failed.connect(shoot)
    QTimer.singleShot(60_000, shoot)


def ask_foreign_folder(message: str) -> bool:
    """Ask whether to use a data folder that already holds other files (a modal
    question; True for "Use it"). ``message`` is the refusal the command line prints."""
    from PySide6.QtWidgets import QMessageBox

    answer = QMessageBox.question(
        None, "Branchwise",
        f"{message}\n\nUse this folder anyway? Branchwise would add its files there and "
        "never change or delete any other file in it.",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
    return answer == QMessageBox.StandardButton.Yes


def open_data_dir(data_dir: str | None, ask=ask_foreign_folder):
    """The data folder for the window (``storage.paths.resolve_data_dir``): a folder that
    holds other files and no Branchwise database is used only if ``ask(message)`` says
    so. Returns the folder's Path, or None when the user declined.

    Raises:
        DataDirError: the folder cannot be created or written.
    """
    from storage.errors import ForeignDataDirError
    from storage.paths import resolve_data_dir

    try:
        return resolve_data_dir(data_dir)
    except ForeignDataDirError as exc:
        if not ask(str(exc)):
            return None
        return resolve_data_dir(data_dir, allow_foreign=True)


def run(data_dir: str | None, model_path: str | None, screenshot: str | None = None,
        ask=ask_foreign_folder) -> int:
    """Open the window on ``data_dir`` (None: ``BRANCHWISE_DATA_DIR`` or the per-user folder)
    with ``model_path`` (None: the last model used, else the embedded default). Returns the
    exit code: 0 after a normal quit, 2 when the data folder cannot be used or the user
    declined a folder that holds other files (``ask``, see :func:`open_data_dir`), 130 or
    143 when Ctrl+C or SIGTERM closed the window (it closes as its close button does).

    With ``screenshot`` (a PNG path) the window saves a picture of itself once the model
    has loaded (or failed to, or after 60 s) and quits: for installer checks."""
    from PySide6.QtWidgets import QApplication, QMessageBox

    from storage.errors import DataDirError, StorageError

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Branchwise")
    app.setOrganizationName("Branchwise")
    app.setApplicationDisplayName("Branchwise")
    app.setDesktopFileName("branchwise")  # so Wayland matches the window to branchwise.desktop
    try:
        folder = open_data_dir(data_dir, ask)
    except DataDirError as exc:
        QMessageBox.critical(None, "Branchwise", str(exc))
        return 2
    if folder is None:
        return 2
    log_path = setup_logging(folder)

    from app.window.shell.main_window import MainWindow

    try:
        window = MainWindow(folder, model_path)
    except StorageError as exc:
        log.error("cannot open the chat database:\n%s", traceback.format_exc())
        QMessageBox.critical(None, "Branchwise", f"Branchwise cannot open its chat database: {exc}")
        return 2

    def excepthook(kind, value, tb) -> None:
        log.error("unexpected error:\n%s", "".join(traceback.format_exception(kind, value, tb)))
        try:
            window.banner.show_message(
                f"Something went wrong: {value}. Details are in {log_path}.", "error")
        except RuntimeError:
            pass

    sys.excepthook = excepthook
    window.show()
    if screenshot:
        _quit_after_screenshot(app, window, Path(screenshot))
    from app.window.shell.lifetime import SignalStop

    signals = SignalStop(window)  # Ctrl+C, kill: close the window as its close button does
    try:
        code = app.exec()
    finally:
        window.shutdown()
        signals.restore()
        sys.excepthook = sys.__excepthook__
    return 128 + signals.signum if signals.signum else code
