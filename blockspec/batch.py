"""One step's device inputs, built once per step and shared by every room that needs them.

The scheduler hands the engine a list of sequences; `decode_inputs` / `prefill_inputs` turn
it into tensors with O(batch) host work. A decode step crosses to the device as one flat tensor
(`PackedStep`: the page table, the integer settings, the float settings with the uniforms), so
it costs one host→device copy (a graphed step's copy lands in its static buffer directly);
`unpack_decode` makes the step's views of them (on the device, inside the graph when graphed).
Cache slots and positions are computed on the device (`StepInputs.slots`), so the target
forward, the drafter and the verifier never rebuild them from Python lists.
Sequences are read duck-typed (`tokens`, `num_cached`, `page_table.pages`, `params`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blockspec.attention.metadata import AttentionBatch
from blockspec.sampling import SamplingTensors, any_filters
from blockspec.seeded_sampling import race_key_of


@dataclass
class StepInputs:
    """Row b of the batch; all tensors on the step's device.

    page_table  [B, P] int64  the row's pages, padded with page 0
    prefix_lens [B]    int64  tokens of the row already cached when the step starts
    new_lens    [B]    int64  tokens this step feeds per row (prefill chunk; 1 for decode)
    input_ids   [B, Q] int64  prefill: the chunk's tokens; decode: the roots `[B, 1]`
    sampling    per-row filters (SamplingTensors)
    uniforms    [B, n] float64  this step's random numbers (layout: the speculative step's)
    seqs        the scheduled sequences, host-side, for proposers that read token history
    all_greedy  host-side: every row is greedy
    packed      a decode step's device tensors these are views of (None for prefill)
    processors  host-side: the step's per-position logits processors (`logits_processing`)
    num_logprobs  host-side: alternatives to report per committed token, the most any row asks
                for (None: no row wants logprobs)
    race_keys   [B] int64  a seeded sampled row's race key (`seeded_sampling.race_key`), 0 for
                the others: seeded rows sample by the exponential race, not by the uniforms
    """

    page_table: torch.Tensor
    prefix_lens: torch.Tensor
    new_lens: torch.Tensor
    input_ids: torch.Tensor
    sampling: SamplingTensors
    uniforms: torch.Tensor
    page_size: int
    seqs: list
    all_greedy: bool = False      # every row has temperature 0 (verification needs no filters)
    packed: "PackedStep | None" = None
    processors: tuple = ()
    num_logprobs: int | None = None
    race_keys: torch.Tensor | None = None

    @property
    def needs_eager(self) -> str | None:
        """Why this step cannot replay a CUDA graph (captured without processors or logprobs), or None."""
        if self.processors:
            return "logits processors (" + ", ".join(type(p).__name__ for p in self.processors) + ")"
        return "logprobs" if self.num_logprobs is not None else None

    @property
    def batch_size(self) -> int:
        return self.prefix_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.prefix_lens.device

    @property
    def walked_rows(self) -> torch.Tensor:
        """`[B]` bool: rows verified by the walk over one-hot targets — greedy rows, and seeded
        rows, whose p is pinned to its race winner (`seeded_sampling.pin_seeded_rows`)."""
        return self.sampling.greedy if self.race_keys is None else self.sampling.greedy | (self.race_keys != 0)

    @property
    def roots(self) -> torch.Tensor:
        """`[B]` decode roots: each row's last committed token (not cached yet)."""
        return self.input_ids[:, 0]

    def positions(self, width: int) -> torch.Tensor:
        """`[B, width]` positions prefix_len … prefix_len + width − 1."""
        return self.prefix_lens[:, None] + torch.arange(width, device=self.device)[None, :]

    def slots(self, width: int, counts: torch.Tensor | None = None) -> torch.Tensor:
        """`[B, width]` cache slots of positions prefix_len … prefix_len + width − 1, computed on
        the device; entries at or past `counts[b]` (default: all valid) point to slot 0."""
        return slots_at(self.page_table, self.page_size, self.positions(width), counts)

    def attention_batch(self, width: int, new_lens: torch.Tensor, mask_kind: str,
                        new_mask: torch.Tensor | None = None, slot_counts: torch.Tensor | None = None
                        ) -> AttentionBatch:
        """Attention metadata of `width` new tokens per row after the cached prefix."""
        return AttentionBatch(self.slots(width, slot_counts), self.page_table, self.prefix_lens, new_lens,
                              new_mask, mask_kind)


