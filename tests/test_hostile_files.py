"""Model paths that are not regular files are refused before any read (issue #16.1)."""

from __future__ import annotations

import os
import struct
import sys
import threading

import pytest

from engine.errors import ModelLoadError
from engine.model_file import check_gguf


def _check_in_thread(path) -> tuple[bool, BaseException | None]:
    """Run check_gguf on a daemon thread: (finished, error). A blocking read would leave
    the thread running; the 30 s join only keeps a regression from hanging the suite."""
    out: list[BaseException | None] = []

    def run():
        try:
            check_gguf(path)
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    return (not t.is_alive()), (out[0] if out else None)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_model_path_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    finished, err = _check_in_thread(fifo)
    assert finished, "check_gguf blocked on a FIFO"
    assert isinstance(err, ModelLoadError)
    assert "named pipe (FIFO)" in str(err) and str(fifo) in str(err)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_character_device_is_refused():
    finished, err = _check_in_thread("/dev/zero")
    assert finished
    assert isinstance(err, ModelLoadError)
    assert "a device" in str(err)


def test_regular_gguf_header_passes_and_other_files_get_words(tmp_path):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    assert check_gguf(good) == good.resolve()
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"hello world, this is not a model file")
    with pytest.raises(ModelLoadError, match="not a GGUF model file"):
        check_gguf(bad)
    with pytest.raises(ModelLoadError, match="is a folder"):
        check_gguf(tmp_path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        check_gguf(tmp_path / "missing.gguf")


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need privileges on Windows")
def test_symlink_to_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "model.gguf"
    link.symlink_to(fifo)
    finished, err = _check_in_thread(link)
    assert finished and isinstance(err, ModelLoadError)
