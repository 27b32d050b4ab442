"""Chat content the server refuses (images, video, audio: it serves text models), and a chat
through the real engine on a checkpoint whose tokenizer is Kimi's tiktoken one."""

from __future__ import annotations

import httpx
import pytest

from live import live_server

MEDIA_PARTS = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "input_image", "image_url": "http://x/a.png"},
    {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
]


@pytest.mark.parametrize("part", MEDIA_PARTS, ids=lambda p: p["type"])
def test_media_content_is_refused_by_name(http, model_name, part):
    messages = [{"role": "system", "content": "hi"},
                {"role": "user", "content": [{"type": "text", "text": "look:"}, part]}]
    r = http.post("/v1/chat/completions", json={"model": model_name, "messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].content" and error["code"] == "unsupported_content"
    assert error["type"] == "invalid_request_error"
    assert f"content part 1 is of type '{part['type']}'" in error["message"]
    assert "text content only" in error["message"]
    ok = http.post("/v1/chat/completions", json={"model": model_name, "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})
    assert ok.status_code == 200, ok.text


def test_chat_with_the_kimi_tokenizer_real_engine(tmp_path):
    """A Qwen3 checkpoint whose tokenizer is the tiktoken one: LLM.chat, then one server chat."""
    from blockspec import LLM, SamplingParams
    from fixtures import write_qwen3
    from kimi_fixtures import BASE, CHAT, write_kimi_tokenizer
    from blockspec.tiktoken_tokenizer import NUM_SPECIAL_IDS

    model = write_qwen3(tmp_path / "m", vocab_size=BASE + NUM_SPECIAL_IDS)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (model / f).unlink(missing_ok=True)
    write_kimi_tokenizer(model)
    llm = LLM(model=str(model), dtype="float32", device="cpu")
    out = llm.chat([CHAT], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.apply_chat_template(CHAT)
    assert len(out.token_ids) == 6 and out.text == llm.tokenizer.decode(out.token_ids)

    with live_server(llm.engine) as server:
        reply = httpx.post(server.url("/v1/chat/completions"), timeout=30, json={
            "model": llm.engine.model_name, "messages": [{"role": "user", "content": "中文 the"}],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens"] == len(llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "中文 the"}]))
