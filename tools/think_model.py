"""The default model made to think, for the reasoning bench and screenshots (and the tests).

SmolLM2 never thinks by itself, so the ``<think>…</think>answer`` shape is forced: a copy of
the model whose chat template opens ``<think>`` in the generation prompt (as DeepSeek-R1's
does), written in place with the same length, plus a GBNF grammar (``llama_cpp.LlamaGrammar``,
read by the engine from ``engine.reasoning.GRAMMAR_ENV``) that makes every reply
``thinking\\n</think>\\n\\nanswer``.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

THINK_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m.role != 'system' %}{{ '<|im_start|>system\nYou are a "
    "helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{ '<|im_start|>' "
    "+ m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n<think>\n' }}{% endif %}"
)
GRAMMAR = r'''
root ::= thought "\n</think>\n\n" answer
thought ::= [A-Za-z ,.]{12,60}
answer ::= [A-Za-z ,.]{4,40}
'''
GGUF_STRING = 8  # gguf.h enum gguf_type: GGUF_TYPE_STRING
TEMPLATE_KEY = "tokenizer.chat_template"


def think_copy(src: Path, dst: Path, template: str = THINK_TEMPLATE) -> Path:
    """Copy the GGUF ``src`` to ``dst`` with its chat template replaced by ``template``
    (padded with a Jinja comment to the old template's length, so nothing else moves).

    Raises:
        ValueError: ``src`` has no chat template, or ``template`` is longer than its own.
    """
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        head = f.read(8 << 20)
        key = TEMPLATE_KEY.encode()
        needle = struct.pack("<Q", len(key)) + key + struct.pack("<I", GGUF_STRING)
        at = head.find(needle)
        if at < 0:
            raise ValueError(f"{src} has no {TEMPLATE_KEY}")
        at += len(needle)
        (n,) = struct.unpack_from("<Q", head, at)
        pad = n - len(template.encode()) - len("{##}")
        if pad < 0:
            raise ValueError(f"the template is longer than the {n} bytes of {src}'s own")
        f.seek(at + 8)
        f.write((template + "{#" + "." * pad + "#}").encode())
    return Path(dst)


def grammar_file(folder: Path, grammar: str = GRAMMAR) -> Path:
    """``grammar`` (GBNF text, :data:`GRAMMAR` by default) written to ``folder/think.gbnf``;
    returns its path."""
    path = Path(folder) / "think.gbnf"
    path.write_text(grammar)
    return path
