"""Tool calls in Kimi K2's format: special tokens of Kimi's vocabulary around each call, all the
calls of a reply in one section,

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_calls_section_end|>

The header `functions.NAME:IDX` (IDX counts the conversation's calls) is the call's id, which
Kimi's chat template writes back into the history. The markers are special tokens: the server
keeps them when decoding a tools request (`marker_ids`), and the grammar of `required` / named
names them by id, so the model must write those tokens, not their text spelled out.

A section is calls when it holds only calls (whitespace between them is allowed) whose header
is `functions.NAME:IDX` (or `NAME:IDX`) and whose arguments are a JSON object; otherwise the
section stays content, without its markers (as decoding without tools shows it); a stray
marker outside a section is dropped too, so no marker ever reaches `content`.
"""

from __future__ import annotations

import json
import re

from blockspec.server.tool_calls import Call, ToolFormat, arguments_json
from blockspec.structured_output import json_schema_grammar

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END)

_HEADER = re.compile(r"(?:functions\.)?([^\s:<>]+):(\d+)")
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(ARGUMENT_BEGIN) + r"(.*?)" + re.escape(CALL_END),
                   re.DOTALL)
_INDEX = "(0|[1-9][0-9]{0,3})"  # the call's index in the header, as Kimi writes it


def _arguments(text: str) -> str | None:
    """A call's argument text (a JSON object, or a JSON string of one) as JSON text, or None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return arguments_json(value)


class KimiToolFormat(ToolFormat):
    """`ids`: each marker's special-token id in the model's vocabulary."""

    name = "kimi_k2"
    open = SECTION_BEGIN
    close = SECTION_END
    content_drops = MARKERS

    def __init__(self, ids: dict[str, int]):
        missing = [m for m in MARKERS if m not in ids]
        if missing:
            raise ValueError(f"Kimi tool calls need the special tokens {', '.join(missing)} in the vocabulary")
        self.ids = {m: int(ids[m]) for m in MARKERS}
        self.marker_ids = tuple(sorted(self.ids.values()))

    def parse_block(self, inner: str) -> list[Call] | None:
        calls, pos = [], 0
        for match in _CALL.finditer(inner):
            if inner[pos:match.start()].strip():
                return None  # text between calls: not a section of calls
            header = _HEADER.fullmatch(match.group(1).strip())
            arguments = _arguments(match.group(2))
            if header is None or arguments is None or any(m in match.group(2) for m in MARKERS):
                return None
            calls.append((match.group(1).strip(), header.group(1), arguments))
            pos = match.end()
        return calls if calls and not inner[pos:].strip() else None

    def calls_format(self, names, params, named, one_call):
        def token(marker: str) -> dict:
            return {"type": "token", "token": self.ids[marker]}

        def call(name: str) -> dict:
            # JSON as blockspec always generates it (no free whitespace), as the grammar's EBNF.
            return {"type": "sequence", "elements": [
                token(CALL_BEGIN), {"type": "const_string", "value": f"functions.{name}:"},
                {"type": "regex", "pattern": _INDEX}, token(ARGUMENT_BEGIN),
                {"type": "grammar", "grammar": str(json_schema_grammar(params[name]))}, token(CALL_END)]}
        if named:
            calls = call(names[0])
        else:
            one = call(names[0]) if len(names) == 1 else {"type": "or", "elements": [call(n) for n in names]}
            calls = {"type": "repeat", "min": 1, "max": 1 if one_call else -1, "content": one}
        return {"type": "sequence", "elements": [token(SECTION_BEGIN), calls, token(SECTION_END)]}
