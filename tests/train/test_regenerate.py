"""Target-regenerated drafter data: batched (left-padded) greedy replies equal the target's own
unbatched greedy replies, one pass per temperature, every user turn as a prompt, shards that
split the prompt list, held-out chats never used, and bad arguments refused with exit code 2."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blockspec.train import data as D
from blockspec.train import regenerate as R

CHATS = [
    [("user", "Tell me about the sea."), ("assistant", "It is wide."), ("user", "And the sky?"),
     ("assistant", "Blue.")],
    [("user", "Write a short poem about a lighthouse keeper"), ("assistant", "The lamp.")],
    [("system", "Be brief."), ("user", "Hello"), ("assistant", "Hi.")],
    [("user", "What is two plus two?"), ("assistant", "Four.")],
]
MAX_NEW = 6


@pytest.fixture(scope="module")
def chats_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("regen") / "chats.jsonl"
    ids = [f"c{i}" for i in range(40) if not D.is_held_out(f"c{i}")][:len(CHATS)]
    held = next(f"h{i}" for i in range(1000) if D.is_held_out(f"h{i}"))
    rows = [{"id": i, "messages": [{"role": r, "content": c} for r, c in chat]} for i, chat in zip(ids, CHATS)]
    rows.append({"id": held, "messages": [{"role": "user", "content": "secret"},
                                          {"role": "assistant", "content": "never seen"}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, ids


def run(tmp_path, qwen3_dir, chats, *extra) -> list[dict]:
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}.jsonl"
    assert R.main(["--target", qwen3_dir, "--out", str(out), "--data", f"jsonl:{chats}", "--device", "cpu",
                   "--max-new-tokens", str(MAX_NEW), "--batch", "3", *extra]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def greedy_reply(model, tok, messages) -> str:
    ids = D.render_prompt(tok, messages)
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                             eos_token_id=model.generation_config.eos_token_id, pad_token_id=tok.pad_token_id)
    return tok.decode(gen[0, len(ids):], skip_special_tokens=True).strip()


def test_every_user_turn_one_pass_per_temperature(tmp_path, qwen3_dir, chats_file):
    chats, ids = chats_file
    rows = run(tmp_path, qwen3_dir, chats, "--prompts", "all", "--temperatures", "0,1")
    prompts = [p for i in ids for p in D.user_turn_prompts(
        next(c for c in D.load_jsonl_conversations(chats) if c.id == i))]
    assert len(prompts) == 5
    expected = {f"{p.id}:t{t}" for p in prompts for t in ("0", "1")}
    assert {r["id"] for r in rows} <= expected and len(rows) == len({r["id"] for r in rows})
    assert all(D.split_group(r["id"]) in ids for r in rows)     # derived ids split with their chat
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    greedy = {r["id"]: r for r in rows if r["id"].endswith(":t0")}
    assert len(greedy) >= 3, "the tiny model gave too many empty replies to compare"
    for p in prompts:
        row = greedy.get(f"{p.id}:t0")
        if row is None:
            assert greedy_reply(model, tok, p.messages) == ""
            continue
        assert row["messages"][:-1] == list(p.messages)
        assert row["messages"][-1] == {"role": "assistant", "content": greedy_reply(model, tok, p.messages)}


def test_shards_split_the_prompts(tmp_path, qwen3_dir, chats_file):
    chats, ids = chats_file
    whole = run(tmp_path, qwen3_dir, chats, "--temperatures", "0")
    parts = [run(tmp_path, qwen3_dir, chats, "--temperatures", "0", "--shard", f"{k}/2") for k in range(2)]
    assert sorted(r["id"] for r in whole) == sorted(r["id"] for part in parts for r in part)
    assert {r["id"] for r in whole} <= {f"{i}:t0" for i in ids}
    assert not set(r["id"] for r in parts[0]) & set(r["id"] for r in parts[1])


@pytest.mark.parametrize("bad, message", [
    (["--shard", "2/2"], "--shard"), (["--shard", "x"], "--shard"), (["--prompts", "some"], "--prompts"),
    (["--temperatures", "-1"], "--temperatures"), (["--batch", "0"], "--batch"), (["--dtype", "half"], "--dtype"),
    (["--temperatures", "x"], "--temperatures"), (["--temperatures", "0.6:0"], "--temperatures"),
    (["--temperatures", "0.6:1.5"], "--temperatures"), (["--temperatures", "0:0.9"], "--temperatures"),
    (["--temperatures", "1,"], "--temperatures"), (["--temperatures", "nan"], "--temperatures"),
])
def test_bad_arguments_exit_2(tmp_path, qwen3_dir, chats_file, capsys, bad, message):
    chats, _ = chats_file
    with pytest.raises(SystemExit) as exc:
        R.main(["--target", qwen3_dir, "--out", str(tmp_path / "o.jsonl"), "--data", f"jsonl:{chats}",
                "--device", "cpu", *bad])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_parse_temperatures():
    assert R.parse_temperatures("0,0.6:0.95,1") == [(0.0, 1.0), (0.6, 0.95), (1.0, 1.0)]
    assert R.parse_temperatures("0,1", default_top_p=0.9) == [(0.0, 1.0), (1.0, 0.9)]
    assert [R.sample_tag(*t) for t in R.parse_temperatures("0,0.6:0.95,1")] == ["t0", "t0.6p0.95", "t1"]


def test_top_p_items_sample_with_their_nucleus(tmp_path, qwen3_dir, chats_file, monkeypatch):
    """Each item's top_p reaches generate (and its tag the ids); T alone samples with top_p 1."""
    chats, ids = chats_file
    seen = []
    real = AutoModelForCausalLM.from_pretrained

    def spy_model(*args, **kwargs):
        model = real(*args, **kwargs)
        generate = model.generate

        def spy(**kw):
            seen.append((kw["temperature"], kw["top_p"], kw["do_sample"]))
            return generate(**kw)
        model.generate = spy
        return model
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy_model)
    rows = run(tmp_path, qwen3_dir, chats, "--temperatures", "0.6:0.5,1")
    assert set(seen) == {(0.6, 0.5, True), (1.0, 1.0, True)}
    assert {r["id"].rsplit(":", 1)[1] for r in rows} <= {"t0.6p0.5", "t1"}
    assert any(r["id"].endswith(":t0.6p0.5") for r in rows)


def test_fit_prompt_keeps_what_fits(qwen3_dir):
    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    chat = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "alpha " * 30},
            {"role": "assistant", "content": "beta " * 30}, {"role": "user", "content": "Tell me about the sea."})
    assert R.fit_prompt(tok, chat, 10_000) == (chat, D.render_prompt(tok, chat))
    last = len(D.render_prompt(tok, chat[-1:]))
    fitted, _ = R.fit_prompt(tok, chat, last + 3)
    assert fitted == chat[-1:]                          # oldest turns dropped, never starting with the assistant
    cut, cut_ids = R.fit_prompt(tok, chat[-1:], last - 3)
    assert cut_ids == D.render_prompt(tok, cut)
    assert len(D.render_prompt(tok, cut)) <= last - 3 and chat[-1]["content"].endswith(cut[0]["content"].strip())
