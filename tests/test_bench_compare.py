"""The side-by-side bench table (app/bench/compare.py): what it prints from a set of
figures, with and without llama-server. No model: the figures are given."""

from __future__ import annotations

import copy

from app.bench.compare import format_compare


def _lookup(plain: float, lookup: float, same: bool) -> dict:
    return {"prompt_tokens": 1600, "generated": 96, "plain_tok_s": plain, "lookup_tok_s": lookup,
            "speedup": round(lookup / plain, 2), "drafted": 80, "accepted": 70, "same_reply": same}


RESULT = {
    "model": "m.gguf", "cpu_count": 2, "threads": 1, "repeats": 3, "load_before": [0.5], "load_after": [0.7],
    "interleaved": True,
    "prompt_tokens": {"speed": 536, "quote": 1600, "chat": 30, "restore": 1559},
    "branchwise": {
        "restore": {"tokens": 1559, "kv_mb": 35.9, "total_ms": 30.0, "cold_ms": 120.0, "lookup_ms": 1.0,
                    "map_ms": 9.0, "copy_ms": 11.0, "set_data_ms": 9.0, "pieces": 5},
        "snapshot": {"median_ms": 45.0},
        "switch": {"tokens": 1650, "kept": 1536, "copied": 114, "source": "store", "median_ms": 1.5, "whole_ms": 31.0},
        "prefill": {"tokens": 536, "tok_s": 80.0}, "decode": {"tokens": 96, "tok_s": 31.0},
        "quote": _lookup(30.0, 48.0, True), "chat": _lookup(32.0, 32.0, False),
    },
    "llama_server": {
        "slots": {"restore_ms": 20.0, "cold_restore_ms": 100.0, "save_ms": 50.0, "repack": "off",
                  "repack_note": "--no-repack, as Branchwise"},
        "plain": {"speed": {"prefill_tok_s": 100.0, "decode_tok_s": 40.0}, "quote": {"decode_tok_s": 30.0},
                  "chat": {"decode_tok_s": 32.0}},
        "lookup": {"quote": {"decode_tok_s": 60.0, "drafted": 90, "accepted": 60}, "chat": {"decode_tok_s": 32.0}},
    },
}


def _row(table: str, start: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(start))


def test_each_figure_stands_beside_llama_servers_with_their_ratio():
    t = format_compare(RESULT)
    assert "Branchwise" in t.splitlines()[2] and "llama-server" in t.splitlines()[2]
    warm = _row(t, "restore, warm (1,559 tokens, 35.9 MB)")
    assert "30.0 ms" in warm and "20.0 ms" in warm and "1.50×" in warm
    assert "1.20×" in _row(t, "restore, cold") and "0.90×" in _row(t, "first-turn snapshot")
    assert "0.80×" in _row(t, "prefill (536 tokens)") and "0.78×" in _row(t, "decode, plain (96 tokens)")
    quote = _row(t, "decode, lookup: quote")
    assert "48.0 tok/s" in quote and "60.0 tok/s" in quote and "0.80×" in quote
    assert "1.60× plain" in quote and "accepted 70/80" in quote and "same reply as plain: yes" in quote
    assert "theirs 60/90" in quote
    assert "same reply as plain: NO" in _row(t, "decode, lookup: plain chat")
    assert "-t/-tb 1" in t and "ngram-simple" in t
    assert "Both decode at temperature 0 with repeat penalty 1.1 over the last 64 tokens." in t  # one sampler chain
    assert "Each Branchwise run ran next to the same run of llama-server's." in t


def test_without_llama_server_only_the_branchwise_column_is_printed():
    r = copy.deepcopy(RESULT)
    r["llama_server"] = None
    t = format_compare(r)
    assert "llama-server" not in t.splitlines()[2] and "×" not in _row(t, "restore, warm")
    assert "30.0 ms" in _row(t, "restore, warm") and "1.60× plain" in _row(t, "decode, lookup: quote")
    assert "pass --llama-server PATH" in t


def test_a_llama_server_that_cannot_run_is_named_in_one_line():
    r = copy.deepcopy(RESULT)
    r["llama_server"] = {"error": "llama-server died by signal 4 at start-up; see /tmp/x/llama-server.log"}
    t = format_compare(r)
    assert "llama-server: not compared: llama-server died by signal 4 at start-up; see /tmp/x/llama-server.log" in t
    assert "31.0 tok/s" in _row(t, "decode, plain (96 tokens)")


def test_the_breakdown_and_the_branch_switch_are_spelled_out():
    t = format_compare(RESULT)
    assert ("Restore breakdown (warm): lookup 1.0 ms, map 9.0 ms, check+copy of the first of 5 pieces 11.0 ms "
            "(the others while llama.cpp reads), llama_state_seq_set_data 9.0 ms.") in t
    assert ("Branch switch (two branches of the conversation above, sharing 1,536 tokens up to a block start): "
            "1.5 ms to have 1,650 tokens in place, 114 of them copied from the store; a whole restore of the same "
            "tokens: 31.0 ms.") in t
