"""logprobs, penalties and logit_bias through the official openai client against the real engine
(tiny Qwen3 with a DFlash drafter, CPU): streamed and non-streamed agree, values equal
transformers' float32 forward within 1e-4, penalised greedy output equals the offline engine's,
and a logit_bias id outside the vocabulary is a 400 that leaves nothing behind."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from test_server_real_engine import assert_pool_free, drafter_dir, real_server  # noqa: F401 (fixture)

MESSAGES = [{"role": "user", "content": "the lighthouse keeper climbed"}]
PENALTIES = dict(presence_penalty=1.2, frequency_penalty=0.5, logit_bias={"7": 5.0})


@pytest.fixture(scope="module")
def server(qwen3_dir, drafter_dir):  # noqa: F811
    with real_server(qwen3_dir, drafter_dir, spec="dflash") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _chat(client, server, stream: bool, extra_body=None, **kwargs):
    args = dict(model=server.async_engine.model_name, messages=MESSAGES, max_tokens=10, temperature=0,
                extra_body={"ignore_eos": True, **(extra_body or {})}, **kwargs)
    if not stream:
        return client.chat.completions.create(**args).choices[0]
    return [c.choices[0] for c in client.chat.completions.create(stream=True, **args) if c.choices]


def test_chat_logprobs_streamed_equal_non_streamed_and_the_target(client, server, qwen3_dir):
    full = _chat(client, server, False, logprobs=True, top_logprobs=3)
    chunks = _chat(client, server, True, logprobs=True, top_logprobs=3)
    streamed = [entry for c in chunks if c.logprobs for entry in c.logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in full.logprobs.content]
    assert "".join(c.delta.content or "" for c in chunks) == full.message.content

    tokenizer = server.async_engine.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    output = offline_greedy_ids(qwen3_dir, prompt, 10)
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1], -1)
    assert len(full.logprobs.content) == 10
    for d, (entry, token) in enumerate(zip(full.logprobs.content, output)):
        assert entry.token == tokenizer.decode([token], skip_special_tokens=False)
        assert entry.bytes == list(entry.token.encode())
        assert abs(entry.logprob - want[d, token].item()) < 1e-4
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) == 3
        torch.testing.assert_close(torch.tensor(values), want[d].topk(3).values, rtol=0, atol=1e-4)


def offline_greedy_ids(model_dir, prompt, n, **penalties):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **penalties)
    return LLM(model=model_dir).generate([prompt], params)[0].token_ids


def test_completion_logprobs_streamed_equal_non_streamed(client, server):
    args = dict(model=server.async_engine.model_name, prompt="farmers brought cheese", max_tokens=9,
                temperature=0.8, seed=3, logprobs=2, extra_body={"ignore_eos": True})
    full = client.completions.create(**args).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **args)]
    merged = {key: [v for c in chunks if c.logprobs for v in getattr(c.logprobs, key)]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    assert merged == full.logprobs.model_dump(include=set(merged))
    assert len(full.logprobs.tokens) == 9
    # A dict keyed by text: alternatives that decode alike (byte-fallback pieces) collapse into one key.
    assert all(1 <= len(top) <= 3 and top[t] == lp for top, t, lp in
               zip(full.logprobs.top_logprobs, full.logprobs.tokens, full.logprobs.token_logprobs))
    assert full.logprobs.text_offset[0] == 0
    assert "".join(full.logprobs.tokens) == full.text


@pytest.mark.parametrize("stream", [False, True])
def test_penalties_and_logit_bias_equal_the_offline_engine(client, server, qwen3_dir, stream):
    choice = _chat(client, server, stream, presence_penalty=PENALTIES["presence_penalty"],
                   frequency_penalty=PENALTIES["frequency_penalty"], logit_bias=PENALTIES["logit_bias"],
                   extra_body={"repetition_penalty": 1.3})
    text = choice.message.content if not stream else "".join(c.delta.content or "" for c in choice)
    tokenizer = server.async_engine.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    ids = offline_greedy_ids(qwen3_dir, prompt, 10, presence_penalty=1.2, frequency_penalty=0.5,
                             logit_bias={7: 5.0}, repetition_penalty=1.3)
    assert text == tokenizer.decode(ids)
    assert ids != offline_greedy_ids(qwen3_dir, prompt, 10)


def test_logit_bias_outside_the_vocabulary_is_a_400(client, server):
    vocab = server.async_engine.engine.inner.model_config.vocab_size
    with pytest.raises(openai.BadRequestError) as e:
        _chat(client, server, False, logit_bias={str(vocab): 1.0})
    assert e.value.body["param"] == "logit_bias"
    assert_pool_free(server)
