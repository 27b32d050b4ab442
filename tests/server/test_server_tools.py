"""Tool calls and structured output through the official openai client, streamed and not, on the
real engine (tiny Qwen3, DFlash drafter) whose chat template renders tools Hermes-style.

The random model never calls a tool of its own accord, so `auto` is checked for passing the
reply through; `required` and a named function are enforced by the grammar, and their calls
must parse, validate against the tool's parameters and match between streamed and not.
"""

from __future__ import annotations

import json
import shutil

import jsonschema
import openai
import pytest

from dflash_fixtures import write_dflash_drafter
from live import live_server
from real_engine import DRAFT_BLOCK_SIZE, make_real_engine

# A Hermes-style template written for this test (the Qwen2.5 / Qwen3 shape): tools in a system
# turn, calls as <tool_call> JSON, tool replies in <tool_response>. Only the tools' names are
# rendered: the tiny tokenizer spends a token per character of JSON, and the context is 512.
TOOLS_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n<tools>' }}"
    "{%- for tool in tools -%}{{- ' ' + tool.function.name }}{%- endfor -%}"
    "{{- '\\n</tools>\\nCall as <tool_call>\\n{\"name\": ..., \"arguments\": ...}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' and message.tool_calls -%}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' + (call.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}"
    "{%- endfor -%}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' }}{%- endif -%}"
)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "the weather in the harbour"}]


@pytest.fixture(scope="module")
def tools_model(qwen3_dir, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tools_model") / "qwen3"
    shutil.copytree(qwen3_dir, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TOOLS_TEMPLATE
    config_path.write_text(json.dumps(config))
    return str(out)


@pytest.fixture(scope="module")
def tool_server(tools_model, tmp_path_factory):
    drafter = write_dflash_drafter(tmp_path_factory.mktemp("tools_drafter"), tools_model, block_size=DRAFT_BLOCK_SIZE)
    with live_server(make_real_engine(tools_model, spec="dflash", draft_dir=str(drafter))) as server:
        yield server


@pytest.fixture(scope="module")
def tool_client(tool_server):
    return openai.OpenAI(base_url=tool_server.url("/v1"), api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tool_model_name(tool_server) -> str:
    return tool_server.async_engine.model_name


def _streamed(chunks) -> tuple[str, dict[int, dict], list[str]]:
    """(content, calls by index, finish reasons) accumulated from stream chunks."""
    content, calls, reasons = "", {}, []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function:
                    slot["name"] += call.function.name or ""
                    slot["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return content, calls, reasons


@pytest.mark.parametrize("tool_choice, parallel", [
    ({"type": "function", "function": {"name": "get_weather"}}, None),
    ("required", False),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_enforced_tool_calls_streamed_and_not(tool_client, tool_model_name, tool_server, tool_choice, parallel,
                                              temperature):
    kwargs = dict(model=tool_model_name, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                  max_tokens=128, temperature=temperature, seed=11)
    if parallel is not None:
        kwargs["parallel_tool_calls"] = parallel
    full = tool_client.chat.completions.create(**kwargs)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])

    content, streamed, reasons = _streamed(tool_client.chat.completions.create(stream=True, **kwargs))
    assert content == "" and reasons == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [(call.function.name, call.function.arguments)]
    assert streamed[0]["id"].startswith("call_")
    # The template saw the tools.
    prompt = tool_server.async_engine.tokenizer.decode(next(iter(tool_server.engine.prompts.values())),
                                                       skip_special_tokens=False)
    assert "<tools> get_weather get_time" in prompt


def test_auto_passes_the_reply_through_and_history_renders(tool_client, tool_model_name, tool_server):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    kwargs = dict(model=tool_model_name, messages=history, tools=TOOLS, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    auto = tool_client.chat.completions.create(**kwargs)
    plain = tool_client.chat.completions.create(**{**kwargs, "tool_choice": "none"})
    assert auto.choices[0].finish_reason == "length" and auto.choices[0].message.tool_calls is None
    assert auto.choices[0].message.content == plain.choices[0].message.content
    prompt = tool_server.async_engine.tokenizer.decode(list(tool_server.engine.prompts.values())[-1],
                                                       skip_special_tokens=False)
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>' in prompt
    assert "<tool_response>\n12:00\n</tool_response>" in prompt


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema_and_structured_outputs(tool_client, tool_model_name, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
    kwargs = dict(model=tool_model_name, messages=MESSAGES, response_format=fmt, max_tokens=64, temperature=1.0,
                  seed=5, n=2)
    if stream:
        chunks = list(tool_client.chat.completions.create(stream=True, **kwargs))
        texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                 for i in range(2)]
    else:
        texts = [c.message.content for c in tool_client.chat.completions.create(**kwargs).choices]
    for text in texts:
        jsonschema.validate(json.loads(text), WEATHER)
    done = tool_client.completions.create(model=tool_model_name, prompt="the date", max_tokens=16, temperature=1.0,
                                          seed=2, extra_body={"structured_outputs": {"regex": "[0-9]{4}-[0-9]{2}"}})
    assert len(done.choices[0].text) == 7 and done.choices[0].text[4] == "-"


@pytest.mark.parametrize("changes, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "get_mail"}}}, "tool_choice"),
    ({"tools": TOOLS + [TOOLS[0]]}, "tools[2].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400s(tool_client, tool_model_name, changes, param):
    body = {"model": tool_model_name, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 4, **changes}
    with pytest.raises(openai.BadRequestError) as info:
        tool_client.chat.completions.create(**body)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param, info.value.body
