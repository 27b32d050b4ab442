"""The per-position logits seam and its penalty processor, against direct per-sequence statements:
each verify node's logits are processed with the history up to that node (prompt, committed
output, the draft path), for chains and trees; rows that ask for nothing are untouched; the
logprobs of a committed path are the raw target's log_softmax at the node that produced each
token; SamplingParams refuses bad values naming the field."""

from types import SimpleNamespace

import pytest
import torch

from blockspec.speculative.logits_processing import VerifyPositions, active_processors, path_mask, path_token_counts, process_logits
from blockspec.logprobs import path_logprobs
from blockspec.penalties import PenaltyProcessor
from blockspec.sampling import SamplingParams
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree, chain_tree
from blockspec.validation.lossless import reference_processed_logits

V = 11
# Row 0 a branching tree (node 6, 7 padding), row 1 a chain of 5 drafts (node 6, 7 padding).
PARENTS = torch.tensor([[ROOT_PARENT, 0, 0, 1, 2, 3, PAD_PARENT, PAD_PARENT],
                        [ROOT_PARENT, 0, 1, 2, 3, 4, PAD_PARENT, PAD_PARENT]])
TOKENS = torch.tensor([[3, 5, 3, 5, 9, 5, 0, 0],
                       [7, 7, 2, 7, 1, 2, 0, 0]])


def _tree(tokens=TOKENS, parents=PARENTS) -> DraftTree:
    depths = torch.zeros_like(parents)
    for i in range(1, parents.shape[1]):
        depths[:, i] = torch.where(parents[:, i] >= 0, depths.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0] + 1, 0)
    return DraftTree(tokens, parents, depths, (parents >= 0).sum(1), torch.zeros(tokens.shape, dtype=torch.float32))


def _path_tokens(tokens: list[int], parents: list[int], node: int) -> list[int]:
    """Draft tokens from the root (excluded) to `node` (included), by walking parents."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def _seq(prompt, output, **params):
    return SimpleNamespace(tokens=prompt + output, num_prompt=len(prompt), params=SamplingParams(**params),
                           request_id="r")


def test_path_counts_are_the_tokens_on_each_nodes_path():
    counts = path_token_counts(TOKENS, path_mask(PARENTS), V)
    for b in range(2):
        for i in range(6):
            want = torch.bincount(torch.tensor(_path_tokens(TOKENS[b].tolist(), PARENTS[b].tolist(), i), dtype=torch.long),
                                  minlength=V)
            assert torch.equal(counts[b, i].long(), want), (b, i)
        assert counts[b, 6:].sum() == 0  # padding positions see no drafts


SETTINGS = [dict(presence_penalty=1.5), dict(frequency_penalty=-0.7), dict(repetition_penalty=1.6),
            dict(logit_bias={5: 3.0, 2: -100.0}),
            dict(presence_penalty=0.4, frequency_penalty=1.1, repetition_penalty=0.8, logit_bias={9: -2.5})]


@pytest.mark.parametrize("params", SETTINGS)
def test_each_node_is_processed_with_its_own_history(params):
    logits = torch.randn(2, 8, V, generator=torch.Generator().manual_seed(3)) * 4
    seqs = [_seq([1, 4, 2], [3], **params), _seq([7, 7, 0], [5, 9, 7], **params)]
    got = process_logits(logits, (PenaltyProcessor(),), VerifyPositions(seqs, _tree()))
    for b, s in enumerate(seqs):
        for i in range(6):  # real nodes and the root
            history = s.tokens[s.num_prompt:] + _path_tokens(TOKENS[b].tolist(), PARENTS[b].tolist(), i)
            want = reference_processed_logits(logits[b, i], s.tokens[:s.num_prompt], history, s.params)
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=1e-5)


def test_root_only_tree_is_the_committed_history_and_plain_rows_are_untouched():
    logits = torch.randn(2, 1, V, generator=torch.Generator().manual_seed(4))
    seqs = [_seq([1, 2], [2, 6], frequency_penalty=2.0), _seq([1, 2], [2, 6])]
    positions = VerifyPositions(seqs, chain_tree(torch.zeros(2, 0, dtype=torch.long), torch.tensor([6, 6])))
    assert active_processors([PenaltyProcessor()], seqs[1:]) == ()
    got = process_logits(logits, active_processors([PenaltyProcessor()], seqs), positions)
    want = reference_processed_logits(logits[0, 0], [1, 2], [2, 6], seqs[0].params)
    torch.testing.assert_close(got[0, 0], want, rtol=0, atol=1e-6)
    assert torch.equal(got[1], logits[1])


def test_path_logprobs_are_the_raw_log_softmax_at_the_producing_node():
    logits = torch.randn(2, 8, V, generator=torch.Generator().manual_seed(5)) * 3
    path = torch.tensor([[0, 2, 4, -1], [0, 1, 2, 3]])
    committed = torch.tensor([[3, 9, 1, -1], [7, 2, 7, 4]])
    lp = path_logprobs(logits, path, committed, 4)
    for b in range(2):
        for d in range(4):
            if path[b, d] < 0:
                continue
            row = torch.log_softmax(logits[b, path[b, d]], -1)
            assert abs(lp.chosen[b, d] - row[committed[b, d]]) < 1e-6
            values, ids = row.sort(descending=True)
            torch.testing.assert_close(lp.top_values[b, d], values[:4])
            assert (lp.top_values[b, d, :-1] >= lp.top_values[b, d, 1:]).all()
            assert torch.equal(row[lp.top_ids[b, d]], lp.top_values[b, d])


@pytest.mark.parametrize("field, value", [("presence_penalty", 2.5), ("frequency_penalty", -2.01),
                                          ("presence_penalty", float("nan")), ("repetition_penalty", 0.0),
                                          ("repetition_penalty", float("inf")), ("logit_bias", {3: 100.5}),
                                          ("logit_bias", {-1: 1.0}), ("logit_bias", {"3": 1.0}),
                                          ("logit_bias", [1, 2]), ("logprobs", 21), ("logprobs", -1),
                                          ("logprobs", True)])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_engine_refuses_logit_bias_outside_the_vocabulary(qwen3_dir):
    from blockspec.llm import LLM
    llm = LLM(model=qwen3_dir, max_running_requests=2)
    vocab = llm.engine.model_config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        llm.engine.add_request("r", [1, 2], SamplingParams(logit_bias={vocab: 1.0}))
    assert not llm.engine.has_unfinished_requests()
