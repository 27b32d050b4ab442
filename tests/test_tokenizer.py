"""Tokenizer loading, chat templates, EOS discovery and incremental detokenization."""

from __future__ import annotations

import json
import random

import pytest
from transformers import AutoTokenizer

from blockspec.tokenizer import (CONTEXT_TOKENS, MAX_HELD_TOKENS, SLIDE_AT, IncrementalDetokenizer, Tokenizer,
                                 collect_eos_token_ids)
from fixtures import EOS_TOKEN, IM_END, IM_START, special_token_ids, write_tokenizer

MULTIBYTE_TEXT = "Crème brûlée in Zürich 😀🎉, naïve façade — 東京タワー and 北京烤鸭 🚀 déjà vu 👍🏽!"
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi, café? 😀"},
        {"role": "assistant", "content": "Bonjour."},
        {"role": "user", "content": "Count to three."}]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """Byte-level BPE, chat template in tokenizer_config.json."""
    d = tmp_path_factory.mktemp("bpe")
    write_tokenizer(d, 512)
    return d


@pytest.fixture(scope="module")
def jinja_dir(tmp_path_factory):
    """Byte-level BPE, chat template in chat_template.jinja."""
    d = tmp_path_factory.mktemp("bpe_jinja")
    write_tokenizer(d, 512, template_file=True)
    return d


@pytest.fixture(scope="module")
def bpe(bpe_dir):
    return Tokenizer.load(bpe_dir)


@pytest.fixture(scope="module")
def wordlevel(tmp_path_factory):
    d = tmp_path_factory.mktemp("wordlevel")
    write_tokenizer(d, 12)
    return Tokenizer.load(d)


def stream(tok: Tokenizer, ids: list[int], chunk_sizes=None, prompt_ids=None, skip_special_tokens=True):
    """Push `ids` through a detokenizer (one at a time, or in the given chunk sizes); return the
    detokenizer and the list of chunks it emitted, flush included."""
    detok = tok.detokenizer(prompt_ids, skip_special_tokens=skip_special_tokens)
    chunks, i = [], 0
    sizes = iter(chunk_sizes or [])
    while i < len(ids):
        n = next(sizes, 1)
        chunks.append(detok.push(ids[i:i + n]))
        i += n
    chunks.append(detok.flush())
    return detok, chunks


# ---- loading, encode/decode --------------------------------------------------------------------

def test_round_trip_and_vocabulary(bpe):
    for text in ["The lighthouse keeper counted the steps.", MULTIBYTE_TEXT, "  two  spaces\nand a tab\t."]:
        ids = bpe.encode(text)
        assert ids == bpe.encode(text, add_special_tokens=False)  # no BOS post-processor
        assert bpe.decode(ids) == text
    assert bpe.vocab_size == 512
    assert bpe.mask_token_id == 511 == special_token_ids(512)["<|MASK|>"]


def test_special_tokens_are_single_ids_and_can_be_skipped(bpe):
    ids = bpe.encode(f"{IM_START}user\nhi{IM_END}")
    specials = special_token_ids(512)
    assert ids[0] == specials[IM_START] and ids[-1] == specials[IM_END]
    assert bpe.decode(ids) == "user\nhi"
    assert bpe.decode(ids, skip_special_tokens=False) == f"{IM_START}user\nhi{IM_END}"


def test_mask_token_absent_gives_none(tmp_path):
    write_tokenizer(tmp_path, 512)
    data = json.loads((tmp_path / "tokenizer.json").read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|MASK|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    assert Tokenizer.load(tmp_path).mask_token_id is None


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="could not load"):
        Tokenizer.load(tmp_path)


# ---- EOS ids -----------------------------------------------------------------------------------

