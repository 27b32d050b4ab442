"""CUDA graphs for the decode step: capture once per batch bucket, replay with static buffers.

What is captured is `SpeculativeStep.device_step` — for plain decoding, DFlash chains and (on
CUDA, where its search is a kernel) DDTree the whole step (drafter forward, tree, target
forward, filters, verification, K/V compaction, the drafter's new context); for host-drafted
trees (n-gram) everything after drafting — at the method's fixed verify width. The host copies
a step's inputs into the bucket's static buffers and replays; rows past the real batch are padding whose
page table is zeroed, so they read and write only page 0 (never a live sequence's pages).
A batch larger than the largest bucket runs eagerly, and the log says so.

On a CPU device nothing is captured: `__call__` runs the function on the bucket's static
buffers instead of replaying, which lets the CPU tests check the buffer handling (padding rows,
stale page tables, slicing) that the graphs rely on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from blockspec.batch import PackedStep, StepInputs, unpack_decode
from blockspec.sampling import SAMPLING_VARIANTS, sampling_variant, variant_of
from blockspec.speculative.step import packed_result
from blockspec.speculative.tree import PAD_PARENT, ROOT_PARENT, DraftTree

log = logging.getLogger("blockspec.cuda_graphs")

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def capture_graph(run, pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """`run()` twice on a side stream (Triton compiles, cuBLAS picks its kernels), then captured
    into a graph sharing `pool`. Returns the graph and the captured call's outputs (static)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph, outputs


def batch_buckets(max_bs: int) -> list[int]:
    """Captured batch sizes: the defaults up to `max_bs`, and `max_bs` itself."""
    return sorted({b for b in DEFAULT_BUCKETS if b <= max_bs} | {max_bs})


@dataclass
class _Static:
    """One bucket's input buffers (the packed step the host copies into), outputs and graph."""

    packed: PackedStep
    tree: DraftTree
    variant: str                       # SAMPLING_VARIANTS: what verification computes
    outputs: tuple | None = None       # (VerifyResult, num_nodes, the packed result rows)
    graph: torch.cuda.CUDAGraph | None = None


