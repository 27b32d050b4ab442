"""Tool calls in the Hermes format the Qwen2.5 / Qwen3 chat templates ask for:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

This file turns a request's `tools` / `tool_choice` into what the template and the engine need
(the tools for the template, the grammar that enforces `required` or a named function) and a
reply back into OpenAI's `message.tool_calls`, whole or streamed as deltas.

A block that is not a JSON object with a string `name` and object `arguments` is not a call:
its text stays content (only a grammar-free `auto` reply can have one).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from blockspec.engine.stops import stop_prefix_holdback
from blockspec.structured_output import StructuredOutput, json_schema_grammar

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# What the grammar writes around a call's arguments (the same bytes the Qwen templates render).
_CALL_BEGIN = OPEN + '\n{"name": "'
_CALL_ARGS = '", "arguments": '
_CALL_END = "}\n" + CLOSE


def tool_choice_mode(tool_choice) -> str:
    """'none' | 'auto' | 'required' | 'named' (tool_choice None means auto when tools are given)."""
    if tool_choice is None:
        return "auto"
    return tool_choice if isinstance(tool_choice, str) else "named"


def call_grammar(tools: list[dict], tool_choice, parallel_tool_calls: bool | None) -> StructuredOutput | None:
    """The grammar of `tool_choice` `required` (one or more calls of the given tools, nothing
    else; exactly one when parallel_tool_calls is false) or a named function (exactly one call of
    it); None for `auto` and `none`, which leave the model free. `tools` are OpenAI tool dicts."""
    mode = tool_choice_mode(tool_choice)
    if mode in ("auto", "none"):
        return None
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    names = [tool_choice["function"]["name"]] if mode == "named" else list(by_name)

    def tag(name: str) -> dict:
        # The arguments as every JSON blockspec generates (no free whitespace: a sampled model
        # can spend its whole budget on it), given to the tag as the grammar's EBNF.
        arguments = json_schema_grammar(by_name[name].get("parameters") or {"type": "object"})
        return {"type": "tag", "begin": _CALL_BEGIN + name + _CALL_ARGS,
                "content": {"type": "grammar", "grammar": str(arguments)}, "end": _CALL_END}
    if mode == "named":
        fmt = tag(names[0])
    else:
        fmt = {"type": "tags_with_separator", "tags": [tag(n) for n in names], "separator": "\n",
               "at_least_one": True, "stop_after_first": parallel_tool_calls is False}
    return StructuredOutput("structural_tag", {"type": "structural_tag", "format": fmt}, field="tools")


def template_messages(messages) -> list[dict]:
    """Chat messages as the chat template reads them (transformers' convention): OpenAI's
    "developer" is "system"; an assistant's tool calls carry their arguments as a dict (the
    templates `tojson` them); a tool reply keeps its tool_call_id."""
    out = []
    for m in messages:
        msg = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments_value(c.function.arguments)}}
                                 for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def _arguments_value(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # not JSON: the template gets the text as it came


def _parse_call(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of one block's inside, or None if it is not a call."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """A whole reply → (content, OpenAI tool_calls), as `ToolCallStream` streams it; content is
    None when the reply is only calls."""
    stream = ToolCallStream()
    deltas = stream.feed(text) + stream.finish()
    content = "".join(d["content"] for d in deltas if "content" in d)
    return (content or None) if stream.calls else content, stream.calls


def finish_reason_with_calls(reason: str | None) -> str | None:
    """A reply that ended on its own with calls in it finished to call tools (OpenAI's
    "tool_calls"); one cut by max_tokens stays "length"."""
    return "tool_calls" if reason == "stop" else reason


def tool_reply(text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """A whole reply of a tools request: the message's `content` (and `tool_calls`) fields, and
    its finish_reason."""
    content, calls = parse_tool_calls(text)
    if not calls:
        return {"content": content}, finish_reason
    return {"content": content, "tool_calls": calls}, finish_reason_with_calls(finish_reason)


@dataclass
class ToolCallStream:
    """Streams a reply as OpenAI deltas: `{"content": ...}` for text, and for each call, once it
    is closed, `{"tool_calls": [{index, id, type, function: {name, arguments: ""}}]}` then
    `{"tool_calls": [{index, function: {arguments}}]}`. Content is the text outside the calls,
    except whitespace right before a call and whitespace after the last call at the end; so
    text that may be the start of `<tool_call>`, and trailing whitespace, are held back until
    what follows shows what they are. Without calls the content is the reply, unchanged."""

    calls: list[dict] = field(default_factory=list)
    _buffer: str = ""          # text not yet classified
    _in_call: bool = False
    _pending_space: str = ""   # trailing whitespace of the text so far
    _after_call: bool = False  # no content since the last call

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return deltas
                raw, self._buffer = self._buffer[:end + len(CLOSE)], self._buffer[end + len(CLOSE):]
                self._in_call = False
                parsed = _parse_call(raw[len(OPEN):end])
                deltas += self._content(raw) if parsed is None else self._call(*parsed)
                continue
            start = self._buffer.find(OPEN)
            if start < 0:
                cut = len(self._buffer) - stop_prefix_holdback(self._buffer, [OPEN])
                ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return deltas + self._content(ready)
            deltas += self._content(self._buffer[:start])
            self._buffer = self._buffer[start:]
            self._in_call = True

    def step(self, text: str, finished: bool, finish_reason: str | None) -> tuple[list[dict], str | None]:
        """One engine output: its deltas (the rest of the reply too when `finished`) and the
        finish_reason to send."""
        deltas = self.feed(text) + (self.finish() if finished else [])
        return deltas, finish_reason_with_calls(finish_reason) if finished and self.calls else finish_reason

    def finish(self) -> list[dict]:
        """The end of the reply: an unclosed block and held-back text are content."""
        rest, self._buffer, self._in_call = self._buffer, "", False
        deltas = self._content(rest)
        if self._pending_space and not self._after_call:
            deltas.append({"content": self._pending_space})
        self._pending_space = ""
        return deltas

    def _content(self, text: str) -> list[dict]:
        text = self._pending_space + text
        body = text.rstrip()
        self._pending_space = text[len(body):]
        if not body:
            return []
        self._after_call = False
        return [{"content": body}]

    def _call(self, name: str, arguments: str) -> list[dict]:
        self._pending_space, self._after_call = "", True
        index = len(self.calls)
        call = {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
        self.calls.append(call)
        return [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                 "function": {"name": name, "arguments": ""}}]},
                {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}]
