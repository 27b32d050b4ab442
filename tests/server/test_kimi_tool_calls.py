"""Kimi K2's tool-call format on its own: whole replies, streams fed in every split, the format
chosen from the tokenizer, the markers kept by the detokenizer, and the grammar of `required` /
named walked on the tiny Kimi vocabulary (the markers by id, never as spelled-out text)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from blockspec.grammar.mask import unpack_bitmask
from blockspec.grammar.matcher import GrammarCompiler
from blockspec.server.hermes_tool_calls import HermesToolFormat
from blockspec.server.kimi_tool_calls import (ARGUMENT_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END,
                                              KimiToolFormat)
from blockspec.server.tool_formats import tool_format_for
from blockspec.tokenizer import Tokenizer
from test_tool_call_parsing import feed_in_pieces
from kimi_fixtures import BASE, TOOL_MARKERS, write_kimi_tokenizer

KIMI = KimiToolFormat({t: i for i, t in TOOL_MARKERS.items()})


def call(name: str, index: int, args: str = '{"a": 1}') -> str:
    return f"{CALL_BEGIN}functions.{name}:{index}{ARGUMENT_BEGIN}{args}{CALL_END}"


def section(*calls: str, sep: str = "") -> str:
    return SECTION_BEGIN + sep + sep.join(calls) + sep + SECTION_END


def plain(text: str) -> str:
    """`text` as decoding without tools shows it: the markers (special tokens) dropped."""
    for marker in (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END):
        text = text.replace(marker, "")
    return text


BAD_JSON = section(call("f", 0, "{not json"))
REPLIES = {  # reply: (content, [(id, name)]); content never holds a marker
    "one call": (section(call("f", 0)), None, [("functions.f:0", "f")]),
    "several calls, newlines": (section(call("f", 0), call("get_time", 1), sep="\n"), None,
                                [("functions.f:0", "f"), ("functions.get_time:1", "get_time")]),
    "text then call": ("Let me check.  \n" + section(call("f", 3)), "Let me check.", [("functions.f:3", "f")]),
    "no prefix in the header": (section(f"{CALL_BEGIN}f:0{ARGUMENT_BEGIN}" + '{"a": 1}' + CALL_END), None,
                                [("f:0", "f")]),
    "string arguments": (section(call("f", 0, '"{\\"a\\": 1}"')), None, [("functions.f:0", "f")]),
    "no calls keeps text": ("  hello <|tool_calls  ", "  hello <|tool_calls  ", []),
    "bad json stays content": ("x " + BAD_JSON + " y", "x " + plain(BAD_JSON) + " y", []),
    "bad header stays content": (section(call("f g", 0)), plain(section(call("f g", 0))), []),
    "text inside a section": (section(call("f", 0), "hm"), plain(section(call("f", 0), "hm")), []),
    "empty section": ("a " + section(), "a ", []),
    "unclosed section": ("x " + SECTION_BEGIN + call("f", 0), "x " + plain(call("f", 0)), []),
    "stray marker": ("x" + CALL_END + "y " + section(call("f", 0)), "xy", [("functions.f:0", "f")]),
}


@pytest.mark.parametrize("name", list(REPLIES))
def test_whole_and_streamed_replies_agree(name):
    text, content, expected = REPLIES[name]
    got_content, calls = KIMI.parse(text)
    assert got_content == content and plain(got_content or "") == (got_content or "")
    assert [(c["id"], c["function"]["name"]) for c in calls] == expected
    for c in calls:
        assert json.loads(c["function"]["arguments"]) == {"a": 1}
    for size in (1, 2, 7, len(text)):
        assert feed_in_pieces(KIMI, text, size) == (content or "", [(c["id"], c["function"]["name"], c["function"]["arguments"])
                                                           for c in calls])


def test_finish_reason_and_hermes_text_is_not_kimi():
    assert KIMI.reply(section(call("f", 0)), "stop")[1] == "tool_calls"
    assert KIMI.reply(section(call("f", 0)), "length")[1] == "length"
    hermes = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert KIMI.parse(hermes) == (hermes, [])
    assert HermesToolFormat().parse(section(call("f", 0))) == (section(call("f", 0)), [])  # Hermes drops nothing


def test_format_is_chosen_from_the_tokenizer(tmp_path):
    kimi = Tokenizer.load(write_kimi_tokenizer(tmp_path / "kimi"))
    fmt = tool_format_for(kimi)
    assert isinstance(fmt, KimiToolFormat) and fmt.marker_ids == tuple(sorted(TOOL_MARKERS))
    assert isinstance(tool_format_for(Tokenizer.load(write_kimi_tokenizer(tmp_path / "plain", tool_markers=False))),
                      HermesToolFormat)
    partial = json.loads((tmp_path / "kimi" / "tokenizer_config.json").read_text())
    del partial["added_tokens_decoder"][str(BASE + 12)]
    (tmp_path / "kimi" / "tokenizer_config.json").write_text(json.dumps(partial))
    with pytest.raises(ValueError, match=r"<\|tool_call_end\|>"):
        tool_format_for(Tokenizer.load(tmp_path / "kimi"))


def test_detokenizer_keeps_only_the_markers(tmp_path):
    tok = Tokenizer.load(write_kimi_tokenizer(tmp_path / "kimi"))
    ids = tok.encode(section(call("f", 0))) + [BASE + 2, BASE + 100] + tok.encode(" ok")
    assert tok.decode(ids) == 'functions.f:0{"a": 1} ok'   # plain decoding drops every special token
    detok = tok.detokenizer([BASE + 4], kept_special_ids=KIMI.marker_ids)
    text = "".join(detok.push([i]) for i in ids) + detok.flush()
    assert text == section(call("f", 0)) + " ok"           # the markers, but not <|im_end|> or reserved ids
    assert KIMI.parse(text)[1][0]["function"]["name"] == "f"


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def _walk(compiler: GrammarCompiler, spec, stop: int, seed: int, max_steps: int = 200) -> list[int]:
    """Random allowed tokens until the grammar ends (the stop token not included)."""
    grammar = compiler.matcher(spec, {stop})
    bitmask = torch.zeros(1, compiler.bitmask_words, dtype=torch.int32)
    rng, out = random.Random(seed), []
    for _ in range(max_steps):
        grammar.fill_committed(bitmask, 0)
        allowed = unpack_bitmask(bitmask, compiler.vocab_size)[0].nonzero().flatten().tolist()
        if not out:  # the reply must open with the section marker token, not '<' spelled out
            assert allowed == [BASE + 8]
        # prefer ending a string or object so that walks stay short
        token = next((t for t in allowed if t in (stop, ord('"'), ord("}"))), None) if rng.random() < 0.3 else None
        token = rng.choice(allowed) if token is None else token
        if token == stop:
            return out
        grammar.accept([token])
        out.append(token)
    raise AssertionError("the walk did not end")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_grammar_forces_marker_tokens_on_the_kimi_vocabulary(tmp_path, choice):
    tok = Tokenizer.load(write_kimi_tokenizer(tmp_path / "kimi"))
    compiler = GrammarCompiler(tok, tok.vocab_size)
    spec = KIMI.call_grammar(TOOLS, choice, False)
    specials = set(tok.special_token_ids.values())
    for seed in range(4):
        ids = _walk(compiler, spec, BASE + 2, seed)
        assert {i for i in ids if i in specials} <= set(TOOL_MARKERS)  # no other special token, e.g. in a string
        text = tok.detokenizer(kept_special_ids=KIMI.marker_ids).push(ids)
        content, calls = KIMI.parse(text)
        assert content is None and len(calls) == 1, text
        name = calls[0]["function"]["name"]
        assert name == "get_weather" if isinstance(choice, dict) else name in ("get_weather", "get_time")
        if name == "get_weather":
            jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER)
    assert KIMI.call_grammar(TOOLS, "auto", None) is None and KIMI.call_grammar(TOOLS, "none", None) is None


@pytest.mark.parametrize("parallel", [False, None])
def test_required_grammar_allows_more_calls_only_when_parallel(tmp_path, parallel):
    tok = Tokenizer.load(write_kimi_tokenizer(tmp_path / "kimi"))
    compiler = GrammarCompiler(tok, tok.vocab_size)
    grammar = compiler.matcher(KIMI.call_grammar(TOOLS, "required", parallel), {BASE + 2})
    one = tok.encode(section(call("get_time", 0, '{"zone": "UTC"}')))[:-1]  # up to the section's end
    grammar.accept(one)
    bitmask = torch.zeros(1, compiler.bitmask_words, dtype=torch.int32)
    grammar.fill_committed(bitmask, 0)
    allowed = unpack_bitmask(bitmask, compiler.vocab_size)[0].nonzero().flatten().tolist()
    assert allowed == ([BASE + 9] if parallel is False else [BASE + 9, BASE + 10])  # section end / next call
