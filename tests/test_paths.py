"""Tests of the data folder choice (storage/paths.py)."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest

from storage import paths
from storage.errors import DataDirError, StorageError
from storage.paths import CHATS_DB, ENV_VAR, KVCACHE_DB, resolve_data_dir


@pytest.fixture
def platform_calls() -> list[tuple[tuple, dict]]:
    """The arguments platformdirs.user_data_dir was called with."""
    return []


@pytest.fixture
def default_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform_calls) -> Path:
    """Point platformdirs at a folder under tmp_path; unset BRANCHWISE_DATA_DIR."""
    default = tmp_path / "platform" / "Branchwise"

    def fake_user_data_dir(*args, **kwargs) -> str:
        platform_calls.append((args, kwargs))
        return str(default)

    monkeypatch.setattr(paths.platformdirs, "user_data_dir", fake_user_data_dir)
    monkeypatch.delenv(ENV_VAR, raising=False)
    return default


def test_cli_value_wins_over_env(tmp_path: Path, default_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "from-env"))
    got = resolve_data_dir(str(tmp_path / "from-cli"))
    assert got == tmp_path / "from-cli"
    assert got.is_dir()
    assert not (tmp_path / "from-env").exists()
    assert not default_dir.exists()


def test_env_wins_over_default(tmp_path: Path, default_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "from-env"))
    assert resolve_data_dir(None) == tmp_path / "from-env"
    assert (tmp_path / "from-env").is_dir()
    assert not default_dir.exists()


def test_blank_values_count_as_not_given(tmp_path: Path, default_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "from-env"))
    assert resolve_data_dir("") == tmp_path / "from-env"
    monkeypatch.setenv(ENV_VAR, "  ")
    assert resolve_data_dir("  ") == default_dir


def test_default_is_the_platform_user_data_dir(default_dir: Path, platform_calls) -> None:
    got = resolve_data_dir(None)
    assert got == default_dir
    assert got.is_dir()
    assert platform_calls == [(("Branchwise",), {"appauthor": False})]


def test_nested_relative_and_home_paths(tmp_path: Path, default_dir: Path, monkeypatch) -> None:
    assert resolve_data_dir(str(tmp_path / "a" / "b" / "c")).is_dir()
    monkeypatch.chdir(tmp_path)
    assert resolve_data_dir("relative/dir") == tmp_path / "relative" / "dir"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir("~/bw") == tmp_path / "home" / "bw"


def test_existing_folder_is_reused(tmp_path: Path, default_dir: Path) -> None:
    target = tmp_path / "data"
    target.mkdir()
    (target / CHATS_DB).write_bytes(b"keep me")
    assert resolve_data_dir(str(target)) == target
    assert (target / CHATS_DB).read_bytes() == b"keep me"
    assert sorted(p.name for p in target.iterdir()) == [CHATS_DB]  # the probe file is gone


def test_a_file_in_the_way(tmp_path: Path, default_dir: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder")
    with pytest.raises(DataDirError) as info:
        resolve_data_dir(str(blocker))
    message = str(info.value)
    assert str(blocker) in message
    assert "set by --data-dir" in message
    assert "a file with that name already exists" in message
    assert isinstance(info.value, StorageError)


def test_a_folder_that_cannot_be_written(tmp_path: Path, default_dir: Path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "locked"))
    with pytest.raises(DataDirError) as info:
        resolve_data_dir(None)
    message = str(info.value)
    assert f"cannot use the data folder {tmp_path / 'locked'}" in message
    assert f"set by {ENV_VAR}" in message
    assert "permission denied" in message


def test_file_names() -> None:
    assert (CHATS_DB, KVCACHE_DB) == ("chats.sqlite3", "kvcache.sqlite3")
