"""A request's output constraints: `response_format`, the `structured_outputs` extension (vLLM's
spelling: exactly one of json / regex / choice / grammar) and `tools` / `tool_choice`, checked
and turned into one `StructuredOutput` for the engine and a `ToolPlan` for the reply.

Every bad value is a 400 naming its field: an unknown type (the schema models refuse it), a
schema or regex the grammar engine cannot build, a tool_choice naming no given function, two
constraints at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from blockspec.structured_output import JSON_OBJECT_SCHEMA, StructuredOutput
from blockspec.server.errors import invalid_request
from blockspec.server.tool_calls import ToolFormat, tool_choice_mode


@dataclass
class ToolPlan:
    """tools: OpenAI tool dicts for the chat template; mode: auto | none | required | named;
    format: the model's tool-call format. Replies are parsed for calls unless the mode is none."""

    tools: list[dict]
    mode: str
    format: ToolFormat

    @property
    def parses_calls(self) -> bool:
        return self.mode != "none"

    @property
    def kept_special_token_ids(self) -> tuple[int, ...]:
        """The special tokens decoded into the reply's text: the format's markers, which the
        parser reads (none when the reply is not parsed, so they never reach its content)."""
        return self.format.marker_ids if self.parses_calls else ()


def _structured(kind: str, value, field: str) -> StructuredOutput:
    try:
        return StructuredOutput(kind, value, field=field)
    except ValueError as e:
        raise invalid_request(str(e), field) from None


def response_format_constraint(body) -> StructuredOutput | None:
    """`response_format` (chat) or `structured_outputs` (both endpoints), at most one of them."""
    fmt = getattr(body, "response_format", None)
    fmt = None if fmt is None or fmt.type == "text" else fmt
    extension = body.structured_outputs
    if fmt is not None and extension is not None:
        raise invalid_request("Give either 'response_format' or 'structured_outputs', not both.", "structured_outputs")
    if fmt is not None:
        if fmt.type == "json_object":
            return _structured("json", JSON_OBJECT_SCHEMA, "response_format")
        if fmt.json_schema.schema_ is None:
            raise invalid_request("response_format.json_schema.schema is required.", "response_format.json_schema.schema")
        return _structured("json", fmt.json_schema.schema_, "response_format.json_schema.schema")
    if extension is None:
        return None
    given = {name: value for name, value in (("json", extension.json_), ("regex", extension.regex),
                                             ("choice", extension.choice), ("grammar", extension.grammar))
             if value is not None}
    if len(given) != 1:
        raise invalid_request("structured_outputs takes exactly one of 'json', 'regex', 'choice' or 'grammar'; "
                              f"got {len(given) or 'none'}.", "structured_outputs")
    (name, value), = given.items()
    return _structured(name, value, f"structured_outputs.{name}")


def tool_plan(body, template_renders_tools: bool, tool_format: ToolFormat) -> tuple[ToolPlan | None,
                                                                                   StructuredOutput | None]:
    """The request's tools (None without any) and the grammar its tool_choice needs, in the
    model's `tool_format`."""
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise invalid_request("'tool_choice' is only allowed when 'tools' are specified.", "tool_choice")
        return None, None
    if not template_renders_tools:
        raise invalid_request("This model's chat template does not render tools, so it cannot be given any.",
                              "tools")
    tools = [t.model_dump(exclude_none=True, by_alias=True) for t in body.tools]
    names = [t["function"]["name"] for t in tools]
    for i, tool in enumerate(tools):
        if names.index(tool["function"]["name"]) != i:
            raise invalid_request(f"Duplicate tool name {names[i]!r}.", f"tools[{i}].function.name")
        if "parameters" in tool["function"]:
            _structured("json", tool["function"]["parameters"], f"tools[{i}].function.parameters")
    mode = tool_choice_mode(choice)
    if mode == "named" and choice.function.name not in names:
        raise invalid_request(f"tool_choice names the function {choice.function.name!r}, which is not among "
                              f"the given tools ({', '.join(names)}).", "tool_choice")
    named = choice.model_dump() if mode == "named" else choice
    try:
        grammar = tool_format.call_grammar(tools, named, body.parallel_tool_calls)
    except ValueError as e:
        raise invalid_request(str(e), "tools") from None
    if grammar is not None and response_format_constraint(body) is not None:
        raise invalid_request(f"tool_choice {mode!r} constrains the reply to tool calls; it cannot be combined "
                              "with 'response_format' or 'structured_outputs'.", "tool_choice")
    return ToolPlan(tools, mode, tool_format), grammar
