"""The official openai client against the server: chat and completions, streamed and not."""

from __future__ import annotations

import pytest

from live import using_fake_engine

MESSAGES = [{"role": "user", "content": "alpha bravo charlie"}]
PROMPT = "alpha bravo charlie"
SPEC_KEYS = {"algorithm", "verify", "verify_steps", "drafted_tokens", "accepted_tokens", "accept_length",
             "configurations"}
# Sampling settings under which two runs must agree exactly: greedy, and seeded sampling.
REPRODUCIBLE = [pytest.param({"temperature": 0}, id="greedy"),
                pytest.param({"temperature": 1.0, "seed": 7}, id="seeded")]


def _spec(response) -> dict:
    return response.model_extra["spec_decoding"]


def _chat_prompt_len(server) -> int:
    return len(server.async_engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))


def _check_spec(spec: dict, server, completion_tokens: int) -> None:
    assert set(spec) == SPEC_KEYS
    assert spec["algorithm"] == server.async_engine.spec_algorithm
    if spec["verify_steps"]:
        assert spec["accept_length"] >= 1.0
    if using_fake_engine():  # the fake commits every token through a verify step
        assert spec["verify_steps"] > 0
        assert spec["accept_length"] == round(completion_tokens / spec["verify_steps"], 4)
        assert spec["drafted_tokens"] == 3 * spec["verify_steps"]


@pytest.mark.parametrize("sampling", REPRODUCIBLE)
def test_chat_stream_joins_to_the_non_streamed_text(client, server, model_name, sampling):
    kwargs = dict(model=model_name, messages=MESSAGES, max_tokens=12, extra_body={"ignore_eos": True},
                  **sampling)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert text  # something was generated
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"] == [full.choices[0].finish_reason]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage == full.usage
    assert all(c.usage is None for c in chunks[:-1])
    assert _spec(usage_chunk) == _spec(full)


def test_chat_usage_and_spec_decoding(client, server, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=9, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.model == model_name
    assert r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == _chat_prompt_len(server)
    assert r.usage.completion_tokens == 9
    assert r.usage.total_tokens == r.usage.prompt_tokens + 9
    _check_spec(_spec(r), server, 9)


def test_chat_max_completion_tokens_wins_over_max_tokens(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=10,
                                       max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    assert r.choices[0].finish_reason == "length"


def test_chat_default_max_tokens_is_the_remaining_context(client, server, model_name):
    expected = min(server.async_engine.max_model_len - _chat_prompt_len(server), 1024)
    if expected > 256:
        pytest.skip("context too long to generate it all in a quick test")
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == expected
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_without_usage_puts_spec_decoding_on_the_last_chunk(client, server, model_name):
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5,
                                                 temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert set(_spec(chunks[-1])) == SPEC_KEYS
    assert all("spec_decoding" not in (c.model_extra or {}) for c in chunks[:-1])


@pytest.mark.parametrize("sampling", REPRODUCIBLE)
def test_completion_stream_joins_to_the_non_streamed_text(client, model_name, sampling):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=10, extra_body={"ignore_eos": True},
                  **sampling)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage == full.usage
    assert _spec(chunks[-1]) == _spec(full)


def test_completion_default_max_tokens_is_16(client, server, model_name):
    r = client.completions.create(model=model_name, prompt=PROMPT, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens == len(server.async_engine.tokenizer.encode(PROMPT))
    _check_spec(_spec(r), server, 16)


def test_n_choices_use_seed_plus_index(client, model_name):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=8, temperature=1.0,
                  extra_body={"ignore_eos": True})
    both = client.completions.create(n=2, seed=11, **kwargs)
    first = client.completions.create(seed=11, **kwargs)
    second = client.completions.create(seed=12, **kwargs)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.choices[0].text == first.choices[0].text
    assert both.choices[1].text == second.choices[0].text
    assert both.usage.completion_tokens == 16
    assert both.usage.prompt_tokens == first.usage.prompt_tokens  # the prompt counts once
    assert _spec(both)["verify_steps"] == _spec(first)["verify_steps"] + _spec(second)["verify_steps"]


def test_n_choices_stream_each_index_once(client, model_name):
    kwargs = dict(model=model_name, messages=MESSAGES, max_tokens=6, temperature=1.0, seed=3, n=3,
                  extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    for i in range(3):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert [m.finish_reason for m in mine if m.finish_reason] == ["length"]
        assert "".join(m.delta.content or "" for m in mine) == full.choices[i].message.content
    assert set(_spec(chunks[-1])) == SPEC_KEYS


def test_prompt_list_and_token_ids(client, server, model_name):
    kwargs = dict(model=model_name, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    other = "delta echo"
    batch = client.completions.create(prompt=[PROMPT, other], **kwargs)
    ids = server.async_engine.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(prompt=ids, **kwargs)
    single = client.completions.create(prompt=other, **kwargs)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_ids.choices[0].text
    assert batch.choices[1].text == single.choices[0].text
    assert batch.usage.prompt_tokens == by_ids.usage.prompt_tokens + single.usage.prompt_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text(client, model_name, stream):
    kwargs = dict(model=model_name, prompt=PROMPT, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 4]
    if len(stop) < 4:
        pytest.skip("generated text too short to pick a stop string")
    expected = text[:text.find(stop)]
    if stream:
        chunks = list(client.completions.create(stop=[stop], stream=True, **kwargs))
        got = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(stop=stop, **kwargs)
        got, reason = r.choices[0].text, r.choices[0].finish_reason
    assert got == expected
    assert reason == "stop"


def test_harmless_openai_fields_are_accepted(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=2, user="me",
                                       presence_penalty=0, frequency_penalty=0, logprobs=False,
                                       metadata={"k": "v"},
                                       extra_body={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0})
    assert r.choices[0].finish_reason in ("length", "stop")


def test_models_list(client, model_name):
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
