"""OpenAI ``file`` content parts in ``branchwise serve``'s request parsing (no server)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from app.serve import file_parts
from app.serve.protocol import ApiError, parse_chat_request

PDF = Path(__file__).parent / "data" / "documents" / "gettysburg.pdf"


def _body(part: dict, text: str = "Who gave this speech?") -> dict:
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}]}


def _file(data: bytes, name: str = "gettysburg.pdf", url: bool = True) -> dict:
    b64 = base64.b64encode(data).decode()
    return {"type": "file", "file": {"filename": name, "file_data": f"data:application/pdf;base64,{b64}" if url else b64}}


def test_file_part_is_rendered_before_the_text_and_remembered(monkeypatch):
    data = PDF.read_bytes()
    req = parse_chat_request(_body(_file(data)))
    content = req.messages[-1].content
    assert content.startswith("[Attached file: gettysburg.pdf (PDF, 2 pages)]\n[Page 1]\nAddress delivered at")
    assert content.endswith("[Image on page 2 (not read)]\n[End of gettysburg.pdf]\n\nWho gave this speech?")
    # the same file again (bare base64 now): the same text, from the cache, not extracted again
    monkeypatch.setattr("engine.documents.attach_bytes", lambda *a, **k: pytest.fail("extracted twice"))
    again = parse_chat_request(_body(_file(data, url=False)))
    assert again.messages[-1].content == content


@pytest.mark.parametrize(("part", "says"), [
    ({"type": "file", "file": {"filename": "x.pdf", "file_data": "data:application/pdf;base64,@@@"}},
     "file_data is not valid base64."),
    ({"type": "file", "file": {"file_id": "file-abc"}}, "file_id is not supported"),
    ({"type": "file", "file": "nope"}, "must be an object with filename and file_data."),
    ({"type": "file", "file": {"filename": "x.pdf", "file_data": "data:text/plain,hello"}}, "base64 data: URL"),
])
def test_malformed_file_parts_are_400(part, says):
    with pytest.raises(ApiError) as err:
        parse_chat_request(_body(part))
    assert err.value.status == 400 and err.value.param == "messages[0].content[0].file"
    assert says in err.value.message


def test_a_file_that_cannot_be_attached_is_one_sentence():
    with pytest.raises(ApiError) as err:
        parse_chat_request(_body(_file(bytes(range(256)) * 4, "tool.txt")))
    assert err.value.status == 400 and err.value.code == "invalid_file"
    assert err.value.message.startswith("tool.txt is not a text file (it holds binary data)")


def test_decode_file_data():
    assert file_parts.decode_file_data("data:text/plain;base64,aGk=") == b"hi"
    assert file_parts.decode_file_data("aG\nk=") == b"hi"


def test_a_resent_file_is_restored_by_a_real_server(tmp_path):
    import httpx
    import openai
    from serve_procs import BranchwiseServe

    part = _file(PDF.read_bytes())
    with BranchwiseServe(tmp_path, "--threads", "1") as s:
        c = openai.OpenAI(base_url=s.start().url, api_key="unused", max_retries=0, timeout=900,
                          http_client=httpx.Client(trust_env=False))
        history = [{"role": "user", "content": [part, {"type": "text", "text": "Who gave this speech?"}]}]
        first = c.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=12)
        assert first.usage.prompt_tokens > 400  # the document is in the prompt
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "In what year?"}]
        second = c.chat.completions.create(model="m", messages=history, temperature=0, max_tokens=12)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert second.usage.prompt_tokens - cached < 20
