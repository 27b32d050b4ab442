"""logit_bias and the presence / frequency / repetition penalties, as a per-position logits
processor (docs/logits_processing.md).

The rule is vLLM's, in vLLM's order, on float32 logits z of one position:
1. logit_bias: z[t] += bias[t];
2. repetition_penalty r (vLLM's extension, 1 = off), over every token seen in the prompt or the
   output so far: z[t] / r where z[t] > 0, z[t] · r otherwise;
3. frequency_penalty f (OpenAI): z[t] −= f · c[t], c[t] = occurrences of t in the output so far;
4. presence_penalty p (OpenAI): z[t] −= p · [c[t] > 0].
Presence and frequency count generated tokens only, repetition the prompt too (as vLLM and
OpenAI do). "So far" means the history of *that* position: the committed output plus the
draft tokens on the path to the verify node (`VerifyPositions`), so every verify position gets
exactly the logits plain decoding would have had there. Temperature and the filters come after.
"""

from __future__ import annotations

import torch

from blockspec.speculative.logits_processing import VerifyPositions, token_counts


def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor, seen: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """Steps 2-4 of the module docstring: logits `[B, W, V]` float32, output_counts `[B, W, V]`
    int (output occurrences before each position), seen `[B, W, V]` bool (in the prompt or the
    output before the position), presence / frequency / repetition `[B]` float32 -> `[B, W, V]`."""
    r = torch.where(seen, repetition[:, None, None], 1.0)
    logits = torch.where(logits > 0, logits / r, logits * r)
    logits = logits - frequency[:, None, None] * output_counts
    return logits - presence[:, None, None] * (output_counts > 0)


def dense_bias(biases: list[dict[int, float] | None], vocab: int, device) -> torch.Tensor:
    """`[B, V]` float32 logit_bias rows from sparse host dicts, in one host→device copy of the
    (id, value) pairs (rows padded with the out-of-vocabulary id V, a dropped column)."""
    width = max((len(b or ()) for b in biases), default=0)
    ids = torch.full((len(biases), width), vocab, dtype=torch.int64)
    values = torch.zeros(len(biases), width, dtype=torch.float32)
    for row, bias in enumerate(biases):
        for col, (token, value) in enumerate((bias or {}).items()):
            ids[row, col], values[row, col] = token, value
    dense = torch.zeros(len(biases), vocab + 1, dtype=torch.float32, device=device)
    return dense.scatter_(1, ids.to(device), values.to(device))[:, :vocab]


class PenaltyProcessor:
    """logit_bias and the three penalties for the rows that set any (`SamplingParams.changes_logits`);
    other rows' logits are returned unchanged, bit for bit."""

    def wants(self, params) -> bool:
        return params.changes_logits

    def __call__(self, logits: torch.Tensor, positions: VerifyPositions) -> torch.Tensor:
        seqs, device = positions.seqs, logits.device
        vocab = logits.shape[-1]
        params = [s.params for s in seqs]
        column = lambda name: torch.tensor([getattr(p, name) for p in params], dtype=torch.float32).to(device)  # noqa: E731
        active = torch.tensor([p.changes_logits for p in params]).to(device)[:, None, None]
        prompt = token_counts([s.tokens[:s.num_prompt] for s in seqs], vocab, device) > 0          # [B, V]
        output = token_counts([s.tokens[s.num_prompt:] for s in seqs], vocab, device)              # [B, V]
        counts = output[:, None, :] + positions.path_counts(vocab)                                # [B, W, V]
        seen = prompt[:, None, :] | (counts > 0)
        biased = logits.float() + dense_bias([p.logit_bias for p in params], vocab, device)[:, None, :]
        penalised = apply_penalties(biased, counts, seen, column("presence_penalty"), column("frequency_penalty"),
                                    column("repetition_penalty"))
        return torch.where(active, penalised, logits.float())