def slots_at(page_table: torch.Tensor, page_size: int, positions: torch.Tensor,
             counts: torch.Tensor | None = None) -> torch.Tensor:
    """Slot of each position through the page table; offsets ≥ counts[b] → slot 0 (page 0)."""
    pages = page_table.gather(1, (positions // page_size).clamp(max=page_table.shape[1] - 1))
    slots = pages * page_size + positions % page_size
    if counts is None:
        return slots
    offsets = torch.arange(positions.shape[1], device=positions.device)[None, :]
    return torch.where(offsets < counts[:, None], slots, 0)


def page_rows(seqs) -> torch.Tensor:
    """`[B, P]` pages of every row on the host, padded with 0: a gather of the rows of the
    engine's persistent page-table store, or (tables without one) from the lists."""
    tables = [s.page_table for s in seqs]
    width = max(len(t.pages) for t in tables) or 1
    store = tables[0].store
    if store is not None and all(t.store is store and t.row is not None for t in tables):
        return store.rows([t.row for t in tables], width)
    return torch.tensor([t.pages + [0] * (width - len(t.pages)) for t in tables], dtype=torch.long)


def page_table_tensor(seqs, device) -> torch.Tensor:
    """`[B, P]` pages of every row, padded with 0, in one host→device copy."""
    return page_rows(seqs).to(device)


@dataclass
class PackedStep:
    """A decode step's inputs as one flat int64 tensor and three views of it (column b is row b),
    so a step crosses to the device in one copy.

    page_table [B, P]      int64    the rows' pages, padded with page 0
    ints       [6, B]      int64    prefix_len, root token, top_k, greedy (0/1), previous row + 1
                                    (overlapped steps: read prefix and root from that row of the
                                    step before, on the device; 0 = use these), race key (a
                                    seeded sampled row's; 0 = none)
    floats     [n + 3, B]  float64  the n uniforms, then temperature (1.0 for greedy rows), top_p,
                                    min_p — the flat tensor's bits
    Padding rows (past the real batch) are zeros: page 0, no prefix, token 0, temperature and top_p 1.
    """

    page_table: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    flat: torch.Tensor

    @classmethod
    def of_flat(cls, flat: torch.Tensor, batch: int, pages: int, num_uniforms: int) -> "PackedStep":
        table, ints, floats = flat.split([batch * pages, 6 * batch, (num_uniforms + 3) * batch])
        return cls(table.view(batch, pages), ints.view(6, batch),
                   floats.view(torch.float64).view(num_uniforms + 3, batch), flat)

    @classmethod
    def empty(cls, batch: int, pages: int, num_uniforms: int, device="cpu", pin: bool = False) -> "PackedStep":
        flat = torch.zeros(batch * (pages + 6 + num_uniforms + 3), dtype=torch.long, device=device, pin_memory=pin)
        packed = cls.of_flat(flat, batch, pages, num_uniforms)
        packed.floats[num_uniforms:num_uniforms + 2] = 1.0
        return packed

    @property
    def num_uniforms(self) -> int:
        return self.floats.shape[0] - 3

    def to(self, device, non_blocking: bool = False) -> "PackedStep":
        B, P = self.page_table.shape
        return PackedStep.of_flat(self.flat.to(device, non_blocking=non_blocking), B, P, self.num_uniforms)

    def fill(self, seqs, uniforms: torch.Tensor, previous_rows: list[int] | None = None) -> "PackedStep":
        """Rows 0…B−1 from the sequences (host tensors); the rest stay padding."""
        B = len(seqs)
        params = [s.params for s in seqs]
        table = page_rows(seqs)
        if table.shape[1] > self.page_table.shape[1]:
            raise ValueError(f"page table of {table.shape[1]} pages exceeds the {self.page_table.shape[1]} packed")
        self.page_table[:B, :table.shape[1]] = table
        # One tensor for the six integer rows and one for the three settings: each `torch.tensor`
        # and slice assignment costs µs of host time every decode step (192 µs for this at 16 rows
        # inside the engine on the H100's host, where it is the step's largest piece).
        self.ints[:, :B] = torch.tensor([[s.num_cached for s in seqs], [s.tokens[-1] for s in seqs],
                                         [p.top_k for p in params], [int(p.greedy) for p in params],
                                         [r + 1 for r in previous_rows] if previous_rows is not None else [0] * B,
                                         [race_key_of(p) for p in params]])
        n = self.num_uniforms
        self.floats[:n, :B] = uniforms.to(torch.float64).t()
        self.floats[n:, :B] = torch.tensor([[1.0 if p.greedy else p.temperature for p in params],
                                            [p.top_p for p in params], [p.min_p for p in params]],
                                           dtype=torch.float64)
        return self


def pack_decode(seqs, uniforms: torch.Tensor, device) -> PackedStep:
    """The host side of a decode step: `uniforms [B, n]` and each row's state and settings, in
    one host→device copy (not through pinned memory: pinning costs more than these few
    hundred bytes take to copy, and the step syncs once anyway)."""
    P = max(len(s.page_table.pages) for s in seqs) or 1
    return PackedStep.empty(len(seqs), P, uniforms.shape[1]).fill(seqs, uniforms).to(device)


def unpack_decode(packed: PackedStep, page_size: int, seqs=(), all_greedy: bool = False,
                  carry: torch.Tensor | None = None) -> StepInputs:
    """The decode step's `StepInputs`: views and casts of `packed`, device work only (so a CUDA
    graph captures it, and replays read whatever the static packed buffers hold). `carry`
    `[2, ≥B]`: the previous step's next prefix and root per row, read where ints[4] says."""
    ints, floats = packed.ints, packed.floats
    n = packed.num_uniforms
    # float64 → float32 rounds a Python float as `torch.tensor(x, dtype=float32)` does.
    sampling = SamplingTensors(floats[n].float(), ints[2], floats[n + 1].float(), floats[n + 2].float(),
                               ints[3].bool())
    prefix, root = ints[0], ints[1]
    if carry is not None:
        previous = ints[4] - 1
        known = previous >= 0
        from_previous = carry[:, previous.clamp(min=0)]
        prefix = torch.where(known, from_previous[0], prefix)
        root = torch.where(known, from_previous[1], root)
    return StepInputs(packed.page_table, prefix, torch.ones_like(prefix), root[:, None], sampling,
                      floats[:n].t().contiguous(), page_size, list(seqs), all_greedy, packed, race_keys=ints[5])


def decode_inputs(seqs, uniforms: torch.Tensor, page_size: int, device) -> StepInputs:
    """A decode/verify step: the roots at position num_cached of each row (whether any row
    filters is known here, on the host: `SamplingTensors.filters`)."""
    inputs = unpack_decode(pack_decode(seqs, uniforms, device), page_size, seqs,
                           all(s.params.greedy for s in seqs))
    inputs.sampling.filters = any_filters([s.params for s in seqs])
    return inputs


def prefill_inputs(seqs, chunk_lens: list[int], uniforms: torch.Tensor, page_size: int, device) -> StepInputs:
    """A prefill step: row b caches tokens num_cached … num_cached + chunk_lens[b] − 1."""
    width = max(chunk_lens)
    ids = [s.tokens[s.num_cached:s.num_cached + n] + [0] * (width - n) for s, n in zip(seqs, chunk_lens)]
    lens = torch.tensor([[s.num_cached for s in seqs], chunk_lens, [race_key_of(s.params) for s in seqs]], dtype=torch.long)
    lens = lens.to(device)
    return StepInputs(page_table_tensor(seqs, device), lens[0], lens[1],
                      torch.tensor(ids, dtype=torch.long).to(device),
                      SamplingTensors.from_params([s.params for s in seqs], device),
                      uniforms.to(device), page_size, seqs, race_keys=lens[2])
