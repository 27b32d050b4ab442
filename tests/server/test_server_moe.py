"""One chat through the real server per mixture-of-experts family (DeepSeek-V3 with MLA and
DDTree speculation; Qwen3-MoE plain): the reply is the engine's own greedy continuation of the
templated prompt, and the K/V pool is free afterwards."""

import openai
import pytest

from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter
from live import live_server
from real_engine import make_real_engine
from test_server_real_engine import assert_pool_free


@pytest.mark.parametrize("family,spec", [("deepseek_dir", "ddtree"), ("qwen3_moe_dir", "none")])
def test_one_chat(family, spec, request, tmp_path):
    model_dir = request.getfixturevalue(family)
    drafter = str(write_dflash_drafter(tmp_path / "d", model_dir, block_size=8)) if spec != "none" else None
    engine = make_real_engine(model_dir, spec=spec, draft_dir=drafter)
    with live_server(engine) as server:
        with openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=30) as client:
            reply = client.chat.completions.create(
                model=server.async_engine.model_name, max_tokens=12, temperature=0,
                messages=[{"role": "user", "content": "the lighthouse keeper counted the stairs"}],
                extra_body={"ignore_eos": True})
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 12
        (prompt,) = server.engine.prompts.values()
        assert_pool_free(server)
    direct = LLM(model=model_dir).generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    assert reply.choices[0].message.content == direct.text
