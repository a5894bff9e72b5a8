"""A GBNF grammar that forces a tool call in the template's own syntax, valid by construction.

When a request sets ``tool_choice`` to ``"required"`` or names a function, the reply must
be a call. :func:`tool_call_grammar` builds a llama.cpp GBNF grammar whose only sentences
are calls in the :class:`engine.tool_calls.ToolFormat` of the model's template, with each
tool's arguments matching its JSON schema: the schema part is converted by
llama-cpp-python's ``SchemaConverter`` (``llama_cpp.llama_grammar``, the same converter
as ``LlamaGrammar.from_json_schema``), one converter for all tools so shared rules are
written once, wrapped in the syntax here. The engine samples with it
(``Engine.generate(grammar=...)``); what comes out parses with
:func:`engine.tool_calls.parse_reply`.

:func:`check_arguments` checks parsed arguments against a schema (for ``tool_choice:
"auto"``, where nothing constrains the model).
"""

from __future__ import annotations

import json
import re

from engine.tool_calls import ToolFormat

__all__ = ["MAX_PARALLEL_CALLS", "MAX_SCHEMA_DEPTH", "MAX_SCHEMA_REPEAT", "GrammarError", "check_arguments",
           "check_grammar", "tool_call_grammar"]


MAX_PARALLEL_CALLS = 4
"""Most calls one forced reply may hold: a small model under a grammar may otherwise
repeat calls until max_tokens."""


class GrammarError(ValueError):
    """A tool's schema cannot be turned into a grammar; ``str()`` names the tool."""


MAX_SCHEMA_DEPTH = 16
"""Most levels of nested objects and arrays a forced tool's schema may have: each level is
rules the grammar matcher walks at every token (a 200-level schema held the server for
minutes)."""
MAX_SCHEMA_REPEAT = 4096
"""Largest ``minLength``/``maxLength``/``minItems``/``maxItems`` a forced schema may set: the
converter writes a bounded repetition out in full (``minLength: 1e9`` would be a grammar of
a billion symbols)."""
_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def _check_schema_bounds(name: str, schema) -> None:
    """Refuse a schema deeper than :data:`MAX_SCHEMA_DEPTH` or with a repetition bound over
    :data:`MAX_SCHEMA_REPEAT`, and an empty ``enum`` (no value could match: llama.cpp's
    parser refuses the empty rule). Iterative, so no depth can exhaust the stack."""
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, list):
            stack.extend((item, depth) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"The parameters schema of the tool '{name}' is nested more than "
                               f"{MAX_SCHEMA_DEPTH} levels deep; Branchwise enforces at most {MAX_SCHEMA_DEPTH}.")
        for key in _REPEAT_KEYS:
            bound = node.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > MAX_SCHEMA_REPEAT:
                raise GrammarError(f"The parameters schema of the tool '{name}' sets {key} to {bound}; "
                                   f"Branchwise enforces at most {MAX_SCHEMA_REPEAT:,}.")
        if "enum" in node and isinstance(node["enum"], list) and not node["enum"]:
            raise GrammarError(f"The parameters schema of the tool '{name}' has an empty enum: no value can match it.")
        for key, value in node.items():
            if isinstance(value, (dict, list)) and key not in ("enum", "const", "default", "examples"):
                stack.append((value, depth + 1 if key in ("properties", "items", "prefixItems",
                                                           "additionalProperties") else depth))


def check_grammar(vocab, grammar: str) -> None:
    """Parse ``grammar`` (GBNF text) with llama.cpp's own parser, for the model whose
    vocabulary is ``vocab`` (``llama_cpp`` ``llama_vocab_p``), and free the result.

    llama-cpp-python adds a grammar sampler without looking whether llama.cpp could build
    it; a grammar llama.cpp refuses (an empty rule, left recursion, an undefined rule: a
    schema that refers to itself) then crashes the process at the first token.

    Raises:
        GrammarError: llama.cpp could not build a sampler from ``grammar``.
    """
    import llama_cpp  # noqa: PLC0415 - the engine process has it

    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        raise GrammarError("The tools' parameter schemas make a grammar llama.cpp cannot use (a schema that refers "
                           "to itself, or a rule that matches nothing); simplify the schemas.")
    llama_cpp.llama_sampler_free(sampler)


_JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
"""llama.cpp's own ``char`` rule (``common/json-schema-to-grammar.cpp``): no raw control characters."""


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _rule_name(name: str, i: int) -> str:
    return f"tool{i}-" + re.sub(r"[^A-Za-z0-9-]", "-", name)[:40]