def test_eos_ids_union_of_generation_config_config_and_tokenizer(tmp_path):
    write_tokenizer(tmp_path, 512)
    specials = special_token_ids(512)
    assert Tokenizer.load(tmp_path).eos_token_ids == [specials[EOS_TOKEN]]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [specials[IM_END], 7]}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 9}))
    tok = Tokenizer.load(tmp_path)
    assert tok.eos_token_ids == [specials[IM_END], 7, 9, specials[EOS_TOKEN]]


def test_collect_eos_ids_handles_int_null_and_repeats(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 3}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": None}))
    assert collect_eos_token_ids(tmp_path, 3) == [3]
    assert collect_eos_token_ids(tmp_path, None) == [3]
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [4, 3]}))
    assert collect_eos_token_ids(tmp_path, 5) == [3, 4, 5]


# ---- chat templates ----------------------------------------------------------------------------

@pytest.mark.parametrize("dir_fixture", ["bpe_dir", "jinja_dir"])
@pytest.mark.parametrize("kwargs", [{"add_generation_prompt": True}, {"add_generation_prompt": False},
                                    {"add_generation_prompt": True, "enable_thinking": False}])
def test_render_chat_matches_transformers(request, dir_fixture, kwargs):
    model_dir = request.getfixturevalue(dir_fixture)
    ours = Tokenizer.load(model_dir).render_chat(CHAT, **kwargs)
    theirs = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(CHAT, tokenize=False, **kwargs)
    assert ours == theirs
    assert ours.startswith(f"{IM_START}system\nYou are terse.{IM_END}\n")
    if "enable_thinking" in kwargs:  # the template kwarg reached the template
        expected_end = f"{IM_START}assistant\n<think>\n\n</think>\n\n"
    elif kwargs["add_generation_prompt"]:
        expected_end = f"{IM_END}\n{IM_START}assistant\n"
    else:
        expected_end = f"three.{IM_END}\n"
    assert ours.endswith(expected_end)


def test_chat_template_file_is_really_separate(jinja_dir):
    assert (jinja_dir / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((jinja_dir / "tokenizer_config.json").read_text())


def test_apply_chat_template_does_not_add_special_tokens_twice(bpe):
    ids = bpe.apply_chat_template(CHAT)
    assert ids == bpe.encode(bpe.render_chat(CHAT), add_special_tokens=False)
    assert ids.count(special_token_ids(512)[IM_START]) == len(CHAT) + 1
    assert bpe.decode(ids, skip_special_tokens=False) == bpe.render_chat(CHAT)


def test_missing_chat_template_raises(tmp_path):
    write_tokenizer(tmp_path, 512, chat_template=False)
    tok = Tokenizer.load(tmp_path)
    assert not tok.has_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat(CHAT)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CHAT)


# ---- incremental detokenization ----------------------------------------------------------------

def test_bpe_splits_multibyte_characters(bpe):
    """Precondition of the streaming tests: some tokens hold only part of a character."""
    ids = bpe.encode(MULTIBYTE_TEXT)
    broken = [i for i in ids if "\ufffd" in bpe.decode([i])]
    assert len(broken) >= 6
    # and some token is a merge that ends inside a character (not only lone bytes)
    assert any(len(bpe.hf_tokenizer.convert_ids_to_tokens(i)) > 1 for i in broken)


def test_stream_one_token_at_a_time_never_breaks_characters(bpe):
    ids = bpe.encode(MULTIBYTE_TEXT)
    detok, chunks = stream(bpe, ids)
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == bpe.decode(ids) == MULTIBYTE_TEXT == detok.text
    assert chunks[-1] == ""  # nothing left for flush: the text ended on a whole character
    assert sum(1 for c in chunks if c == "") > 3  # held back while characters were split


def test_stream_in_random_chunks_gives_the_same_text(bpe):
    ids = bpe.encode(MULTIBYTE_TEXT * 3)
    rng = random.Random(0)
    sizes = [rng.randint(1, 5) for _ in ids]
    _, chunks = stream(bpe, ids, chunk_sizes=sizes)
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == bpe.decode(ids)


