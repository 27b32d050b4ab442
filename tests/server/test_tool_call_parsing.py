"""Hermes tool-call parsing on its own: whole replies, and streams fed in every split equal them."""

from __future__ import annotations

import json

import pytest

from blockspec.server.hermes_tool_calls import HermesToolFormat

HERMES = HermesToolFormat()
parse_tool_calls, tool_reply, call_grammar = HERMES.parse, HERMES.reply, HERMES.call_grammar

CALL = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
REPLIES = {
    "only calls": (CALL + "\n" + CALL.replace('"f"', '"g"') + "\n", None, ["f", "g"]),
    "text then call": ("Sure, let me look.  \n" + CALL, "Sure, let me look.", ["f"]),
    "text around": ("a " + CALL + " b\n", "a b\n", ["f"]),
    "no calls keeps text": ("  hello <tool world  ", "  hello <tool world  ", []),
    "bad block stays content": ("x <tool_call>{not json}</tool_call> y", "x <tool_call>{not json}</tool_call> y", []),
    "unclosed block": ("x " + CALL[:-5], "x " + CALL[:-5], []),
    "string arguments": ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', None, ["f"]),
}


def feed_in_pieces(fmt, text: str, size: int) -> tuple[str, list[tuple[str, str, str]]]:
    """`fmt`'s stream fed `text` in pieces of `size` characters → (content, [(id, name,
    arguments)] per call index), the deltas joined as an OpenAI client joins them."""
    stream = fmt.stream()
    deltas = []
    for i in range(0, len(text), size):
        deltas += stream.feed(text[i:i + size])
    deltas += stream.finish()
    content = "".join(d["content"] for d in deltas if "content" in d)
    calls: dict[int, list] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            slot = calls.setdefault(c["index"], ["", "", ""])
            if "id" in c:
                assert c["type"] == "function"
                slot[0] = c["id"]
            slot[1] += c["function"].get("name", "")
            slot[2] += c["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("name", list(REPLIES))
def test_whole_and_streamed_replies_agree(name):
    text, content, names = REPLIES[name]
    got_content, calls = parse_tool_calls(text)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names
    for call in calls:
        assert json.loads(call["function"]["arguments"]) == {"a": 1}
    for size in (1, 2, 5, len(text)):
        streamed_content, streamed_calls = feed_in_pieces(HERMES, text, size)
        assert streamed_content == (content or "")
        assert all(call_id.startswith("call_") for call_id, _, _ in streamed_calls)
        assert [call[1:] for call in streamed_calls] == [(c["function"]["name"], c["function"]["arguments"])
                                                         for c in calls]


def test_finish_reasons():
    assert tool_reply(CALL, "stop")[1] == "tool_calls"
    assert tool_reply(CALL, "length")[1] == "length"
    assert tool_reply("plain", "stop") == ({"content": "plain"}, "stop")
    stream = HERMES.stream()
    assert stream.step(CALL[:10], False, None) == ([], None)
    deltas, reason = stream.step(CALL[10:], True, "stop")
    assert reason == "tool_calls" and len(deltas) == 2


def test_call_grammar_modes():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "g"}}]
    assert call_grammar(tools, "auto", None) is None and call_grammar(tools, "none", None) is None
    named = call_grammar(tools, {"type": "function", "function": {"name": "g"}}, None).value["format"]
    assert named["type"] == "tag" and named["begin"].endswith('"g", "arguments": ')
    required = call_grammar(tools, "required", False).value["format"]
    assert required["type"] == "tags_with_separator" and required["at_least_one"] and required["stop_after_first"]
    assert [t["begin"].split('"')[3] for t in required["tags"]] == ["f", "g"]
