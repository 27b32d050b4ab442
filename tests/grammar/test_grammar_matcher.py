"""The grammar module on its own: specs, the per-node masks of a draft tree, bitmask unpacking,
pruning. Masks are checked against fresh xgrammar matchers fed each node's path."""

from __future__ import annotations

import pytest
import torch
import xgrammar as xgr

from blockspec.grammar.mask import mask_logits, prune_tree, unpack_bitmask
from blockspec.grammar.matcher import ALL_ALLOWED, GrammarCompiler
from blockspec.grammar.processor import nodes_to_keep
from blockspec.structured_output import StructuredOutput, bounded_strings_as_patterns
from blockspec.speculative.tree import PAD_PARENT, DraftTree, chain_tree
from blockspec.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}},
          "required": ["a", "b"]}


@pytest.fixture(scope="module")
def tokenizer(qwen3_dir) -> Tokenizer:
    return Tokenizer.load(qwen3_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, 512)


def _fresh_mask(compiler, spec, stop, prefix: list[int]) -> torch.Tensor | None:
    """The mask after `prefix` from a new matcher, or None if the grammar refuses the prefix."""
    m = xgr.GrammarMatcher(compiler.compile(spec), override_stop_tokens=stop)
    if not all(m.accept_token(t) for t in prefix):
        return None
    bitmask = torch.full((1, compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    m.fill_next_token_bitmask(bitmask, 0)
    return unpack_bitmask(bitmask, 512)[0]


def test_walk_tree_masks_equal_fresh_matchers_along_each_path(tokenizer, compiler):
    spec = StructuredOutput("json", SCHEMA)
    eos = 508
    good = tokenizer.encode('{"a": 12, "b": "xy"}', add_special_tokens=False)
    # Two branches share the prefix '{"a": 1'; a third starts with a forbidden token; a fourth
    # puts a node under the forbidden one; padding in the middle.
    tokens = [0, good[0], good[1], good[2], tokenizer.encode("x", add_special_tokens=False)[0], 7, good[1], 0, eos]
    parents = [-1, 0, 1, 2, 2, 0, 5, PAD_PARENT, 0]
    grammar = compiler.matcher(spec, {eos})
    bitmask = torch.full((len(tokens), compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    allowed = grammar.walk_tree(tokens, parents, bitmask, 0)
    masks = unpack_bitmask(bitmask, 512)

    assert allowed == [True, True, True, True, False, False, False, False, False]
    for node in range(len(tokens)):
        path, i = [], node
        while i > 0:
            path.insert(0, tokens[i])
            i = parents[i]
        want = _fresh_mask(compiler, spec, [eos], path) if parents[node] != PAD_PARENT else None
        if allowed[node]:
            assert torch.equal(masks[node], want), node
        else:
            assert masks[node].all(), node       # never sampled from: left all-allowed
    # Rolled back: the matcher is where it started (the root's mask, and it takes the good text).
    again = torch.full((1, compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    grammar.fill_committed(again, 0)
    assert torch.equal(unpack_bitmask(again, 512)[0], masks[0])
    grammar.accept(good + [eos])
    assert grammar.terminated


def test_stop_token_only_when_complete_and_refused_token_raises(tokenizer, compiler):
    eos = 508
    grammar = compiler.matcher(StructuredOutput("regex", "ab"), {eos})
    bitmask = torch.full((1, compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    grammar.fill_committed(bitmask, 0)
    assert not unpack_bitmask(bitmask, 512)[0, eos]
    grammar.accept(tokenizer.encode("ab", add_special_tokens=False))
    grammar.fill_committed(bitmask, 0)
    assert unpack_bitmask(bitmask, 512)[0].nonzero().flatten().tolist() == [eos]
    with pytest.raises(RuntimeError, match="refused"):
        grammar.accept(tokenizer.encode("z", add_special_tokens=False))


def test_unpack_bitmask_matches_xgrammar_and_mask_logits():
    gen = torch.Generator().manual_seed(0)
    vocab = 77
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 3), generator=gen, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(3, vocab, generator=gen)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask, vocab_size=vocab)
    allowed = unpack_bitmask(bitmask, vocab)
    assert allowed.shape == (3, vocab)
    assert torch.equal(mask_logits(logits[None], allowed[None])[0], want)


def test_prune_tree_and_keep_rules():
    tokens = torch.tensor([[5, 1, 2, 3, 4]])
    parents = torch.tensor([[-1, 0, 1, 0, 3]])
    tree = DraftTree(tokens, parents, torch.tensor([[0, 1, 2, 1, 2]]), torch.tensor([4]),
                     torch.zeros(1, 5), max_depth=2)
    allowed = torch.tensor([[True, True, False, False, False]])  # node 2 and node 3 forbidden (4 under 3)
    point_mass = nodes_to_keep(allowed, parents, sampled_drafts=False)
    sampled = nodes_to_keep(allowed, parents, sampled_drafts=True)
    assert point_mass.tolist() == [[True, True, False, False, False]]
    # Sampled drafts keep a forbidden child of an allowed node (its rejection counts), not below it.
    assert sampled.tolist() == [[True, True, True, True, False]]
    pruned = prune_tree(tree, point_mass)
    assert pruned.parents.tolist() == [[-1, 0, PAD_PARENT, PAD_PARENT, PAD_PARENT]]
    assert pruned.num_nodes.tolist() == [1] and pruned.tokens.tolist() == [[5, 1, 0, 0, 0]]
    chain = chain_tree(torch.tensor([[1, 2, 3]]), torch.tensor([9]))
    cut = prune_tree(chain, torch.tensor([[True, True, False, False]]))
    assert cut.is_chain and cut.num_nodes.tolist() == [1]
    assert torch.equal(cut.parents, chain_tree(torch.tensor([[1, 2, 3]]), torch.tensor([9]), torch.tensor([1])).parents)


@pytest.mark.parametrize("kind, value, message", [
    ("json", {"type": "foo"}, "invalid JSON schema: Unsupported type"),
    ("json", {"type": "string", "pattern": "[a-"}, "invalid JSON schema"),
    ("regex", "[a-", "invalid regex"),
    ("grammar", 'root ::= "a" | b', "invalid EBNF grammar"),
    ("choice", [], "non-empty list"),
    ("regex", 3, "must be a str"),
    ("yaml", "x", "unknown kind"),
])
def test_bad_specs_are_value_errors_naming_the_field(kind, value, message):
    with pytest.raises(ValueError, match=message) as info:
        StructuredOutput(kind, value, field="response_format")
    assert str(info.value).startswith("response_format: ")


def _byte_token(tokenizer, byte: int) -> int:
    """The byte-level BPE token of one byte (GPT-2's printable stand-ins for bytes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    char = chr(byte) if byte in printable else chr(256 + others.index(byte))
    return tokenizer.hf_tokenizer.convert_tokens_to_ids(char)


def test_bounded_strings_emit_only_valid_json_text(tokenizer, compiler):
    """A maxLength string compiled as xgrammar lowers it takes a raw TAB (invalid JSON); the
    rewritten schema does not, bounds the length, and refuses overlong UTF-8 (F0 8A …), which
    a negated character class would let through and which decodes to U+FFFD."""
    raw = xgr.GrammarMatcher(compiler.compiler.compile_json_schema({"type": "string", "maxLength": 3}),
                             terminate_without_stop_token=True)
    assert raw.accept_string('"a\tb"')  # the upstream hole this rewrite closes
    ours = compiler.compile(StructuredOutput("json", {"type": "string", "maxLength": 3}))
    for text, ok in (('"a\tb"', False), ('"abc"', True), ('"abcd"', False), ('"é😀"', True), ('"a"b"', False),
                     ('"a\\\\b"', False), ('"[~]"', True)):
        m = xgr.GrammarMatcher(ours, terminate_without_stop_token=True)
        assert (m.accept_string(text) and m.is_completed()) == ok, text
    m = xgr.GrammarMatcher(ours, terminate_without_stop_token=True)
    assert m.accept_string('"') and m.accept_token(_byte_token(tokenizer, 0xF0))
    assert not m.accept_token(_byte_token(tokenizer, 0x8A))   # overlong: refused
    assert m.accept_token(_byte_token(tokenizer, 0x9F))       # U+1F600's second byte: fine
    nested = bounded_strings_as_patterns({"type": "object", "properties": {"maxLength": {"type": "string", "minLength": 2}}})
    pattern = nested["properties"]["maxLength"].pop("pattern")
    assert nested == {"type": "object", "properties": {"maxLength": {"type": "string"}}}
    assert pattern.startswith("^[") and pattern.endswith("]{2,}$")


def test_guided_chain_drafts_are_the_masked_argmax_along_the_chain(tokenizer, compiler):
    spec = StructuredOutput("json", SCHEMA)
    grammar = compiler.matcher(spec, {508})
    logits = torch.randn(12, 512, generator=torch.Generator().manual_seed(1))
    scratch = torch.full((1, compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    drafts = grammar.guided_argmax(logits, scratch, lambda m: unpack_bitmask(m, 512)[0])
    prefix: list[int] = []
    for k, token in enumerate(drafts):
        mask = _fresh_mask(compiler, spec, [508], prefix)
        assert token == int(logits[k].masked_fill(~mask, float("-inf")).argmax()), k
        prefix.append(token)
    again = torch.full((1, compiler.bitmask_words), ALL_ALLOWED, dtype=torch.int32)
    grammar.fill_committed(again, 0)  # rolled back: still at the start
    assert torch.equal(unpack_bitmask(again, 512)[0], _fresh_mask(compiler, spec, [508], []))
