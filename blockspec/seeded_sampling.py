"""Seeded sampling by the exponential race: the token at position n of a seeded request is

    argmax_v  p_n(v) / E_n(v),    E_n(v) = −log U(key, n, v),

with U a counter-based hash of the request's key (from its seed), the token's absolute position n
in the sequence and the vocabulary index v, mapped to (0, 1). For independent E_n(v) ~ Exp(1)
the winner is distributed exactly as p_n (the Gumbel-max trick: P(v wins) = p(v) / Σ p), and a
fresh position draws fresh noise, so the stream is an exact draw from the target, token by token.

Why seeded rows sample this way (docs/verification.md "Seeded requests"): the token at n depends
on (seed, n, p_n) only — not on how many tokens a step verifies, which drafts it was offered, or
which rows share the batch. A seeded row is therefore a *greedy row on perturbed probabilities*:
every verifier, given its p pinned to the one-hot of that winner (`pin_seeded_rows`), commits
exactly the tokens plain decoding would, so a seed repeats its stream alone or batched (given the
same p: in bf16 only with `--batch-invariant`, docs/verification.md), at any verify width, under
any speculative method, and drafts pay off when they are the drafter's own
winner of the same race (`race_scores`: the draft is argmax q_n / E_n with the same noise).

`race_key(seed)` is the per-request key (0 is reserved for "not seeded": such rows keep the
uniform-driven samplers). The hash is 32-bit murmur3 finalisation done in int64 with masks, so
that torch (CPU, CUDA) and the Triton kernel (CUDA; its interpreter on CPU in tests) compute the
same bits; the uniform keeps 24 bits, as float32 holds. The top one is capped at U_MAX: its
midpoint (2^24 − 0.5) / 2^24 rounds to 1.0 in float32, which made E = 0, a score of +inf and,
through a log-softmax, a NaN tree that read tokens from outside its row (a crashed GPU server).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MASK32 = 0xFFFFFFFF
MIX_A, MIX_B = 0x85EBCA6B, 0xC2B2AE35     # murmur3's fmix32 multipliers
_CHUNK_ELEMENTS = 1 << 22                 # [rows, V] int64 temporaries per torch chunk
U_MAX = 1.0 - 2.0 ** -24                  # the largest float32 below 1: u stays in (0, 1), so E > 0


@functools.lru_cache(maxsize=1 << 16)     # a per-request constant, read every step of every row
def race_key(seed: int) -> int:
    """A request's race key from its seed: splitmix64, kept to 62 bits and odd (never 0)."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return ((z ^ (z >> 31)) & ((1 << 62) - 1)) | 1


def races(params) -> bool:
    """Whether a request's `SamplingParams` sample by the race: seeded and not greedy."""
    return params.seed is not None and not params.greedy


def race_key_of(params) -> int:
    """The race key of a request's `SamplingParams`: its seed's for a seeded sampled request,
    0 (the uniform-driven samplers) for greedy or unseeded ones."""
    return race_key(params.seed) if races(params) else 0


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * MIX_A) & MASK32
    h = h ^ (h >> 13)
    h = (h * MIX_B) & MASK32
    return h ^ (h >> 16)


