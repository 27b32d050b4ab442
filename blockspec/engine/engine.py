"""The engine: requests in, per-step outputs out.

request → scheduler → step inputs (`batch.py`) → runner → model (through the attention backend)
→ speculative step (draft → verify → accept) → output. This file composes them and owns what
happens on the host after a step: committing tokens, stops, detokenization.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from blockspec.attention.backend import select_backend
from blockspec.batch import decode_inputs, prefill_inputs
from blockspec.engine.config import EngineConfig
from blockspec.engine.outputs import SpecMetrics, StepOutput
from blockspec.engine.overlap import InFlightStep, launch_decode
from blockspec.engine.prefill_graphs import GraphedPrefill, prefill_and_sample, sample_after_prefill
from blockspec.engine.runner import ModelRunner
from blockspec.engine.scheduler import Scheduler
from blockspec.engine.spec_policy import SpecPolicy
from blockspec.engine.target import target_for
from blockspec.engine.sequence import Sequence, Status
from blockspec.engine.stops import first_stop_string, stop_prefix_holdback, token_stop_reason
from blockspec.grammar.matcher import GrammarCompiler
from blockspec.grammar.processor import GrammarProcessor
from blockspec.kv.allocator import PageAllocator, PageTable
from blockspec.kv.page_table import PageTableStore
from blockspec.speculative.logits_processing import VerifyPositions, active_processors, process_logits, root_only_tree
from blockspec.logprobs import pack_logprobs, path_logprobs, unpack_logprobs
from blockspec.models.loader import parse_device, parse_dtype
from blockspec.models.registry import load_config
from blockspec.penalties import PenaltyProcessor
from blockspec.sampling import SamplingParams
from blockspec.seeded_sampling import races
from blockspec.speculative.step import SpeculativeStep, StepResult, resolve_verify_rule
from blockspec.tokenizer import Tokenizer

log = logging.getLogger("blockspec.engine")


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_tokens_used: int
    kv_tokens_total: int


@dataclass
class _RequestState:
    """Host-side output state of one request: detokenizer and text already streamed."""

    seq: Sequence
    detok: object
    stop_ids: set[int]
    text: str = ""          # all text decoded so far (stop strings cut)
    emitted: int = 0        # characters of `text` already handed out


class Engine:
    """Synchronous engine; one thread drives it (the server wraps it in a background thread)."""

    def __init__(self, config: EngineConfig, proposer=None, target=None):
        """`proposer` overrides the one `config.spec` names (custom drafters, tests). `target`: a
        target already loaded for this config (tests share one tensor-parallel target between
        engines: `blockspec.parallel.workers.start_tensor_parallel`); its owner closes it."""
        config.validate()
        self.config = config
        self.device = parse_device(config.device)
        self.attention_backend = select_backend(config.attention_backend, self.device, config.batch_invariant)
        self.model_config = load_config(config.model)
        self.parallel = config.tensor_parallel_size > 1
        self.owns_target = target is None
        self.model = target_for(config, self.device, self.attention_backend, target)
        self.tokenizer = Tokenizer.load(config.model)
        self.model_name = Path(config.model).name
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.spec_algorithm = config.spec
        self.proposer = proposer
        if proposer is None and config.spec != "none":
            from blockspec.speculative.proposers import build_proposer
            self.proposer = build_proposer(config, self.model_config)
        if hasattr(self.proposer, "width_blocks"):
            # "auto": a block of the width off CUDA, where the drafter's cost grows with its block;
            # the whole block on CUDA, where it hardly does and the longer block drafts better.
            self.proposer.width_blocks = config.draft_block == "width" or (
                config.draft_block == "auto" and self.device.type != "cuda")
            log.info("narrower verify widths draft %s", "a block of their width" if self.proposer.width_blocks
                     else "the whole block, cut")
        # Cache positions a decode step writes past the committed length: the verify width and
        # the drafter's block.
        lookahead = max(1 + self.proposer.max_nodes, self.proposer.block_size) if self.proposer else 1
        # Overlapped decoding keeps one step in flight past the one the host has read: a
        # request then reserves two steps' lookahead.
        overlap_wanted = self.device.type == "cuda" and config.cuda_graph and config.overlap_schedule
        self.lookahead = lookahead
        self.reserved_lookahead = lookahead * (2 if overlap_wanted else 1)
        # By default every running request can reach the full context plus its lookahead
        # (capped at 32k tokens, but never below what a single request may need).
        per_request = self.max_model_len + self.reserved_lookahead
        kv_tokens = config.kv_cache_tokens or max(min(config.max_running_requests * per_request, 32768), per_request)
        num_pages = -(-kv_tokens // config.page_size) + 1  # whole pages holding kv_tokens, + reserved page 0
        self.allocator = PageAllocator(num_pages, config.page_size)
        # Rows for every request that may hold pages at once; columns for a full context + lookahead.
        self.page_tables = PageTableStore(config.max_running_requests,
                                          -(-(self.max_model_len + self.reserved_lookahead) // config.page_size))
        spec = self.model.cache_spec
        allocate = self.model.allocate_cache if self.parallel else spec.allocate
        self.cache = allocate(num_pages, config.page_size, parse_dtype(config.dtype), self.device)
        self.kv_bytes_per_token = spec.bytes_per_token(parse_dtype(config.dtype))
        log.info("K/V cache: %s, %d bytes per token (%s), %d tokens", type(spec).__name__, self.kv_bytes_per_token,
                 config.dtype, (num_pages - 1) * config.page_size)
        if self.proposer:
            self.proposer.load(self.model, num_pages, config.page_size, self.attention_backend)
        capture = self.proposer.target_layer_ids if self.proposer else ()
        self.runner = ModelRunner(self.model, self.cache, self.device, tuple(capture))
        self.verify_rule = resolve_verify_rule(config.spec_verify, self.proposer)
        self.spec_step = SpeculativeStep(self.proposer, self.verify_rule, self.device)
        # Each step's verify width (plain, a shorter chain, a smaller tree), chosen from the past
        # only (engine/spec_policy.py; static: always the full width).
        from blockspec.engine.cuda_graphs import batch_buckets
        self.policy = SpecPolicy(config.spec_policy, self.spec_step.full_width, self.proposer.builds_trees,
                                 batch_buckets(config.max_running_requests),
                                 greedy_chains=self.proposer.greedy_chains) if self.proposer else None
        if self.policy:
            self.policy.context_pending = self.proposer.context_pending
        # Per-position transforms of the target's logits (docs/logits_processing.md); a step runs
        # the ones its requests ask for. The grammar's mask comes last: nothing after it may lift
        # a forbidden token off −inf.
        self.logits_processors: list = [PenaltyProcessor(), GrammarProcessor(self.model_config.vocab_size)]
        self._grammar_compiler = None  # built for the first constrained request
        self.graphed = self.capture_graphs() if self.device.type == "cuda" and config.cuda_graph else None
        if self.graphed is not None and self.policy is not None and len(self.policy.widths) > 1:
            # What each width's step costs the GPU, per bucket, before the first request: the
            # policy estimates a width it has not timed from these (engine/spec_policy.py).
            self.policy.cost.set_priors(self.graphed.replay_seconds())
            log.info("step GPU time per bucket and width (ms): %s", self.policy.cost.format_priors())
        self.graphed_prefill = None
        prefill_width = min(config.max_prefill_tokens, self.max_model_len)   # the widest prefill chunk
        if self.graphed is not None:
            self.graphed_prefill = GraphedPrefill(self.runner, self.proposer, self.page_tables.max_pages,
                                                  config.page_size, prefill_width, self.device)
            self.graphed_prefill.capture(self.graphed.pool)
        if self.device.type == "cuda":
            from blockspec.engine.warmup import warm_up_prefill
            warm_up_prefill(self.runner, self.proposer, config.page_size, prefill_width)
        if getattr(self.proposer, "deferred", None) is not None:     # its writes: shapes the warm-up compiled
            self.proposer.deferred.max_write_rows = prefill_width
        self.overlap = overlap_wanted and self.graphed is not None and self.spec_step.drafts_on_device
        if self.policy is not None:
            self.policy.overlapped = self.overlap
        if overlap_wanted and not self.overlap:
            log.info("overlapped decoding is off: %s", "drafts are made on the host" if self.graphed else "no CUDA graphs")
        self.scheduler = Scheduler(self.allocator, config.max_running_requests, config.max_prefill_tokens, lookahead,
                                   steps_ahead=1 if self.overlap else 0)
        self.in_flight: InFlightStep | None = None
        self.generator = torch.Generator().manual_seed(config.seed)    # unseeded sampled requests' uniforms
        self.eos_ids = set(self.tokenizer.eos_token_ids) | set(self.model_config.eos_token_ids)
        self._requests: dict[str, _RequestState] = {}
        self._arrivals = 0

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent); the engine is unusable after."""
        if not self.parallel:
            return
        if self.owns_target:
            self.model.close()
        else:
            self.model.free_cache(self.cache)

    def capture_graphs(self):
        """CUDA graphs of the decode step (plain decoding is a verify of width 1): one set per
        verify width the policy may choose (`WidthGraphs`), so adaptive steps replay too."""
        from blockspec.engine.cuda_graphs import WidthGraphs
        kwargs = dict(uniforms_at=self.spec_step.uniforms_at, max_pages=self.page_tables.max_pages,
                      page_size=self.config.page_size, tree_shaped=bool(self.proposer and self.proposer.builds_trees),
                      drafts_on_device=self.spec_step.drafts_on_device, device=self.device,
                      max_bs=min(self.config.cuda_graph_max_bs, self.config.max_running_requests))
        make = lambda w: lambda inputs, tree: self.spec_step.device_step(self.runner, inputs, tree, width=w)  # noqa: E731
        return WidthGraphs(make, self.policy.widths if self.policy else [1],
                           plain_after_replay=self.proposer.after_plain_replay if self.proposer else None, **kwargs)

    # ---- requests -------------------------------------------------------------------------
    def _verify_label(self, params) -> str:
        """What `spec_decoding.verify` reports for a request with these params."""
        if self.spec_algorithm == "none":
            return "none"
        return "greedy" if params.greedy else self.verify_rule

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt is empty")
        vocab = self.model_config.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias keys must be token ids in [0, {vocab}), got {max(params.logit_bias)}")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) "
                             f"exceeds the context length of {self.max_model_len} tokens")
        capacity = self.allocator.num_usable_pages * self.allocator.page_size
        if total + self.reserved_lookahead > capacity:
            raise ValueError(f"prompt + max_tokens ({total}) + the speculative step's lookahead "
                             f"({self.reserved_lookahead}) "
                             f"does not fit the K/V cache ({capacity} tokens); raise kv_cache_tokens")
        seq = Sequence(request_id, list(prompt_token_ids), params, PageTable(self.allocator.page_size, store=self.page_tables),
                       self._arrivals,
                       metrics=SpecMetrics(algorithm=self.spec_algorithm, verify=self._verify_label(params)))
        self._arrivals += 1
        if params.stop and not self.config.detokenize:
            raise ValueError("stop strings need detokenization, which this engine has turned off")
        stop_ids = set(params.stop_token_ids or []) | (set() if params.ignore_eos else self.eos_ids)
        detok = (self.tokenizer.detokenizer(list(prompt_token_ids), kept_special_ids=params.kept_special_token_ids)
                 if self.config.detokenize else None)
        if params.structured_output is not None:
            seq.grammar = self.grammar_compiler().matcher(params.structured_output, stop_ids)
        self._requests[request_id] = _RequestState(seq, detok, stop_ids)
        self.scheduler.add(seq)

    def grammar_compiler(self) -> GrammarCompiler:
        """The engine's grammar compiler (structured output), made on first use."""
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        return self._grammar_compiler

    def abort_request(self, request_id: str) -> None:
        state = self._requests.pop(request_id, None)
        if state is not None:
            self.scheduler.remove(state.seq)
            if self.policy:
                self.policy.forget(request_id)
            state.seq.status = Status.FINISHED
            state.seq.finish_reason = "abort"

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or self.in_flight is not None

    def stats(self) -> EngineStats:
        page = self.allocator.page_size
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting),
                           self.allocator.num_used_pages * page, self.allocator.num_usable_pages * page)

    # ---- one step -------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        if self.in_flight is not None and not (self.scheduler.can_decode_without_preempting()
                                               and self.graphed.can_run(len(self.scheduler.running))
                                               and self._step_options(self.scheduler.running) == ((), None)):
            # The batch is about to change beyond rows leaving: read the step in flight first.
            return self._finish_in_flight()
        scheduled = self.scheduler.schedule()
        if scheduled is None:
            return self._finish_in_flight() if self.in_flight is not None else []
        if scheduled.kind == "prefill":
            return self._prefill_step(scheduled.seqs, scheduled.chunk_lens)
        return self._decode_step(scheduled.seqs)

    def _prefill_step(self, seqs: list[Sequence], chunk_lens: list[int]) -> list[StepOutput]:
        if self.proposer:   # plain steps' deferred drafter context lands before the prompt's
            self.proposer.flush_context()
        samples = [s.num_cached + n == s.prefill_target and s.num_output == 0 for s, n in zip(seqs, chunk_lens)]
        inputs = prefill_inputs(seqs, chunk_lens, self._uniforms(seqs, 1, samples), self.cache.page_size, self.device)
        inputs.processors, inputs.num_logprobs = self._step_options(seqs)
        # Every row is sampled (fixed shapes); rows whose prompt is not fully cached drop theirs.
        if inputs.processors or inputs.num_logprobs is not None:
            tokens, logprobs = self._prefill_with_options(seqs, inputs)
        else:
            drawn = self.graphed_prefill(inputs) if self.graphed_prefill is not None else None
            if drawn is None:
                drawn = prefill_and_sample(self.runner, self.proposer, inputs)
            tokens, logprobs = drawn.tolist(), [None] * len(seqs)
        for s, n in zip(seqs, chunk_lens):
            s.num_cached += n
        if self.policy:     # the next decode step's interval holds this prefill: not a step cost
            self.policy.interrupt()
        return [self._commit(self._requests[s.request_id], [t], lps)
                for s, t, lps, do in zip(seqs, tokens, logprobs, samples) if do]

    def _prefill_with_options(self, seqs: list[Sequence], inputs) -> tuple[list[int], list]:
        """A prefill whose rows want logits processors or logprobs (eager: the processors read
        host-side history). The sample follows the prompt: the seam's root-only position,
        history = the prompt."""
        raw_logits, features, batch, positions = self.runner.prefill(inputs)
        if self.proposer:
            self.proposer.on_prefill(features, batch, positions)
        roots = torch.tensor([s.tokens[-1] for s in seqs], device=self.device)
        logits = process_logits(raw_logits[:, None], inputs.processors, VerifyPositions(seqs, root_only_tree(roots)))
        tokens = sample_after_prefill(logits[:, 0], inputs)
        if inputs.num_logprobs is None:
            return tokens.tolist(), [None] * len(seqs)
        # One host copy for the tokens and their log-probabilities.
        lp = path_logprobs(raw_logits[:, None], torch.zeros_like(tokens)[:, None], tokens[:, None], inputs.num_logprobs)
        rows = torch.cat([tokens[:, None].double(), pack_logprobs(lp)], dim=1).tolist()
        tokens = [int(row[0]) for row in rows]
        return tokens, [unpack_logprobs(row[1:], [t], 1, inputs.num_logprobs) for row, t in zip(rows, tokens)]

    def _decode_step(self, seqs: list[Sequence]) -> list[StepOutput]:
        """Draft (if speculating), verify in one target forward, commit, roll back the rest.
        Overlapped: launch this step, then commit the one in flight (engine/overlap.py)."""
        width = self.policy.choose(seqs) if self.policy else 1
        if width > 1 and self.proposer.context_pending():
            # The drafter reads its context: plain steps' deferred writes first, timed for the
            # policy (a switch into speculation pays them: engine/spec_policy.py).
            start = time.perf_counter()
            self.proposer.flush_context()
            self.policy.observe_flush(time.perf_counter() - start)
        uniforms = self._uniforms(seqs, self.spec_step.uniforms_at(width), [True] * len(seqs))
        processors, num_logprobs = self._step_options(seqs)
        # The graphs carry no processor or logprob state (StepInputs.needs_eager).
        graphable = not processors and num_logprobs is None
        graphed = self.graphed.at(width) if self.graphed is not None else None
        if self.overlap and graphable and self.graphed.can_run(len(seqs)):
            launched = launch_decode(graphed, seqs, uniforms, self.in_flight)
            launched.width = width
            outputs = self._finish_in_flight(next_width=width) if self.in_flight is not None else []
            self.in_flight = launched
            return outputs
        inputs = decode_inputs(seqs, uniforms, self.cache.page_size, self.device)
        inputs.processors, inputs.num_logprobs = processors, num_logprobs
        step = self.spec_step.run(self.runner, inputs, graphed, width if self.policy else None)
        outputs = self._commit_step(seqs, step, width)
        if self.policy:     # after the commit, whose host time is part of the step's cost
            self.policy.observe(seqs, width, step)
        return outputs

    def _finish_in_flight(self, next_width: int | None = None) -> list[StepOutput]:
        """Read and commit the step in flight. Rows whose request finished or was aborted
        meanwhile are dropped (that request's output is complete). `next_width`: the width of
        the step launched just before (its launch is inside this step's timed interval); None: a
        drain (nothing launched), whose step is not timed."""
        if next_width is None and self.policy:
            # The step was launched before the last commit, so the interval since then holds only
            # the rest of its wait: timed, it read 0.3 ms against a 12 ms step on the CPU
            # (bench/drain_timing.py).
            self.policy.interrupt()
        flight, self.in_flight = self.in_flight, None
        step = flight.result()
        live = [i for i, s in enumerate(flight.seqs)
                if (state := self._requests.get(s.request_id)) is not None and state.seq is s]
        outputs = self._commit_step([flight.seqs[i] for i in live], step.rows(live), flight.width)
        if self.policy:     # after the commit, whose host time is part of the step's cost
            self.policy.observe(flight.seqs, flight.width, step, next_width=next_width)
        return outputs

    def _commit_step(self, seqs: list[Sequence], step: StepResult, width: int) -> list[StepOutput]:
        outputs = []
        logprobs = step.logprobs or [None] * len(seqs)
        name = self.policy.name(width) if self.proposer else None
        chain_name = self.policy.name(width, greedy=True) if self.proposer else None
        for s, committed, accepted, drafted, lps in zip(seqs, step.committed, step.accepted, step.drafted, logprobs):
            self.scheduler.commit_decode(s, accepted + 1)   # the root and the accepted drafts are cached
            out = self._commit(self._requests[s.request_id], committed, lps)
            if name is not None:
                # Committed = what was kept: a stop or max_tokens may cut the block short.
                s.metrics.record_step(drafted, accepted, len(out.new_token_ids),
                                      chain_name if s.params.greedy else name)
            outputs.append(out)
        return outputs

    def _step_options(self, seqs: list[Sequence]) -> tuple[tuple, int | None]:
        """The step's host-known options: the logits processors its requests ask for, and the
        most logprob alternatives any of them wants (None: none wants logprobs)."""
        wanted = [s.params.logprobs for s in seqs if s.params.logprobs is not None]
        return active_processors(self.logits_processors, seqs), (max(wanted) if wanted else None)

    def _uniforms(self, seqs: list[Sequence], n: int, rows: list[bool]) -> torch.Tensor:
        """This step's uniforms `[B, n]` float64, one draw from the engine's generator for the
        `rows` that sample through them: unseeded sampled rows. Greedy rows need none and seeded
        rows take the exponential race (blockspec/seeded_sampling.py): zeros there."""
        out = torch.zeros(len(seqs), n, dtype=torch.float64)
        idx = [i for i, (s, r) in enumerate(zip(seqs, rows)) if r and not s.params.greedy and not races(s.params)]
        if idx:
            drawn = torch.rand(len(idx), n, generator=self.generator, dtype=torch.float64)
            # Every row drawing (the usual sampled batch): a slice copy, not an indexed one (host time).
            out[slice(None) if len(idx) == len(seqs) else idx] = drawn
        return out

    # ---- after a step: commit, stop, detokenize ---------------------------------------------
    def _commit(self, state: _RequestState, tokens: list[int], logprobs=None) -> StepOutput:
        """Append `tokens` (with their TokenLogprobs, when the step computed them) up to a stop."""
        seq, params = state.seq, state.seq.params
        new_ids: list[int] = []
        reason = None
        for t in tokens:
            seq.tokens.append(t)
            new_ids.append(t)
            if seq.grammar is not None:
                seq.grammar.accept([t])
            reason = token_stop_reason(t, seq.num_output, params.max_tokens, state.stop_ids)
            if state.detok is None:
                if reason is not None:
                    break
                continue
            if t in state.stop_ids:
                state.text += state.detok.flush()
                break
            state.text += state.detok.push([t])
            if params.stop:
                cut = first_stop_string(state.text, params.stop, state.emitted)
                if cut is not None:
                    state.text = state.text[:cut]
                    reason = "stop"
                    break
            if reason is not None:
                break
        if reason == "length" and state.detok is not None:
            state.text += state.detok.flush()
            if params.stop:
                cut = first_stop_string(state.text, params.stop, state.emitted)
                if cut is not None:
                    state.text, reason = state.text[:cut], "stop"
        hold = 0 if reason else stop_prefix_holdback(state.text, params.stop or [])
        new_text = state.text[state.emitted:len(state.text) - hold]
        state.emitted += len(new_text)
        if reason is not None:
            seq.finish_reason = reason
            seq.status = Status.FINISHED
            self.scheduler.remove(seq)
            del self._requests[seq.request_id]
            if self.policy:
                self.policy.forget(seq.request_id)
        kept_logprobs = None
        if params.logprobs is not None and logprobs is not None:
            k = params.logprobs
            kept_logprobs = [replace(lp, top=lp.top[:k]) for lp in logprobs[:len(new_ids)]]
        return StepOutput(seq.request_id, new_ids, new_text, reason is not None, reason,
                          seq.num_prompt, seq.num_output, seq.metrics, kept_logprobs)
