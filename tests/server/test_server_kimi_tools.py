"""Kimi K2 tool calls through the official openai client, streamed and not, on the real engine
with a tiny Kimi-like checkpoint (DeepseekV3ForCausalLM, model_type kimi_k2) and the tiktoken
Kimi tokenizer, whose chat template renders tools and writes history calls with Kimi's markers.

`required` and a named function are enforced by the grammar (the markers by token id); their
calls must parse into calls of the right name with Kimi's `functions.NAME:IDX` ids, validate
against the tool's parameters and match between streamed and not. The random model never calls
a tool of its own accord, so `auto` is checked for passing the reply through unchanged.
"""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from blockspec.tiktoken_tokenizer import NUM_SPECIAL_IDS
from kimi_fixtures import BASE, TOOL_MARKERS, write_kimi_tokenizer
from live import live_server
from moe_fixtures import write_deepseek_v3
from real_engine import make_real_engine
from test_server_tools import _streamed

# Kimi-style (written for this test): tools declared in a system turn (names only: the tiny
# vocabulary spends a token per character), history calls between the markers, tool results
# as "## Return of <id>".
TEMPLATE = (
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>"
    "{%- for t in tools -%}{{ t.function.name }} {% endfor -%}<|im_end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "<|im_system|>tool<|im_middle|>## Return of {{ m.tool_call_id }}\n{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{{ m.content or '' }}"
    "{%- if m.tool_calls -%}<|tool_calls_section_begin|>{%- for c in m.tool_calls -%}"
    "<|tool_call_begin|>{{ c.id }}<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>"
    "{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}<|im_end|>"
    "{%- else -%}<|im_user|>{{ m.role }}<|im_middle|>{{ m.content }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "weather in the harbour"}]


@pytest.fixture(scope="module")
def kimi_server(tmp_path_factory):
    model = write_deepseek_v3(tmp_path_factory.mktemp("kimi_tools") / "kimi", vocab_size=BASE + NUM_SPECIAL_IDS,
                              model_type="kimi_k2")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (model / f).unlink(missing_ok=True)
    write_kimi_tokenizer(model, template=TEMPLATE)
    with live_server(make_real_engine(str(model))) as server:
        yield server


@pytest.fixture(scope="module")
def client(kimi_server):
    return openai.OpenAI(base_url=kimi_server.url("/v1"), api_key="unused", max_retries=0, timeout=60)


def _last_prompt(server) -> list[int]:
    return list(server.engine.prompts.values())[-1]


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_enforced_kimi_calls_streamed_and_not(client, kimi_server, tool_choice, temperature):
    kwargs = dict(model=kimi_server.async_engine.model_name, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                  max_tokens=96, temperature=temperature, seed=5, parallel_tool_calls=False)
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    name = call.function.name
    assert name == "get_weather" if isinstance(tool_choice, dict) else name in SCHEMAS
    assert re.fullmatch(rf"functions\.{name}:\d+", call.id) and call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])

    content, streamed, reasons = _streamed(client.chat.completions.create(stream=True, **kwargs))
    assert content == "" and reasons == ["tool_calls"]
    assert [(c["id"], c["name"], c["arguments"]) for c in streamed.values()] == [
        (call.id, name, call.function.arguments)]
    prompt = _last_prompt(kimi_server)
    assert kimi_server.async_engine.tokenizer.decode(prompt, skip_special_tokens=False).startswith(
        "<|im_system|>tool_declare<|im_middle|>get_weather get_time <|im_end|>")


def test_auto_passes_the_reply_through_and_history_renders(client, kimi_server):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "functions.get_time:0", "type": "function",
             "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_time:0", "content": "12:00"}]
    kwargs = dict(model=kimi_server.async_engine.model_name, messages=history, tools=TOOLS, max_tokens=12,
                  temperature=0, extra_body={"ignore_eos": True})
    auto = client.chat.completions.create(**kwargs).choices[0]
    plain = client.chat.completions.create(**{**kwargs, "tool_choice": "none"}).choices[0]
    assert auto.finish_reason == "length" and auto.message.tool_calls is None
    assert auto.message.content == plain.message.content and "<|" not in plain.message.content
    content, streamed, _ = _streamed(client.chat.completions.create(stream=True, **kwargs))
    assert content == auto.message.content and not streamed
    prompt = _last_prompt(kimi_server)
    text = kimi_server.async_engine.tokenizer.decode(prompt, skip_special_tokens=False)
    assert ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>'
            '{"zone": "UTC"}<|tool_call_end|><|tool_calls_section_end|>') in text
    assert "## Return of functions.get_time:0\n12:00" in text
    assert set(TOOL_MARKERS) <= set(prompt)  # the template's markers are the special tokens, not text