def test_stream_after_prompt_emits_only_the_continuation(bpe):
    prompt = bpe.apply_chat_template(CHAT)
    gen = bpe.encode(" Un, deux, trois 😀 東京!")
    _, chunks = stream(bpe, gen, prompt_ids=prompt)
    whole = bpe.decode(prompt + gen)
    assert "".join(chunks) == whole[len(bpe.decode(prompt)):]
    assert "".join(chunks).startswith(" Un")  # the leading space survives


@pytest.mark.parametrize("skip", [True, False])
def test_stream_with_special_tokens(bpe, skip):
    ids = bpe.encode(f"Yes 👍🏽{IM_END}{EOS_TOKEN}{IM_START}assistant\nnaïve")
    _, chunks = stream(bpe, ids, skip_special_tokens=skip)
    assert "".join(chunks) == bpe.decode(ids, skip_special_tokens=skip)
    assert (IM_END in "".join(chunks)) is (not skip)


def test_stream_needs_context_across_word_boundaries(wordlevel):
    """WordLevel decoding joins words with spaces: a token's text depends on the one before."""
    ids = wordlevel.encode("the a and of to in is")
    assert wordlevel.decode(ids[1:2]) == "a"  # alone, no space
    _, chunks = stream(wordlevel, ids)
    assert chunks[1] == " a"
    assert "".join(chunks) == wordlevel.decode(ids) == "the a and of to in is"


def test_flush_returns_a_character_cut_off_at_the_end(bpe):
    ids = bpe.encode("ok 😀")
    cut = ids[:-1]  # the emoji's last byte(s) never arrive
    assert bpe.decode(cut).endswith("\ufffd")
    detok = bpe.detokenizer()
    pushed = "".join(detok.push([i]) for i in cut)
    assert "\ufffd" not in pushed
    tail = detok.flush()
    assert pushed + tail == bpe.decode(cut) and tail.endswith("\ufffd")
    assert detok.flush() == ""


def test_invalid_bytes_are_released_after_a_bounded_wait(bpe):
    """A run of lone continuation bytes never completes a character: it must not be held forever."""
    ids = bpe.encode("😀")
    stray = next(i for i in ids[1:] if bpe.decode([i]) == "\ufffd")
    detok = bpe.detokenizer()
    pushed = [detok.push([stray]) for _ in range(3 * MAX_HELD_TOKENS)]
    assert "".join(pushed)  # released before the end
    assert "".join(pushed) + detok.flush() == bpe.decode([stray] * 3 * MAX_HELD_TOKENS)


def test_push_decodes_a_bounded_window(bpe):
    """Work per push must not grow with the sequence: record what each decode call is given."""
    seen_lengths = []

    def decode(ids):
        seen_lengths.append(len(ids))
        return bpe.decode(ids)

    ids = bpe.encode(MULTIBYTE_TEXT * 20)
    detok = IncrementalDetokenizer(decode, prompt_ids=list(range(100)))
    out = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert out == bpe.decode(ids)
    # The window: at most SLIDE_AT tokens, and the few a split character holds back.
    assert len(ids) > 400 and max(seen_lengths) <= SLIDE_AT + 4
    # One decode a push between slides (the emitted part's text is kept), two at a slide.
    slides = len(ids) / (SLIDE_AT - CONTEXT_TOKENS)
    assert len(seen_lengths) <= len(ids) + slides + 2


def test_fast_decode_path_gives_transformers_text(qwen3_dir):
    """The detokenizer's direct backend decode equals transformers' decode, special tokens
    skipped or kept (random ids, specials included)."""
    tok = Tokenizer.load(qwen3_dir)
    rng = random.Random(0)
    for skip in (True, False):
        fast = tok._backend.decoder(skip)
        for _ in range(20):
            ids = [rng.randrange(512) for _ in range(rng.randrange(1, 30))]
            assert fast(ids) == tok.hf_tokenizer.decode(ids, skip_special_tokens=skip)
