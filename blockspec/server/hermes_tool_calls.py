"""Tool calls in the Hermes format the Qwen2.5 / Qwen3 chat templates ask for (plain text, no
special tokens):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block is a call when it is a JSON object with a string `name` and object `arguments` (or a
JSON string of one); each call gets a fresh `call_…` id.
"""

from __future__ import annotations

import json

from blockspec.server.tool_calls import Call, ToolFormat, arguments_json
from blockspec.structured_output import json_schema_grammar

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
# What the grammar writes around a call's arguments (the same bytes the Qwen templates render).
_CALL_BEGIN = OPEN + '\n{"name": "'
_CALL_ARGS = '", "arguments": '
_CALL_END = "}\n" + CLOSE


class HermesToolFormat(ToolFormat):
    name = "hermes"
    open = OPEN
    close = CLOSE

    def parse_block(self, inner: str) -> list[Call] | None:
        try:
            obj = json.loads(inner)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        arguments = arguments_json(obj.get("arguments", {}))
        return None if arguments is None else [(None, obj["name"], arguments)]

    def calls_format(self, names, params, named, one_call):
        def tag(name: str) -> dict:
            # The arguments as every JSON blockspec generates (no free whitespace: a sampled
            # model can spend its whole budget on it), given to the tag as the grammar's EBNF.
            return {"type": "tag", "begin": _CALL_BEGIN + name + _CALL_ARGS,
                    "content": {"type": "grammar", "grammar": str(json_schema_grammar(params[name]))},
                    "end": _CALL_END}
        if named:
            return tag(names[0])
        return {"type": "tags_with_separator", "tags": [tag(n) for n in names], "separator": "\n",
                "at_least_one": True, "stop_after_first": one_call}
