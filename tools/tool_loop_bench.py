"""A 5-step tool loop through ``branchwise serve``, each step restored: ``python -m tools.tool_loop_bench``.

The default model's weights with Qwen3's chat template (tests/data/tool_templates; SmolLM2's
own template has no tool support), written with gguf's ``gguf_new_metadata`` into a
temporary folder. An ``ApiServer`` (in this process, with a prefix store in that folder)
answers the official ``openai`` client:

* steps 1-4: ``tool_choice: "required"`` (the schema grammar forces a call), the call goes
  back as the assistant message the client received, then a tool result;
* step 5: ``tool_choice: "none"``, the final answer.

For each step it prints the prompt tokens, the tokens restored (live context or prefix
store) and prefilled, and the engine's TTFT (request to first token, restore and prefill
included), then the same prompt (the same token ids) on a second engine with no store and
no live context: what a cold prefill costs. ``new`` is what this step adds to the last
step's prompt and reply: the tool result and its template tokens. Prints the load average
before and after (the machine is shared: the figures are only as quiet as it was).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "data" / "tool_templates" / "Qwen-Qwen3-0.6B.jinja"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                                          "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
RESULTS = ["Oslo: 4 degrees C, light rain, wind 6 m/s from the north-west.",
           "Bergen: 7 degrees C, heavy rain, wind 11 m/s from the west; rain for the next three days.",
           "The sum is 11.",
           "Trondheim: -2 degrees C, snow showers, wind 3 m/s from the east."]
QUESTION = ("I am planning a trip through Norway. Check the weather in Oslo, Bergen and Trondheim in Celsius, "
            "and add up the days I will spend there (4 and 7), then tell me where to go first.")


def tool_model(folder: Path, source: Path | None = None, template: Path = TEMPLATE,
               control_tokens: dict[int, str] | None = None) -> Path:
    """A copy of ``source`` (default: the embedded model) in ``folder`` with the chat
    template ``template`` (default Qwen3's, ``TEMPLATE``, which has tool support), written by
    gguf's ``gguf_new_metadata``. ``control_tokens`` renames vocabulary entries (id -> text;
    SmolLM2's ids 3-16 are unused control tokens), so a template's markers such as Mistral's
    ``[TOOL_CALLS]`` are one control token, as in the models that template belongs to.
    Used by this bench and the tool tests.

    Raises:
        RuntimeError: gguf_new_metadata failed (its stderr in the message).
    """
    from engine.model_file import default_model_path

    out = folder / f"smollm2-{Path(template).stem}.gguf"
    if control_tokens:
        _copy_with_tokens(Path(source or default_model_path()), out, Path(template), control_tokens)
        return out
    r = subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(source or default_model_path()),
                        str(out), "--chat-template-file", str(template), "--force"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"gguf_new_metadata failed: {r.stderr.strip()}")
    return out


def _copy_with_tokens(source: Path, out: Path, template: Path, control_tokens: dict[int, str]) -> None:
    """``source`` to ``out`` with ``template`` and the vocabulary entries ``control_tokens``
    renamed (their type set to control), through gguf_new_metadata's own copy."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source), "r")
    tokens = list(reader.get_field(gguf.Keys.Tokenizer.LIST).contents())
    types = list(reader.get_field(gguf.Keys.Tokenizer.TOKEN_TYPE).contents())
    for tid, text in control_tokens.items():
        tokens[tid], types[tid] = text, int(gguf.TokenType.CONTROL)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    copy_with_new_metadata(reader, writer, {
        gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template.read_text("utf-8")),
        gguf.Keys.Tokenizer.LIST: MetadataDetails(gguf.GGUFValueType.ARRAY, tokens, sub_type=gguf.GGUFValueType.STRING),
        gguf.Keys.Tokenizer.TOKEN_TYPE: MetadataDetails(gguf.GGUFValueType.ARRAY, types,
                                                        sub_type=gguf.GGUFValueType.INT32),
    }, [])


def run(threads: int, max_tokens: int) -> dict:
    """The loop's rows (see the module docstring) and the load averages around it."""
    import httpx
    import openai

    from app.serve.server import ApiServer
    from engine.core import Engine
    from engine.settings import EngineSettings, SamplingParams
    from storage.prefix_store import PrefixStore

    out: dict = {"load_before": [round(x, 2) for x in os.getloadavg()], "rows": []}
    with tempfile.TemporaryDirectory(prefix="bw-tool-loop-") as tmp:
        model = tool_model(Path(tmp))
        settings = EngineSettings(n_ctx=4096, n_threads=threads)
        warm = Engine(model, settings, PrefixStore(Path(tmp) / "kv.sqlite3"))
        cold = Engine(model, settings, None)
        seen: list = []  # (messages as the engine got them, stats) of each served request
        generate = warm.generate

        def recording(messages, *args, **kwargs):
            result = generate(messages, *args, **kwargs)
            seen.append((list(messages), kwargs.get("tools"), kwargs.get("grammar"), result.stats))
            return result

        warm.generate = recording
        server = ApiServer(warm, "smollm2-tools", port=0)
        server.start()
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600,
                               http_client=httpx.Client(trust_env=False))
        history: list[dict] = [{"role": "user", "content": QUESTION}]
        try:
            last_total = None
            for step in range(5):
                choice = "required" if step < 4 else "none"
                r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, tool_choice=choice,
                                                   temperature=0, max_tokens=max_tokens)
                messages, tools, grammar, stats = seen[-1]
                cold_stats = cold.generate(messages, SamplingParams(temperature=0, max_tokens=1), use_cache=False,
                                           tools=tools, grammar=grammar, snapshot=False).stats
                msg = r.choices[0].message
                out["rows"].append({
                    "step": step + 1, "tool_choice": choice, "finish": r.choices[0].finish_reason,
                    "prompt": stats.prompt_tokens, "restored": stats.restored_tokens,
                    "prefilled": stats.prefilled_tokens, "new": stats.prompt_tokens - last_total if last_total else None,
                    "ttft_ms": round(stats.ttft_ms, 1), "cold_prefilled": cold_stats.prefilled_tokens,
                    "cold_ttft_ms": round(cold_stats.ttft_ms, 1),
                    "call": msg.tool_calls[0].function.name if msg.tool_calls else None,
                })
                last_total = stats.prompt_tokens + stats.generated_tokens
                if step < 4:
                    history.append(msg.model_dump(exclude_none=True))
                    for call in msg.tool_calls or []:
                        history.append({"role": "tool", "tool_call_id": call.id, "content": RESULTS[step]})
        finally:
            server.stop()
            warm.close()
            cold.close()
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def table(out: dict) -> str:
    """The rows as the README's fixed-width table."""
    lines = [f"{'step':>4} {'tool_choice':>11} {'prompt':>6} {'restored':>8} {'prefilled':>9} {'new':>4} "
             f"{'TTFT ms':>8} {'cold TTFT ms':>12}"]
    for r in out["rows"]:
        lines.append(f"{r['step']:>4} {r['tool_choice']:>11} {r['prompt']:>6,} {r['restored']:>8,} "
                     f"{r['prefilled']:>9,} {r['new'] if r['new'] is not None else '-':>4} {r['ttft_ms']:>8,.0f} "
                     f"{r['cold_ttft_ms']:>12,.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=80)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    out = run(args.threads, args.max_tokens)
    print(json.dumps(out, indent=1) if args.json else table(out))
    if not args.json:
        print(f"load average before {out['load_before']}, after {out['load_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
