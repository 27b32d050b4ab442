"""Tool calls, whatever the model's format: the `ToolFormat` interface, the stream that turns a
reply into OpenAI deltas (`message.tool_calls`, whole or streamed), and what every format shares
(tool_choice modes, chat-template messages, finish reasons).

A format says how its calls are delimited in the decoded text (one block from `open` to
`close`), how a block's inside becomes calls, which special tokens its markers are (kept when
decoding, so the parser sees them) and the grammar of `tool_choice` `required` / named. Two
formats: Hermes (`hermes_tool_calls.py`, Qwen) and Kimi K2 (`kimi_tool_calls.py`); which one a
model uses is decided in one place, `tool_formats.py`.

A block that is not calls (bad JSON, an unknown shape, never closed) is not an error: its text
stays content (only a grammar-free `auto` reply can have one), as decoding without tools shows
it: a format's special-token markers (`content_drops`) are never content, so a reply without
calls has the same content whether or not it was parsed.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from blockspec.engine.stops import stop_prefix_holdback
from blockspec.structured_output import StructuredOutput

# One parsed call: (id or None for a fresh one, function name, arguments as JSON text).
Call = tuple


class ToolFormat(ABC):
    """How one model family writes tool calls. `open` / `close`: a block's delimiters in the
    decoded text; `marker_ids`: special-token ids the parser must see (decoded although special
    tokens are otherwise skipped; empty when the markers are plain text); `content_drops`: the
    text of those markers, dropped wherever it would be content (decoding without tools skips it)."""

    name: str
    open: str
    close: str
    marker_ids: tuple[int, ...] = ()
    content_drops: tuple[str, ...] = ()

    @abstractmethod
    def parse_block(self, inner: str) -> list[Call] | None:
        """The calls of one block's inside (between `open` and `close`), None if it is not calls."""

    def call_grammar(self, tools: list[dict], tool_choice, parallel_tool_calls: bool | None) -> StructuredOutput | None:
        """The grammar of `tool_choice` `required` (one or more calls of the given tools, nothing
        else; exactly one when parallel_tool_calls is false) or a named function (exactly one
        call of it: tool_choice is then the dict {"type": "function", "function": {"name"}});
        None for `auto` and `none`, which leave the model free. `tools` are OpenAI tool dicts."""
        mode = tool_choice_mode(tool_choice)
        if mode in ("auto", "none"):
            return None
        fmt = self.calls_format(chosen_names(tools, tool_choice), parameters_of(tools), mode == "named",
                                parallel_tool_calls is False)
        return StructuredOutput("structural_tag", {"type": "structural_tag", "format": fmt}, field="tools")

    @abstractmethod
    def calls_format(self, names: list[str], params: dict[str, dict], named: bool, one_call: bool) -> dict:
        """The xgrammar structural-tag format of this reply style: exactly one call of `names[0]`
        when `named`, else one or more calls of any of `names` (exactly one when `one_call`),
        each call's arguments valid for `params[name]`."""

    def stream(self) -> "ToolCallStream":
        return ToolCallStream(self)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """A whole reply → (content, OpenAI tool_calls), exactly as the stream gives it; content
        is None when the reply is only calls."""
        stream = self.stream()
        deltas = stream.feed(text) + stream.finish()
        content = "".join(d["content"] for d in deltas if "content" in d)
        return (content or None) if stream.calls else content, stream.calls

    def reply(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """A whole reply of a tools request: the message's `content` (and `tool_calls`) fields,
        and its finish_reason."""
        content, calls = self.parse(text)
        if not calls:
            return {"content": content}, finish_reason
        return {"content": content, "tool_calls": calls}, finish_reason_with_calls(finish_reason)


def tool_choice_mode(tool_choice) -> str:
    """'none' | 'auto' | 'required' | 'named' (tool_choice None means auto when tools are given)."""
    if tool_choice is None:
        return "auto"
    return tool_choice if isinstance(tool_choice, str) else "named"


def chosen_names(tools: list[dict], tool_choice) -> list[str]:
    """The functions a `required` (all of them) or named (that one) tool_choice may call."""
    if tool_choice_mode(tool_choice) == "named":
        return [tool_choice["function"]["name"]]
    return [t["function"]["name"] for t in tools]


def parameters_of(tools: list[dict]) -> dict[str, dict]:
    """Each tool's parameters schema by name (any object when it gives none)."""
    return {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}


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


def arguments_json(args) -> str | None:
    """A call's arguments (a dict, or a JSON string of one: some models write that) as JSON text;
    None if they are not an object."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason_with_calls(reason: str | None) -> str | None:
    """A reply that ended on its own with calls in it finished to call tools (OpenAI's
    "tool_calls"); one cut by max_tokens stays "length"."""
    return "tool_calls" if reason == "stop" else reason


@dataclass
class ToolCallStream:
    """Streams a reply as OpenAI deltas: `{"content": ...}` for text, and for each call, once its
    block is closed, `{"tool_calls": [{index, id, type, function: {name, arguments: ""}}]}` then
    `{"tool_calls": [{index, function: {arguments}}]}`. Content is the text outside the blocks,
    except whitespace right before a block and whitespace after the last block at the end, and
    without the format's `content_drops`; so text that may be the start of `open` or of a
    dropped marker, and trailing whitespace, are held back until what follows shows what they
    are. Without calls the content is the reply as decoding without tools gives it."""

    format: ToolFormat
    calls: list[dict] = field(default_factory=list)
    _buffer: str = ""          # text not yet classified
    _in_block: bool = False
    _pending_space: str = ""   # trailing whitespace of the text so far
    _after_call: bool = False  # no content since the last call

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        open_, close = self.format.open, self.format.close
        while True:
            if self._in_block:
                end = self._buffer.find(close, len(open_))
                if end < 0:
                    return deltas
                raw, self._buffer = self._buffer[:end + len(close)], self._buffer[end + len(close):]
                self._in_block = False
                calls = self.format.parse_block(raw[len(open_):end])
                deltas += self._content(raw) if not calls else self._calls(calls)
                continue
            start = self._buffer.find(open_)
            if start < 0:
                cut = len(self._buffer) - stop_prefix_holdback(self._buffer, [open_, *self.format.content_drops])
                ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
                return deltas + self._content(ready)
            deltas += self._content(self._buffer[:start])
            self._buffer = self._buffer[start:]
            self._in_block = True

    def step(self, text: str, finished: bool, finish_reason: str | None) -> tuple[list[dict], str | None]:
        """One engine output: its deltas (the rest of the reply too when `finished`) and the
        finish_reason to send."""
        deltas = self.feed(text) + (self.finish() if finished else [])
        return deltas, finish_reason_with_calls(finish_reason) if finished and self.calls else finish_reason

    def finish(self) -> list[dict]:
        """The end of the reply: an unclosed block and held-back text are content."""
        rest, self._buffer, self._in_block = self._buffer, "", False
        deltas = self._content(rest)
        if self._pending_space and not self._after_call:
            deltas.append({"content": self._pending_space})
        self._pending_space = ""
        return deltas

    def _content(self, text: str) -> list[dict]:
        for marker in self.format.content_drops:
            text = text.replace(marker, "")
        text = self._pending_space + text
        body = text.rstrip()
        self._pending_space = text[len(body):]
        if not body:
            return []
        self._after_call = False
        return [{"content": body}]

    def _calls(self, calls: list[Call]) -> list[dict]:
        self._pending_space, self._after_call = "", True
        deltas = []
        for call_id, name, arguments in calls:
            index = len(self.calls)
            call = {"id": call_id or new_call_id(), "type": "function",
                    "function": {"name": name, "arguments": arguments}}
            self.calls.append(call)
            deltas += [{"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": name, "arguments": ""}}]},
                       {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]}]
        return deltas
