"""Structured output through the engine: greedy speculative ≡ plain greedy under a JSON schema
(n-gram and DFlash chains, DDTree trees, both verifiers), every output parses and validates
(greedy and sampled), and a constrained request leaves its unconstrained neighbours alone."""

from __future__ import annotations

import json

import jsonschema
import pytest

from blockspec.structured_output import StructuredOutput
from blockspec.llm import LLM
from blockspec.sampling import SamplingParams
from dflash_fixtures import write_dflash_drafter

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
                         "ok": {"type": "boolean"}},
          "required": ["name", "n", "tags", "ok"]}
PROMPTS = ["The lighthouse keeper", "Farmers brought cheese"]
MODES = {
    "dflash": dict(spec="dflash", block_size=4),
    "dflash-rejection": dict(spec="dflash", block_size=4, spec_verify="rejection"),
    "ddtree": dict(spec="ddtree", block_size=4, budget=8, topk=2),
    "ddtree-rejection": dict(spec="ddtree", block_size=4, budget=8, topk=2, spec_verify="rejection"),
    "dflash-sampled-trees": dict(spec="dflash", block_size=4, sampled_trees=True),
}


@pytest.fixture(scope="module")
def drafter(qwen3_dir, tmp_path_factory) -> str:
    return str(write_dflash_drafter(tmp_path_factory.mktemp("grammar_drafter"), qwen3_dir, block_size=8))


@pytest.fixture(scope="module")
def engines(qwen3_dir, drafter):
    """`engines(mode)`: one LLM per mode for the module (None: plain decoding)."""
    built: dict = {}

    def get(mode: str | None) -> LLM:
        if mode not in built:
            settings = dict(MODES[mode]) if mode else {}
            if settings.get("spec") in ("dflash", "ddtree"):
                # Static: the grammar's cuts are what is under test, at every step (the adaptive
                # policy parks a random drafter's rows at plain once its drafts are cut or rejected).
                settings.update(draft_model=drafter, spec_policy="static")
            built[mode] = LLM(model=qwen3_dir, dtype="float32", device="cpu", **settings)
        return built[mode]
    return get


@pytest.fixture(scope="module")
def plain(engines) -> LLM:
    return engines(None)


def constrained(temperature: float, seed: int | None = None, **kw) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=64, seed=seed,
                          structured_output=StructuredOutput("json", SCHEMA), **kw)


def assert_valid(outputs) -> None:
    for o in outputs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), SCHEMA)


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_speculative_equals_plain_under_a_schema(engines, plain, mode):
    want = plain.generate(PROMPTS, constrained(0.0))
    assert_valid(want)
    llm = engines(mode)
    got = llm.generate(PROMPTS, constrained(0.0))
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert LLM.aggregate_metrics(got).drafted_tokens > 0
    # Sampled rows too: every output of the constrained distribution parses and validates.
    assert_valid(llm.generate(PROMPTS, [constrained(1.0, seed=i) for i in range(len(PROMPTS))]))
    assert llm.engine.allocator.num_used_pages == 0


def test_greedy_rows_beside_sampled_trees_keep_plain_output_under_a_schema(engines, plain):
    """DFlash with sampled trees: a constrained greedy row beside sampled rows drafts its plain
    argmax chain (the grammar's guided chain is for all-greedy batches), cut by the grammar
    where it must be: still plain's output."""
    want = plain.generate(PROMPTS, constrained(0.0))
    llm = engines("dflash-sampled-trees")
    mixed = llm.generate(PROMPTS + PROMPTS, [constrained(0.0)] * len(PROMPTS)
                         + [constrained(1.0, seed=i) for i in range(len(PROMPTS))])
    assert [o.token_ids for o in mixed[:len(PROMPTS)]] == [o.token_ids for o in want]
    assert_valid(mixed)


def test_unconstrained_neighbours_are_unchanged(engines):
    """A batch mixing constrained and free rows: the free rows get exactly their solo output."""
    llm = engines("ddtree")
    free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPTS, free)
    mixed = llm.generate(PROMPTS + PROMPTS, [free] * len(PROMPTS) + [constrained(0.0)] * len(PROMPTS))
    assert [o.token_ids for o in mixed[:len(PROMPTS)]] == [o.token_ids for o in alone]
    assert_valid(mixed[len(PROMPTS):])


def test_a_grammar_needs_a_stop_token(plain):
    spec = StructuredOutput("regex", "[a-z]+")
    with pytest.raises(ValueError, match="stop token"):
        plain.generate(PROMPTS[:1], SamplingParams(max_tokens=8, ignore_eos=True, structured_output=spec))
    assert not plain.engine.has_unfinished_requests()
    out = plain.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=8, structured_output=spec,
                                                     ignore_eos=True, stop_token_ids=[508]))[0]
    assert out.text.isalpha() or out.finish_reason == "length"


def test_choice_and_regex(plain):
    out = plain.generate(PROMPTS, SamplingParams(temperature=1.0, seed=3, max_tokens=16,
                                                 structured_output=StructuredOutput("choice", ["yes", "no way"])))
    assert {o.text for o in out} <= {"yes", "no way"} and all(o.finish_reason == "stop" for o in out)
    out = plain.generate(PROMPTS, SamplingParams(temperature=1.0, seed=4, max_tokens=16,
                                                 structured_output=StructuredOutput("regex", r"[0-9]{3}-[a-c]{2}")))
    import re
    assert all(re.fullmatch(r"[0-9]{3}-[a-c]{2}", o.text) for o in out), [o.text for o in out]
