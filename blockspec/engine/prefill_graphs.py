"""CUDA graphs for short prefills: one per (rows, chunk width) bucket, captured at startup.

An eager prefill of a short prompt is all host: hundreds of launches (a Triton launch alone costs
tens of microseconds of Python), about 15 ms for the bundled pair on an H200 against 0.4 ms of
GPU work (bench/prefill_profile.py). Replaying a graph costs one launch. A prefill step of up to
`max(PREFILL_ROWS)` rows whose chunks fit the widest bucket pads to its bucket (buckets past
twice the prefill token budget are not captured: the scheduler never fills them):

- columns past a row's chunk are padding: `new_lens` marks them, so their K/V (and the
  drafter's context) go to page 0's slot 0 and their queries' outputs are never read;
- rows past the real batch prefill one token at position 0 through an all-zero page table, so
  they too touch page 0 only.

A real row's queries attend only to its own earlier positions, so padding never reaches them.
What is captured is the engine's own `prefill_and_sample` (target forward, the drafter's context,
the filtered draw of each row's next token). Longer or wider prefills run eagerly. On a CPU
device nothing is captured: calls run the function on the bucket's static buffers, which lets
the CPU tests check the padding.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from blockspec.batch import StepInputs
from blockspec.engine.cuda_graphs import capture_graph
from blockspec.sampling import SamplingTensors, filtered_probs, sample_from_probs
from blockspec.seeded_sampling import pin_seeded_rows

log = logging.getLogger("blockspec.cuda_graphs")

# Up to the prefill token budget: a prompt wider than the widest captured width prefills eagerly,
# and on the H100 15 % of the held-out ShareGPT prompts (257–380 tokens for the bundled pair) did,
# one by one as speculative requests finished at different steps (≈ 15 ms of launches each).
PREFILL_WIDTHS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
PREFILL_ROWS = (1, 2, 4, 8, 16)


def prefill_and_sample(runner, proposer, inputs: StepInputs) -> torch.Tensor:
    """Cache each row's chunk, feed the drafter its context, and draw each row's next token
    `[B]` from its filtered distribution (rows whose prompt is not complete drop theirs)."""
    logits, features, batch, positions = runner.prefill(inputs)
    if proposer is not None:
        proposer.on_prefill(features, batch, positions)
    return sample_after_prefill(logits, inputs)


def sample_after_prefill(logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
    """Each row's next token `[B]` from the chunk's last logits `[B, V]` (processed): a draw from
    the filtered distribution, or a seeded row's race winner at the position after the chunk."""
    probs = filtered_probs(logits, inputs.sampling)
    if inputs.race_keys is not None:
        after = (inputs.prefix_lens + inputs.new_lens)[:, None]
        probs = pin_seeded_rows(probs[:, None], inputs.race_keys, after)[:, 0]
    return sample_from_probs(probs, inputs.uniforms[:, 0])


@dataclass
class _PrefillStatic:
    """One bucket's inputs: ids `[B, W]`, page table `[B, P]`, ints `[5, B]` (prefix, chunk
    length, top_k, greedy, race key), floats `[4, B]` (uniform, temperature, top_p, min_p); the drawn
    tokens `[B]`."""

    input_ids: torch.Tensor
    page_table: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    tokens: torch.Tensor | None = None
    graph: torch.cuda.CUDAGraph | None = None

    def inputs(self, page_size: int) -> StepInputs:
        sampling = SamplingTensors(self.floats[1].float(), self.ints[2], self.floats[2].float(),
                                   self.floats[3].float(), self.ints[3].bool())
        return StepInputs(self.page_table, self.ints[0], self.ints[1], self.input_ids, sampling,
                          self.floats[:1].t(), page_size, [], race_keys=self.ints[4])


class GraphedPrefill:
    """Callable like `prefill_and_sample(runner, proposer, inputs)` for prefills that fit a bucket."""

    def __init__(self, runner, proposer, max_pages: int, page_size: int, max_tokens: int, device: torch.device):
        self.runner, self.proposer = runner, proposer
        self.max_pages, self.page_size, self.device = max_pages, page_size, device
        self.widths = [w for w in PREFILL_WIDTHS if w <= max_tokens]
        self.buckets = [(r, w) for r in PREFILL_ROWS for w in self.widths if r * w <= 2 * max(max_tokens, 256)]
        self.static: dict[tuple[int, int], _PrefillStatic] = {}
        self.capture_seconds = 0.0

    def _buffers(self, rows: int, width: int) -> _PrefillStatic:
        dev = self.device
        ints = torch.zeros(5, rows, dtype=torch.long, device=dev)
        ints[1] = 1                                   # padding rows: one token at position 0
        floats = torch.zeros(4, rows, dtype=torch.float64, device=dev)
        floats[1:3] = 1.0                             # temperature, top_p
        return _PrefillStatic(torch.zeros(rows, width, dtype=torch.long, device=dev),
                              torch.zeros(rows, self.max_pages, dtype=torch.long, device=dev), ints, floats)

    def _run(self, st: _PrefillStatic) -> torch.Tensor:
        return prefill_and_sample(self.runner, self.proposer, st.inputs(self.page_size))

    @torch.inference_mode()
    def capture(self, pool=None):
        """Capture every bucket (widest first, sharing `pool`, e.g. the decode graphs'); returns the pool."""
        start = time.perf_counter()
        for rows, width in sorted(self.buckets, key=lambda b: -b[0] * b[1]):
            st = self._buffers(rows, width)
            self.static[rows, width] = st
            if self.device.type != "cuda":
                continue
            st.graph, st.tokens = capture_graph(lambda: self._run(st), pool)
            pool = st.graph.pool()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log.info("captured %d prefill CUDA graphs (rows %s × widths %s) in %.1f s", len(self.buckets),
                 list(PREFILL_ROWS), self.widths, self.capture_seconds)
        return pool

    def bucket_for(self, rows: int, width: int) -> tuple[int, int] | None:
        """The smallest captured bucket holding `rows` × `width` (fewest padded tokens)."""
        fits = [b for b in self.buckets if b[0] >= rows and b[1] >= width]
        return min(fits, key=lambda b: (b[0] * b[1], b[1])) if fits else None

    @torch.inference_mode()
    def __call__(self, inputs: StepInputs) -> torch.Tensor | None:
        """The drawn tokens `[B]`, or None when no bucket takes this prefill (run it eagerly)."""
        B, W = inputs.input_ids.shape
        P = inputs.page_table.shape[1]
        bucket = self.bucket_for(B, W)
        if bucket is None or P > self.max_pages:
            return None
        st = self.static[bucket]
        st.input_ids[:B, :W].copy_(inputs.input_ids)
        st.page_table.zero_()
        st.page_table[:B, :P].copy_(inputs.page_table)
        s = inputs.sampling
        st.ints[:, :B].copy_(torch.stack([inputs.prefix_lens, inputs.new_lens, s.top_k, s.greedy.long(),
                                          inputs.race_keys]))
        st.ints[:, B:] = st.ints.new_tensor([0, 1, 0, 0, 0])[:, None]
        st.floats[:, :B].copy_(torch.stack([inputs.uniforms[:, 0].double(), s.temperature.double(),
                                            s.top_p.double(), s.min_p.double()]))
        if st.graph is not None:
            st.graph.replay()
        else:
            st.tokens = self._run(st)
        return st.tokens[:B]