class GraphedStep:
    """Callable like `device_step(inputs, tree)` for batches up to the largest bucket."""

    def __init__(self, device_step, width: int, num_uniforms: int, max_pages: int, page_size: int,
                 tree_shaped: bool, drafts_on_device: bool, device: torch.device, max_bs: int,
                 share: "GraphedStep | None" = None, after_replay=None):
        """`device_step(inputs, tree | None) -> (VerifyResult, num_nodes)`; `tree_shaped`: the
        proposer builds branching trees (tree mask and compaction are always captured);
        `drafts_on_device`: the tree is made inside the step (passed as None). `share`: a
        graph set of another verify width whose memory pool, carry buffer and replay count
        this one shares (`WidthGraphs`: a step of one width may follow a step of another).
        `after_replay(rows)`: called after each graph replay of a real batch of `rows` rows
        (the plain step's deferred drafter context: `DeferredContext`)."""
        self.fn = device_step
        self.after_replay = after_replay
        self.drafts_on_device = drafts_on_device
        self.width, self.num_uniforms, self.max_pages = width, num_uniforms, max_pages
        self.page_size, self.tree_shaped, self.device = page_size, tree_shaped, device
        self.buckets = batch_buckets(max_bs)
        self.static: dict[int, _Static] = {}
        self.capture_seconds = 0.0
        self._warned: set = set()            # batch sizes and eager reasons already logged
        # Each step's next prefix and root per row, written by every bucket's graph and read by
        # the next step's (overlapped decoding: engine/overlap.py).
        self.carry = share.carry if share else torch.zeros(2, self.buckets[-1], dtype=torch.long, device=device)
        self.pool = share.pool if share else None
        self._replays = share._replays if share else [0]  # steps run, so an overlapped step can check its carry

    @property
    def replays(self) -> int:
        return self._replays[0]

    def _buffers(self, bs: int, variant: str) -> _Static:
        dev, W = self.device, self.width
        packed = PackedStep.empty(bs, self.max_pages, self.num_uniforms, dev)
        tokens = torch.zeros(bs, W, dtype=torch.long, device=dev)
        node = torch.arange(W, device=dev)
        parents = torch.where(node == 0, ROOT_PARENT, PAD_PARENT).expand(bs, W).contiguous()
        tree = DraftTree(tokens, parents, torch.zeros(bs, W, dtype=torch.long, device=dev),
                         torch.zeros(bs, dtype=torch.long, device=dev), torch.zeros(bs, W, device=dev),
                         max_depth=W - 1, is_chain=not self.tree_shaped)
        return _Static(packed, tree, variant)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first so smaller ones reuse its memory pool; each bucket
        once per sampling variant (`SAMPLING_VARIANTS`): all-greedy batches, sampled ones without
        filters, and with. What is captured starts from the packed buffers: unpacking them is
        part of the graph."""
        start = time.perf_counter()
        for bs, variant in [(bs, v) for bs in sorted(self.buckets, reverse=True) for v in SAMPLING_VARIANTS]:
            st = self._buffers(bs, variant)
            if self.device.type != "cuda":
                self.static[bs, variant] = st
                continue
            st.graph, st.outputs = capture_graph(lambda: self._step(st, bs), self.pool)
            self.pool = st.graph.pool()
            self.static[bs, variant] = st
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log.info("captured CUDA graphs for batch sizes %s at verify width %d in %.1f s",
                 self.buckets, self.width, self.capture_seconds)

    def _tree_arg(self, st: _Static) -> DraftTree | None:
        return None if self.drafts_on_device else st.tree

    def _step(self, st: _Static, bs: int):
        """What is captured: unpack the static inputs, the step, the packed result rows, and
        the carry (each row's next prefix and root) for a step launched before this one is read."""
        inputs = unpack_decode(st.packed, self.page_size, (), st.variant == "greedy", self.carry)
        inputs.sampling.filters = st.variant == "filtered"
        result, num_nodes = self.fn(inputs, self._tree_arg(st))
        self.carry[0, :bs].copy_(inputs.prefix_lens + result.accept_len + 1)
        self.carry[1, :bs].copy_(result.committed.gather(1, result.accept_len[:, None])[:, 0])
        return result, num_nodes, packed_result(result, num_nodes)

    def _replay(self, st: _Static, bs: int, rows: int | None = None) -> None:
        """Replay (on a CPU: run) bucket `bs`'s step; `rows`: the real batch's size (None: a
        timing replay, nothing follows it)."""
        self._replays[0] += 1
        if st.graph is not None:
            st.graph.replay()
            if rows is not None and self.after_replay is not None:
                self.after_replay(rows)
        else:
            st.outputs = self._step(st, bs)

    @torch.inference_mode()
    def replay_seconds(self, reps: int = 5) -> dict[tuple[int, str], float]:
        """(bucket, sampling variant) → seconds per replay of that graph on the inputs it was captured
        with (every row padding: no context, page 0), the median of `reps` replays after one,
        timed with CUDA events: the step's GPU work alone. (On a CPU, the static-buffer step on
        the wall clock.) Run before serving: the replays overwrite the carry, so no step may be
        in flight."""
        times = {}
        for (bs, variant), st in self.static.items():
            samples = []
            for i in range(reps + 1):
                if st.graph is not None:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    self._replay(st, bs)
                    end.record()
                    end.synchronize()
                    seconds = start.elapsed_time(end) / 1e3
                else:
                    begin = time.perf_counter()
                    self._replay(st, bs)
                    seconds = time.perf_counter() - begin
                if i:
                    samples.append(seconds)
            times[bs, variant] = sorted(samples)[len(samples) // 2]
        return times

    def can_run(self, batch_size: int, needs_eager: str | None = None) -> bool:
        """Whether a captured graph can take this batch. `needs_eager` (`StepInputs.needs_eager`)
        names what the graphs were captured without (logits processors, logprobs): such a batch
        runs eagerly, and the log says so once per reason."""
        if needs_eager is not None:
            if needs_eager not in self._warned:
                self._warned.add(needs_eager)
                log.info("a batch with %s runs eagerly: the CUDA graphs were captured without them", needs_eager)
            return False
        if batch_size <= self.buckets[-1]:
            return True
        if batch_size not in self._warned:
            self._warned.add(batch_size)
            log.warning("batch of %d exceeds the largest CUDA graph (%d): running eagerly",
                        batch_size, self.buckets[-1])
        return False

    def bucket_for(self, batch_size: int) -> int:
        return next(b for b in self.buckets if b >= batch_size)

    @torch.inference_mode()
    def __call__(self, inputs: StepInputs, tree: DraftTree | None):
        B = inputs.batch_size
        if inputs.packed is None:
            raise ValueError("graphed steps take decode inputs (batch.decode_inputs), which carry their packed form")
        if inputs.needs_eager is not None:
            raise ValueError(f"a step with {inputs.needs_eager} cannot replay a graph captured without them")
        st = self.static[self.bucket_for(B), variant_of(inputs.all_greedy, inputs.sampling.filters)]
        packed, stree = inputs.packed, st.tree
        P = packed.page_table.shape[1]
        if P > self.max_pages:
            raise ValueError(f"page table of {P} pages exceeds the captured {self.max_pages}")
        st.packed.page_table[:B, :P].copy_(packed.page_table)
        st.packed.page_table[B:].zero_()               # padding rows touch page 0 only
        st.packed.ints[:, :B].copy_(packed.ints)
        st.packed.ints[:, B:].zero_()                  # padding rows: no prefix, token 0
        st.packed.floats[:, :B].copy_(packed.floats)
        if tree is not None:
            for name in ("tokens", "parents", "depths", "num_nodes"):
                getattr(stree, name)[:B].copy_(getattr(tree, name))
        self._replay(st, self.bucket_for(B), B)
        result, num_nodes, _ = st.outputs
        return type(result)(**{k: v[:B] for k, v in vars(result).items() if v is not None}), num_nodes[:B]

    @torch.inference_mode()
    def launch(self, seqs, uniforms: torch.Tensor, previous_rows: list[int] | None) -> torch.Tensor:
        """Replay the step of `seqs` (drafting on the device) from host state, with nothing but
        one host→device copy (pinned, asynchronous) in front of the graph. `previous_rows[b]`:
        row b's row in the step replayed just before, whose prefix and root replace the host's.
        Returns the packed result rows `[B, 2 + 2W]` (static buffer: read before the next replay)."""
        B = len(seqs)
        bs = self.bucket_for(B)
        st = self.static[bs, sampling_variant([s.params for s in seqs])]
        host = PackedStep.empty(bs, self.max_pages, self.num_uniforms, pin=self.device.type == "cuda")
        host.fill(seqs, uniforms, previous_rows)
        st.packed.flat.copy_(host.flat, non_blocking=True)
        self._replay(st, bs, B)
        return st.outputs[2][:B]


class WidthGraphs:
    """One `GraphedStep` per verify width the speculation policy may choose (engine/spec_policy.py),
    sharing one memory pool, carry buffer and replay count. Static policy: the method's width
    only. Capture time and graph memory grow with the number of widths (logged)."""

    def __init__(self, make_step, widths: list[int], uniforms_at, plain_after_replay=None, **kwargs):
        """`make_step(width)` → the `device_step(inputs, tree)` captured at that width;
        `uniforms_at(width)`: its uniforms per row (`SpeculativeStep.uniforms_at`);
        `plain_after_replay`: the width-1 step's `after_replay`; `kwargs`: `GraphedStep`'s other
        arguments."""
        if not widths:
            raise ValueError("widths must be non-empty")
        self.by_width: dict[int, GraphedStep] = {}
        first = None
        for w in sorted(widths, reverse=True):
            graphed = GraphedStep(make_step(w), w, uniforms_at(w), share=first,
                                  after_replay=plain_after_replay if w == 1 else None, **kwargs)
            graphed.capture()
            first = first or graphed
            first.pool = graphed.pool
            self.by_width[w] = graphed
        self.capture_seconds = sum(g.capture_seconds for g in self.by_width.values())
        if len(widths) > 1:
            log.info("CUDA graphs for %d verify widths %s captured in %.1f s", len(widths), sorted(widths),
                     self.capture_seconds)

    def replay_seconds(self, reps: int = 5) -> dict[tuple[int, int, str], float]:
        """(bucket, width, sampling variant) → seconds per replay of that graph (`GraphedStep.replay_seconds`),
        for the adaptive policy's priors (`StepCostModel.set_priors`)."""
        return {(bs, width, variant): t for width, graphed in self.by_width.items()
                for (bs, variant), t in graphed.replay_seconds(reps).items()}

    def at(self, width: int) -> GraphedStep:
        if width not in self.by_width:
            raise ValueError(f"no CUDA graphs were captured at verify width {width} ({sorted(self.by_width)})")
        return self.by_width[width]

    @property
    def pool(self):
        return next(iter(self.by_width.values())).pool

    def can_run(self, batch_size: int, needs_eager: str | None = None) -> bool:
        return next(iter(self.by_width.values())).can_run(batch_size, needs_eager)