def _position_states(keys: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit states per (row, position): `keys [R]`, `positions [R, N]` → `[R, N]` each."""
    pos = _fmix32(positions.long() & MASK32)
    k = keys.long()[:, None]
    return _fmix32((k & MASK32) ^ pos), _fmix32(((k >> 32) & MASK32) ^ _fmix32(pos ^ MIX_A))


def _noise_at(s: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """E at tokens `v` from their positions' states (`_position_states`), any matching shapes."""
    h = _fmix32(_fmix32(v ^ s) ^ t)
    return -torch.log((((h >> 8).float() + 0.5) * (1.0 / (1 << 24))).clamp(max=U_MAX))


def race_noise(keys: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`E [R, N, V]` float32, E ~ Exp(1) per entry, from `keys [R]` and `positions [R, N]` (the
    reference the kernel is tested against; memory R · N · V int64)."""
    s, t = _position_states(keys, positions)
    return _noise_at(s[..., None], t[..., None], torch.arange(vocab_size, device=keys.device, dtype=torch.long))


@triton.jit
def _fmix32_tl(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@triton.jit
def _race_kernel(probs_ptr, out_ptr, keys_ptr, pos_ptr, N, V, s_pb, s_pn, s_ob, s_on,
                 SCORES: tl.constexpr, BLOCK_V: tl.constexpr, U_MAX: tl.constexpr):
    """One (row, position) per program; rows with key 0 are left alone. SCORES = False: pin the
    row of probs to the one-hot of argmax p / E (in place); True: write log p − log E."""
    pid = tl.program_id(0)
    b = pid // N
    key = tl.load(keys_ptr + b).to(tl.int64)
    if key != 0:
        pos = tl.load(pos_ptr + pid).to(tl.int64)
        mixed = _fmix32_tl(pos & 0xFFFFFFFF)
        s = _fmix32_tl((key & 0xFFFFFFFF) ^ mixed)
        t = _fmix32_tl(((key >> 32) & 0xFFFFFFFF) ^ _fmix32_tl(mixed ^ 0x85EBCA6B))
        row = probs_ptr + b.to(tl.int64) * s_pb + (pid % N).to(tl.int64) * s_pn
        out = out_ptr + b.to(tl.int64) * s_ob + (pid % N).to(tl.int64) * s_on
        best = tl.full([], -1.0, tl.float32)
        best_v = tl.full([], 0, tl.int64)
        for start in range(0, V, BLOCK_V):
            v = start + tl.arange(0, BLOCK_V)
            ok = v < V
            p = tl.load(row + v, mask=ok, other=0.0).to(tl.float32)
            h = _fmix32_tl(_fmix32_tl(v.to(tl.int64) ^ s) ^ t)
            e = -tl.log(tl.minimum(((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), U_MAX))
            if SCORES:
                tl.store(out + v, tl.log(p) - tl.log(e), mask=ok)
            else:
                score = tl.where(ok, p / e, -1.0)
                block_best = tl.max(score, axis=0)
                block_v = tl.argmax(score, axis=0).to(tl.int64) + start
                take = block_best > best
                best_v = tl.where(take, block_v, best_v)
                best = tl.where(take, block_best, best)
        if not SCORES:
            for start in range(0, V, BLOCK_V):
                v = start + tl.arange(0, BLOCK_V)
                tl.store(row + v, tl.where(v == best_v, 1.0, 0.0), mask=v < V)


def _launch(probs: torch.Tensor, out: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor, scores: bool):
    B, N, V = probs.shape
    pos = positions.contiguous()
    on_cuda = probs.device.type == "cuda"
    _race_kernel[(B * N,)](probs, out, keys.contiguous(), pos, N, V, probs.stride(0), probs.stride(1),
                           out.stride(0), out.stride(1), SCORES=scores, U_MAX=U_MAX,
                           BLOCK_V=min(4096 if on_cuda else 64, triton.next_power_of_2(V)),
                           num_warps=8 if on_cuda else 1)


def _check(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> None:
    if probs.dim() != 3 or keys.shape != probs.shape[:1] or positions.shape != probs.shape[:2]:
        raise ValueError(f"probs [B, N, V], keys [B] and positions [B, N] expected, got {tuple(probs.shape)}, "
                         f"{tuple(keys.shape)}, {tuple(positions.shape)}")
    if probs.stride(-1) != 1:
        raise ValueError("probs must be contiguous in its last dim")


def use_kernel(probs: torch.Tensor, kernel: bool | None) -> bool:
    """The Triton kernel when asked, else on CUDA; torch otherwise."""
    return probs.device.type == "cuda" if kernel is None else kernel


def race_winners(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`[B, N]` argmax_v probs / E (torch; rows with key 0 too): the reference of the kernel's pin."""
    _check(probs, keys, positions)
    B, N, V = probs.shape
    out = torch.empty(B, N, dtype=torch.long, device=probs.device)
    step = max(1, _CHUNK_ELEMENTS // max(V * N, 1))
    for r in range(0, B, step):
        e = race_noise(keys[r:r + step], positions[r:r + step], V)
        out[r:r + step] = (probs[r:r + step].float() / e).argmax(-1)
    return out


# A chunk whose support is at most this share of its entries races on its support alone
# (`race_winners_on_support`); a fuller one hashes every token (three index columns a positive
# entry would cost more than the dense noise).
SPARSE_SHARE = 0.25


def _support_noise(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor):
    """(the entries with p > 0 as index columns, their E: `race_noise`'s bits there), or None
    when they are more than SPARSE_SHARE of `probs [R, N, V]` (the dense race is then the cheaper)."""
    positive = probs > 0
    if int(positive.sum()) > SPARSE_SHARE * positive.numel():
        return None
    b, n, v = positive.nonzero(as_tuple=True)
    s, t = _position_states(keys, positions)
    return (b, n, v), _noise_at(s[b, n], t[b, n], v)


def race_winners_on_support(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`race_winners` (the same tokens), in row chunks of ≤ _CHUNK_ELEMENTS entries (as the
    dense race), each from the noise of its tokens with p > 0 only when they are few
    (SPARSE_SHARE): a token with p = 0 scores 0 and never beats one with p > 0, and among equal
    scores the smallest index wins, as argmax picks. A position with no positive p gets token 0,
    as argmax does."""
    B, N, V = probs.shape
    out = torch.empty(B, N, dtype=torch.long, device=probs.device)
    step = max(1, _CHUNK_ELEMENTS // max(V * N, 1))
    for r in range(0, B, step):
        p, k, pos = probs[r:r + step], keys[r:r + step], positions[r:r + step]
        support = _support_noise(p, k, pos)
        if support is None:
            out[r:r + step] = race_winners(p, k, pos)
            continue
        rows = p.shape[0]
        (b, n, v), e = support
        score = p[b, n, v].float() / e
        flat = b * N + n
        best = torch.full((rows * N,), -1.0, device=probs.device).scatter_reduce(0, flat, score, "amax")
        first = torch.full((rows * N,), V, dtype=torch.long, device=probs.device)
        first = first.scatter_reduce(0, flat, torch.where(score == best[flat], v, V), "amin")
        out[r:r + step] = torch.where(first == V, 0, first).view(rows, N)
    return out


def pin_seeded_rows(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                    kernel: bool | None = None) -> torch.Tensor:
    """`probs [B, N, V]` (filtered target or drafter distributions) with each seeded row (key ≠ 0)
    replaced, in place, by the one-hot of its race winner at each position; `positions [B, N]`:
    the absolute position of the token each distribution is for. Every verifier is exact for a
    one-hot p and commits its token (module docstring). Returns `probs`. `kernel`: the Triton
    kernel (default: on CUDA; tests run it under the interpreter) or torch."""
    _check(probs, keys, positions)
    if use_kernel(probs, kernel):
        _launch(probs, probs, keys, positions, scores=False)
        return probs
    rows = (keys != 0).nonzero()[:, 0]          # the torch path runs on the CPU: no graph to keep
    if rows.numel():
        winners = race_winners_on_support(probs[rows], keys[rows], positions[rows])
        probs[rows] = torch.zeros_like(probs[rows]).scatter_(-1, winners[..., None], 1.0)
    return probs


def race_scores(probs: torch.Tensor, keys: torch.Tensor, positions: torch.Tensor,
                kernel: bool | None = None) -> torch.Tensor:
    """`[B, N, V]` float32 log p − log E for seeded rows (−inf where p = 0), log p for the others:
    ranking a seeded row's tokens by it ranks them in the order of its race (its first is the
    winner; the first k are k draws without replacement from p). `kernel` as `pin_seeded_rows`."""
    _check(probs, keys, positions)
    out = torch.log(probs.float())
    if use_kernel(probs, kernel):
        _launch(probs, out, keys, positions, scores=True)
        return out
    for r in (keys != 0).nonzero()[:, 0].tolist():
        support = _support_noise(probs[r:r + 1], keys[r:r + 1], positions[r:r + 1])
        if support is None:
            out[r] -= torch.log(race_noise(keys[r:r + 1], positions[r:r + 1], probs.shape[-1]))[0]
            continue
        (_, n, v), e = support                    # (−inf where p = 0 whatever the noise)
        out[r, n, v] -= torch.log(e)
    return out


__all__ = ["race_key", "races", "race_key_of", "race_noise", "race_winners", "race_winners_on_support", "pin_seeded_rows",
           "race_scores",
           "use_kernel"]
