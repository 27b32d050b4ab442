"""Statistics for the losslessness check: exact target laws by enumeration and chi-square tests.

Speculative sampling is lossless when the committed tokens are distributed exactly as plain
sampling from the target with the same filters. For a small vocabulary the joint law of the
first n generated tokens can be enumerated exactly (V^n prefixes); otherwise two samples
(speculative vs plain) are compared.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from scipy import stats

from blockspec.sampling import SamplingParams, SamplingTensors, filtered_probs


def exact_joint_law(next_token_logits, prompt: list[int], params: SamplingParams, vocab_size: int,
                    num_tokens: int) -> dict[tuple[int, ...], float]:
    """P(t1 … tn) under the filtered target, by enumerating every prefix.

    `next_token_logits(list_of_token_lists) -> [N, V]` returns the logits that follow each
    sequence (any exact forward of the target: transformers, or ours without a cache). Penalties
    and logit_bias depend on the prefix, so each prefix's logits are processed with its own
    history (`reference_processed_logits`, a direct per-sequence statement of the rule).
    """
    law: dict[tuple[int, ...], float] = {(): 1.0}
    st_one = SamplingTensors.from_params([params], "cpu")
    for _ in range(num_tokens):
        prefixes = [p for p, w in law.items() if w > 0]
        logits = next_token_logits([prompt + list(p) for p in prefixes]).float()
        if params.changes_logits:
            logits = torch.stack([reference_processed_logits(row, prompt, list(p), params)
                                  for row, p in zip(logits, prefixes)])
        st = SamplingTensors(*(t.expand(len(prefixes)) for t in (st_one.temperature, st_one.top_k,
                                                                  st_one.top_p, st_one.min_p, st_one.greedy)))
        probs = filtered_probs(logits, st).double()
        nxt = {}
        for i, p in enumerate(prefixes):
            for t in range(vocab_size):
                w = law[p] * float(probs[i, t])
                if w > 0:
                    nxt[p + (t,)] = w
        law = nxt
    return law


def reference_processed_logits(logits: torch.Tensor, prompt: list[int], output: list[int],
                               params: SamplingParams) -> torch.Tensor:
    """The logits `[V]` that follow prompt + output after logit_bias and the penalties, token by
    token as vLLM states the rule (blockspec/penalties.py): bias; repetition over every token
    seen in prompt or output; frequency · count and presence over the output's tokens."""
    z = logits.float().clone()
    for token, bias in (params.logit_bias or {}).items():
        z[token] += bias
    r = params.repetition_penalty
    for token in set(prompt) | set(output):
        z[token] = z[token] / r if z[token] > 0 else z[token] * r
    for token, count in Counter(output).items():
        z[token] -= params.frequency_penalty * count + params.presence_penalty
    return z


@dataclass
class ChiSquareResult:
    statistic: float
    dof: int
    p_value: float
    num_samples: int


def chi_square_against_law(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float],
                           min_expected: float = 5.0) -> ChiSquareResult:
    """Goodness of fit of `samples` to `law`; cells expected below `min_expected` are pooled.

    A sample outside the law's support lands in the pooled cell, so an impossible outcome
    can only raise the statistic.
    """
    n = len(samples)
    counts = Counter(samples)
    big = [c for c, p in law.items() if p * n >= min_expected]
    observed = [counts.get(c, 0) for c in big]
    expected = [law[c] * n for c in big]
    rest_obs = n - sum(observed)
    rest_exp = n - sum(expected)
    if rest_exp >= 1e-9 * n or rest_obs:
        observed.append(rest_obs)
        expected.append(max(rest_exp, 1e-12))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    dof = len(observed) - 1
    return ChiSquareResult(stat, dof, float(stats.chi2.sf(stat, dof)) if dof > 0 else 1.0, n)


def chi_square_two_sample(a: list[tuple[int, ...]], b: list[tuple[int, ...]], min_count: int = 5) -> ChiSquareResult:
    """Homogeneity test of two samples of outcomes (rare outcomes pooled)."""
    ca, cb = Counter(a), Counter(b)
    cells = [c for c in set(ca) | set(cb) if ca.get(c, 0) + cb.get(c, 0) >= 2 * min_count]
    table = [[ca.get(c, 0) for c in cells], [cb.get(c, 0) for c in cells]]
    rest = [len(a) - sum(table[0]), len(b) - sum(table[1])]
    if sum(rest) > 0:
        table[0].append(rest[0])
        table[1].append(rest[1])
    if len(table[0]) < 2:
        return ChiSquareResult(0.0, 0, 1.0, len(a) + len(b))
    chi2, p, dof, _ = stats.chi2_contingency(table)
    return ChiSquareResult(float(chi2), int(dof), float(p), len(a) + len(b))


def sample_continuations(llm, prompt: list[int], params: SamplingParams, num_samples: int,
                         num_tokens: int, seed_offset: int = 0, seeded: bool = True) -> list[tuple[int, ...]]:
    """The first `num_tokens` tokens of `num_samples` seeded requests (seeds offset + i), or of
    unseeded ones (`seeded=False`: the engine's own generator; seeded requests sample by the
    exponential race, unseeded ones through the verifiers' uniforms — blockspec/seeded_sampling.py).

    `llm` may be built with `detokenize=False`: only token ids are compared.
    """
    fields = {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                              "frequency_penalty", "repetition_penalty", "logit_bias")}
    plist = [SamplingParams(**fields, max_tokens=num_tokens, ignore_eos=True, seed=seed_offset + i if seeded else None)
             for i in range(num_samples)]
    return [tuple(o.token_ids[:num_tokens]) for o in llm.generate([prompt] * num_samples, plist)]
