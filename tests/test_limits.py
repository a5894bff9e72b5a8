"""Every number a person or a client gives is checked against a bound before anything is
allocated (engine/limits.py), with the same bounds on the command line and in
``branchwise serve``; a value out of range is one line, never a traceback or a crash."""

from __future__ import annotations

import math
import os

import pytest
from measure import PEAK_RSS_LIMIT_KB, one_line, run_measured

from app.serve.protocol import ApiError, parse_chat_request
from engine import limits


@pytest.mark.parametrize("args, words", [
    (("chat", "--ctx-size", "99999999999999999999", "hi"), "argument --ctx-size: must be between 256 and 16,777,216"),
    (("chat", "--threads", "100000", "hi"), "argument --threads: must be at most"),
    (("chat", "--top-p", "5", "hi"), "argument --top-p: must be between 0 and 1; got 5"),
    (("chat", "--repeat-penalty", "nan", "hi"), "argument --repeat-penalty: must be a finite number"),
    (("chat", "--repeat-penalty", "0", "hi"), "argument --repeat-penalty: must be more than 0 and at most 10"),
    (("chat", "--temperature", "inf", "hi"), "argument --temperature: must be a finite number"),
    (("chat", "--min-p", "-0.5", "hi"), "argument --min-p: must be between 0 and 1"),
    (("chat", "--top-k", "99999999999999999999", "hi"), "argument --top-k: must be between 0 and"),
    (("chat", "--max-tokens", "99999999999999999999", "hi"), "argument --max-tokens: must be at least 1 and at most"),
    (("chat", "--seed", "99999999999999999999999", "hi"), "argument --seed: must be between"),
    (("chat", "--cache-budget", "inf", "hi"), "argument --cache-budget: the size must be at most 1 EiB"),
    (("chat", "--parent", "99999999999999999999", "hi"), "argument --parent: must be at least 1 and at most"),
    (("chat", "--conversation", "-3", "hi"), "argument --conversation: must be at least 1 and at most"),
    (("regenerate", "99999999999999999999"), "argument message_id: must be at least 1 and at most"),
    (("conversations", "show", "99999999999999999999"), "argument id: must be at least 1 and at most"),
    (("conversations", "delete", "99999999999999999999"), "argument id: must be at least 1 and at most"),
    (("cache", "stats", "--cache-budget", "1e400"), "argument --cache-budget: the size must be at most"),
    (("serve", "--port", "99999"), "argument --port: must be between 0 and 65,535; got 99,999"),
])
def test_an_out_of_range_flag_is_one_line_and_exit_2_with_little_memory(tmp_path, args, words):
    r, peak_kb = run_measured(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    assert words in one_line(r)
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb
    assert not (tmp_path / "data" / "chats.sqlite3").exists()  # nothing was opened


def test_a_bad_budget_in_the_environment_is_one_line(tmp_path):
    r, _ = run_measured(tmp_path, "cache", "stats", env={"BRANCHWISE_CACHE_BUDGET": "inf"})
    assert r.returncode == 1 and "BRANCHWISE_CACHE_BUDGET: the size must be at most 1 EiB" in one_line(r)


def test_a_context_past_four_times_the_trained_length_is_refused_before_loading(tmp_path):
    r, peak_kb = run_measured(tmp_path, "chat", "--ctx-size", "16000000", "hi")
    assert r.returncode == 1
    line = one_line(r)
    assert "A context of 16,000,000 tokens is too large for SmolLM2-135M-Instruct.Q4_1.gguf" in line
    assert "trained for 8,192 tokens" in line and "(32,768)" in line
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb
    assert not (tmp_path / "data" / "chats.sqlite3").exists() or "hi" not in (
        tmp_path / "data" / "chats.sqlite3").read_bytes().decode("latin-1")


def _header_only_gguf(path, context_length: int, layers: int, kv_heads: int, embd: int) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("huge")
    w.add_context_length(context_length)
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_head_count(kv_heads)
    w.add_head_count_kv(kv_heads)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def test_a_context_larger_than_this_machines_memory_is_refused_before_loading(tmp_path):
    model = tmp_path / "huge.gguf"
    # 1,000 layers x 64 KV heads x 128 per head x 2 bytes x (K + V) = 32 MiB per token
    _header_only_gguf(model, context_length=1 << 20, layers=1000, kv_heads=64, embd=8192)
    r, peak_kb = run_measured(tmp_path, "chat", "--model", model, "--ctx-size", "65536", "hi")
    assert r.returncode == 1
    line = one_line(r)
    assert "A context of 65,536 tokens needs 2,000.0 GiB of memory for huge.gguf's KV cache" in line
    assert "(32,768,000 bytes per token)" in line and "GiB available" in line
    assert peak_kb < PEAK_RSS_LIMIT_KB, peak_kb


def test_the_context_rules_with_figures():
    assert limits.context_problem(8192, 8192, 23040, 8 << 30, "m") == ""
    assert limits.context_problem(32768, 8192, 0, 0, "m") == ""  # 4 x trained is allowed
    assert "trained for 8,192" in limits.context_problem(32769, 8192, 0, 0, "m")
    assert limits.context_problem(10_000_000, 0, 0, 0, "m") == ""  # nothing known: llama.cpp judges
    tight = limits.context_problem(100_000, 0, 1 << 20, 10 << 30, "m")  # 1 MiB a token, 10 GiB free
    assert "needs 97.7 GiB" in tight and "at most about 10,240" in tight


def test_threads_are_bounded_by_the_cores():
    cap = (os.cpu_count() or 1) * 4
    assert limits.check_threads(0) == 0 and limits.check_threads(cap) == cap
    with pytest.raises(limits.LimitError, match=f"at most {cap} on this machine"):
        limits.check_threads(cap + 1)


CLI_FLAG = {"temperature": "--temperature", "top_p": "--top-p", "min_p": "--min-p",
            "repeat_penalty": "--repeat-penalty", "top_k": "--top-k", "seed": "--seed", "max_tokens": "--max-tokens"}


@pytest.mark.parametrize("name", sorted(limits.SAMPLING))
def test_the_cli_and_the_api_accept_and_refuse_the_same_values(name):
    from app.cli import build_parser

    bound = limits.SAMPLING[name]
    parser = build_parser()
    probes = [bound.lo, bound.hi, bound.hi + 1, bound.lo - 1, (bound.lo + bound.hi) / 2]
    if not bound.integer:
        probes += [math.nan, math.inf, -math.inf]
    for value in probes:
        if bound.integer and isinstance(value, float):
            value = int(value)
        api_ok = cli_ok = True
        try:
            parse_chat_request({"messages": [{"role": "user", "content": "x"}], name: value})
        except ApiError as exc:
            api_ok = False
            assert exc.status == 400 and exc.param == name
        try:
            parser.parse_args(["chat", CLI_FLAG[name], str(value), "hi"])
        except SystemExit:
            cli_ok = False
        assert api_ok == cli_ok, (name, value)
        inside = math.isfinite(value) and (value > bound.lo if bound.lo_open else value >= bound.lo) and \
            value <= bound.hi
        assert api_ok == inside, (name, value)


def test_the_api_refuses_what_the_cli_used_to_accept():
    for field, value in (("top_p", 5), ("repeat_penalty", math.nan), ("repeat_penalty", 0)):
        with pytest.raises(ApiError) as err:
            parse_chat_request({"messages": [{"role": "user", "content": "x"}], field: value})
        assert err.value.param == field and err.value.code == "invalid_value"
    with pytest.raises(ApiError) as err:
        parse_chat_request({"messages": [{"role": "user", "content": "x"}], "top_k": "5"})
    assert err.value.code == "invalid_type" and "'top_k' must be a whole number, not str" in err.value.message
