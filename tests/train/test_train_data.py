"""Training data: ShareGPT parsing and split, assistant-only loss masks, packing, prompts."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from blockspec.train import data as D


@pytest.fixture(scope="module")
def hf_tok(qwen3_dir):
    return AutoTokenizer.from_pretrained(qwen3_dir)


def test_truncated_json_array_keeps_complete_items():
    text = json.dumps([{"id": "a", "n": [1, 2]}, {"id": "b"}, {"id": "c", "x": "long string"}])
    cut = text[:text.index("long") + 2]
    items, truncated = D.parse_json_array_prefix(cut)
    assert [i["id"] for i in items] == ["a", "b"] and truncated
    items, truncated = D.parse_json_array_prefix(text)
    assert len(items) == 3 and not truncated


def test_sharegpt_turns_become_messages():
    turns = [{"from": "gpt", "value": "continuation of an earlier part"},
             {"from": "system", "value": "be brief"}, {"from": "human", "value": "hi"},
             {"from": "gpt", "value": "hello"}, {"from": "human", "value": "  "}, {"from": "bard", "value": "x"}]
    assert D.sharegpt_messages(turns) == (
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "assistant", "content": "x"})


def test_held_out_split_is_stable_and_keeps_parts_together():
    ids = [f"conv{i}_{part}" for i in range(4000) for part in (0, 1)]
    held = {i for i in ids if D.is_held_out(i, 0.05)}
    assert 0.03 < len(held) / len(ids) < 0.07
    assert all((f"{i[:-2]}_0" in held) == (f"{i[:-2]}_1" in held) for i in ids)
    items = [D.Document(i, "t") for i in ids]
    train, held_items = D.split_held_out(items[::-1], 0.05)   # order does not matter
    assert {d.id for d in held_items} == held and len(train) + len(held_items) == len(ids)


def test_assistant_mask_covers_exactly_the_replies(hf_tok):
    conv = D.Conversation("c", (
        {"role": "system", "content": "You count."},
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "one, two, three"},
        {"role": "user", "content": "And the lighthouse?"},
        {"role": "assistant", "content": " The keeper climbed the stairs.\n"},
    ))
    [ex] = D.tokenize_conversations(hf_tok, [conv])
    full = hf_tok.apply_chat_template(list(conv.messages), tokenize=False)
    assert ex.input_ids.tolist() == hf_tok(full, add_special_tokens=False)["input_ids"]
    masked = ex.input_ids[ex.loss_mask].tolist()
    expected = "one, two, three<|im_end|> The keeper climbed the stairs.\n<|im_end|>"
    assert hf_tok.decode(masked) == expected
    # two contiguous runs, each ending with the end-of-turn token
    runs = torch.diff(ex.loss_mask.int(), prepend=torch.tensor([0]))
    assert int((runs == 1).sum()) == 2
    im_end = hf_tok.convert_tokens_to_ids("<|im_end|>")
    ends = [i for i in range(len(ex) - 1) if ex.loss_mask[i] and not ex.loss_mask[i + 1]]
    assert [ex.input_ids[i].item() for i in ends] == [im_end, im_end]


def test_non_incremental_template_is_refused(hf_tok):
    class Reversed:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "|".join(m["content"] for m in reversed(messages))

    conv = ({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"})
    with pytest.raises(ValueError, match="turn by turn"):
        D.assistant_spans(Reversed(), conv)


def test_documents_pack_and_window(hf_tok):
    docs = D.text_documents(["one two three four five six", "seven eight nine", "ten"])
    examples = D.tokenize_documents(hf_tok, docs)
    sep = D.separator_id(hf_tok)
    assert all(e.input_ids[-1] == sep and e.loss_mask.all() for e in examples)
    packed = D.pack_examples(examples, 5)
    assert all(len(p) <= 5 for p in packed)
    stream, whole = torch.cat([p.input_ids for p in packed]), torch.cat([e.input_ids for e in examples])
    # the stream in order; only a last window of a single token (nothing to predict) is dropped
    assert torch.equal(stream, whole[:len(stream)]) and len(whole) - len(stream) <= 1
    windows = D.window_examples(examples, 4)
    assert all(len(w) <= 4 for w in windows)
    ids, mask = D.collate(windows, pad_id=0)
    assert ids.shape == (len(windows), max(len(w) for w in windows))
    assert mask.sum() == sum(len(w) for w in windows)


def test_corpus_sources(tmp_path):
    text = tmp_path / "c.txt"
    text.write_text("first document\nstill first\n\nsecond one\n\n\nthird")
    corpus = D.load_corpus(f"text:{text}", held_out_fraction=0.0)
    assert [d.text for d in corpus.train] == ["first document\nstill first", "second one", "third"]
    chats = tmp_path / "c.jsonl"
    chats.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"},
                                                         {"role": "assistant", "content": "a"}]}) + "\n")
    corpus = D.load_corpus(f"jsonl:{chats}", held_out_fraction=0.0)
    assert corpus.is_chat and corpus.train[0].messages[1]["content"] == "a"
    for bad in ("shargpt", "text:", f"text:{tmp_path / 'missing'}"):
        with pytest.raises(ValueError, match="--data"):
            D.load_corpus(bad)


def test_first_turn_prompts(hf_tok):
    conv = D.Conversation("p", ({"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
                                {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}))
    [prompt] = D.first_turn_prompts([conv])
    assert [m["content"] for m in prompt.messages] == ["s", "q1"] and prompt.reference == "a1"
    ids = D.render_prompt(hf_tok, prompt.messages)
    assert hf_tok.decode(ids).endswith("<|im_start|>assistant\n")


def test_installed_sharegpt_and_humaneval():
    convs = D.load_sharegpt(limit=40)
    assert len(convs) == 40
    assert all(c.messages[0]["role"] in ("system", "user") and D.has_assistant_turn(c.messages) for c in convs)
    problems = D.humaneval_prompts()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"
    assert "def " in problems[0].messages[0]["content"]