def tool_call_grammar(fmt: ToolFormat, tools: list[dict], *, only: str | None = None, parallel: bool = True) -> str:
    """GBNF text whose sentences are one call (or, with ``parallel``, one or more) of
    ``tools`` (OpenAI function objects; ``only`` restricts to one name; at most
    :data:`MAX_PARALLEL_CALLS`) in syntax ``fmt``.

    Raises:
        GrammarError: a schema the converter refuses (the message names the tool), or
            ``only`` names no tool in the list.
    """
    from llama_cpp.llama_grammar import SchemaConverter  # noqa: PLC0415 - the engine process has it

    conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    fns = [t.get("function", t) for t in tools]
    if only is not None:
        fns = [f for f in fns if f.get("name") == only]
        if not fns:
            raise GrammarError(f"tool_choice names the function '{only}', which is not in 'tools'.")
    alts = []
    for i, fn in enumerate(fns):
        name = fn["name"]
        schema = fn.get("parameters") or {"type": "object"}
        rule = _rule_name(name, i)
        _check_schema_bounds(name, schema)
        try:
            schema = conv.resolve_refs(schema, "tool")
            args = conv.visit(schema, rule + "-args")
        except Exception as exc:  # the converter raises plain exceptions for unsupported schemas
            raise GrammarError(f"The parameters schema of the tool '{name}' cannot be enforced: {exc}") from exc
        alts.append((name, rule, args))
    if "char" in conv._rules:  # llama-cpp-python's rule lets raw control characters into strings: not JSON
        conv._rules["char"] = _JSON_CHAR
    lines = [conv.format_grammar()]
    calls = []
    for name, rule, args in alts:
        if fmt is ToolFormat.HARMONY:
            body = _literal("<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>") + " " + args
        else:
            key = "parameters" if fmt is ToolFormat.LLAMA3 else "arguments"
            head = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "' + key + '": '
            body = _literal(head) + " " + args + ' "}"' 
        lines.append(f"{rule}-call ::= {body}")
        calls.append(f"{rule}-call")
    lines.append("tool-call ::= " + " | ".join(calls))
    many = parallel and fmt is not ToolFormat.HARMONY and fmt is not ToolFormat.LLAMA3
    if fmt is ToolFormat.HERMES:
        one = '"<tool_call>\\n" tool-call "\\n</tool_call>"'
        root = f'{one} ("\\n" {one}){{0,{MAX_PARALLEL_CALLS - 1}}}' if many else one
    elif fmt is ToolFormat.MISTRAL:
        root = '"[TOOL_CALLS][" tool-call (", " tool-call){0,%d} "]"' % (MAX_PARALLEL_CALLS - 1) if many else '"[TOOL_CALLS][" tool-call "]"'
    elif fmt is ToolFormat.GENERIC:
        root = '"{\\"tool_calls\\": [" tool-call (", " tool-call){0,%d} "]}"' % (MAX_PARALLEL_CALLS - 1) if many else '"{\\"tool_calls\\": [" tool-call "]}"'
    else:
        root = "tool-call"
    lines.append(f"root ::= {root}")
    return "\n".join(lines) + "\n"


_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
          "null": type(None)}


def check_arguments(arguments: str, schema: dict | None) -> str | None:
    """None when the JSON text ``arguments`` fits ``schema`` (its type, required keys,
    property types and enums, one level deep), else a sentence saying what does not."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return "the arguments are not valid JSON"
    schema = schema or {}
    if not isinstance(value, dict):
        return "the arguments are not a JSON object"
    missing = [k for k in schema.get("required", []) if k not in value]
    if missing:
        return f"the arguments lack the required {', '.join(missing)}"
    for key, sub in (schema.get("properties") or {}).items():
        if key not in value or not isinstance(sub, dict):
            continue
        want = sub.get("type")
        kinds = [want] if isinstance(want, str) else want if isinstance(want, list) else []
        ok = not kinds or any(isinstance(value[key], _TYPES.get(k, object)) and not (
            k in ("integer", "number") and isinstance(value[key], bool)) for k in kinds)
        if not ok:
            return f"'{key}' is not of type {want}"
        if "enum" in sub and value[key] not in sub["enum"]:
            return f"'{key}' is not one of {sub['enum']}"
    if schema.get("additionalProperties") is False:
        extra = sorted(set(value) - set(schema.get("properties") or {}))
        if extra:
            return f"the arguments have unknown {', '.join(extra)}"
    return None
