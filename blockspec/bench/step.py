"""`blockspec bench step`: the cost of one engine step on a model of a named shape, beside its
bandwidth floor measured in the same process.

A random-weight target (and a random DFlash drafter) of the shape is built in memory; B fake
requests sit at `context` cached tokens; each figure is the wall time of the engine's own step
(`SpeculativeStep.run`: step inputs built from the sequences, graph replay or eager forward,
verification, the host sync) averaged over repeated steps at that position. The floor is the
bytes the step must read (weights, plus every row's K/V) divided by the copy bandwidth measured
at startup; ratios to it carry across machines, absolute times on a shared GPU do not.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import torch

from blockspec.attention.backend import select_backend
from blockspec.batch import decode_inputs
from blockspec.engine.overlap import launch_decode
from blockspec.config import ModelConfig
from blockspec.engine.cuda_graphs import GraphedStep, batch_buckets
from blockspec.models.fast_path import prepare_for_cuda
from blockspec.engine.runner import ModelRunner
from blockspec.kv.allocator import PageAllocator, PageTable
from blockspec.layers import RotaryEmbedding
from blockspec.models.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids
from blockspec.models.registry import architecture_of, model_class_for
from blockspec.sampling import SamplingParams, sampling_variant
from blockspec.speculative.proposers import DFlashProposer, Proposer
from blockspec.speculative.step import SpeculativeStep
from blockspec.speculative.tree import DraftTree, build_tree, chain_tree


def _qwen3(hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, tie, max_pos=40960):
    return {"architectures": ["Qwen3ForCausalLM"], "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "vocab_size": vocab, "tie_word_embeddings": tie, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "max_position_embeddings": max_pos}


SHAPES = {
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, 128, 151936, False),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, 128, 151936, True),
    "tiny": _qwen3(64, 128, 2, 4, 2, 16, 256, True, max_pos=4096),     # tests
}


def shape_config(name: str) -> dict:
    """config.json dict of a named shape; "bundled" is the bundled target's own config."""
    if name == "bundled":
        from blockspec.bundled import TARGET_DIR
        return json.loads((TARGET_DIR / "config.json").read_text())
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose from {', '.join([*SHAPES, 'bundled'])}")
    return dict(SHAPES[name])


def drafter_config(target: ModelConfig, num_layers: int, block_size: int) -> DFlashConfig:
    """A DFlash drafter for `target`: its width and heads, `num_layers` layers."""
    return DFlashConfig.from_hf({
        "hidden_size": target.hidden_size, "intermediate_size": target.intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads, "head_dim": target.head_dim, "vocab_size": target.vocab_size,
        "rms_norm_eps": target.rms_norm_eps, "rope_theta": target.rope.theta,
        "block_size": block_size, "dflash_config": {
            "mask_token_id": target.vocab_size - 1,
            "target_layer_ids": default_target_layer_ids(target.num_layers, num_layers)}})


def _randomize(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0) if "norm" in name else p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for name, b in module.named_buffers():      # left uninitialised by to_empty (MoE correction bias)
            if b.is_floating_point():
                b.zero_()


def random_target(raw: dict, dtype: torch.dtype, device: torch.device, backend, seed: int = 0):
    """The registry's model for `raw`, random weights, built directly on the device."""
    cfg = architecture_of(raw).parse_config(raw)
    model = _random_module(lambda: model_class_for(cfg)(cfg, backend), cfg, dtype, device, seed)
    if device.type == "cuda":
        prepare_for_cuda(model)
    return model


def random_drafter(cfg: DFlashConfig, dtype, device, backend, seed: int = 1) -> DFlashDrafter:
    return _random_module(lambda: DFlashDrafter(cfg, backend), cfg, dtype, device, seed)


def _random_module(build, cfg, dtype, device, seed: int):
    """`build()` on the meta device, materialised on `device` in `dtype` with random weights;
    tied embeddings re-tied, RoPE frequencies rebuilt in float32."""
    with torch.device("meta"):
        module = build()
    # Cast on meta first: materialising in float32 and then casting needs twice the memory
    # (the Kimi slice's 37.5 GB of bf16 weights did not fit an 80 GB H100 that way).
    module = module.to(dtype).to_empty(device=device)
    if getattr(cfg, "tie_word_embeddings", False):
        module.lm_head.weight = module.model.embed_tokens.weight
    _randomize(module, seed)
    module.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim).to(device)
    return module.eval()


class FixedTreeProposer(Proposer):
    """Proposes the same tree every step (its root replaced by the row's): a verify of a given
    shape, with drafting costing nothing, so the figure is the verify alone."""

    drafts_on_device = True

    def __init__(self, tree: DraftTree, builds_trees: bool):
        self.tree, self.builds_trees = tree, builds_trees
        self.max_nodes = tree.width - 1
        self.max_depth = tree.max_depth
        self.block_size = 0

    def propose(self, seqs, inputs, width=None):
        t = self.tree
        tokens = torch.cat([inputs.roots[:, None], t.tokens[:, 1:]], dim=1)
        return DraftTree(tokens, t.parents, t.depths, t.num_nodes, t.logprob, t.max_depth, t.is_chain), None


def fixed_tree(kind: str, nodes: int, batch: int, vocab: int, device, seed: int = 0) -> tuple[DraftTree, bool]:
    """("chain", n): n drafts; ("tree", n): a best-first tree of n nodes over 15 depths."""
    gen = torch.Generator().manual_seed(seed)
    roots = torch.zeros(batch, dtype=torch.long)
    if kind == "chain":
        return chain_tree(torch.randint(0, vocab, (batch, nodes), generator=gen), roots).to(device), False
    logprobs = torch.log_softmax(torch.randn(batch, 15, vocab, generator=gen) * 3, dim=-1)
    return build_tree(logprobs, nodes, None, roots).to(device), True


@dataclass
class StepFigure:
    name: str
    batch: int
    width: int
    ms: float
    floor_ms: float
    ratio: float
    capture_s: float | None = None
    replay_ms: float | None = None      # the captured graph alone: the step's device time
    host_ms: float | None = None        # ms − replay_ms: step inputs, buffer copies, the sync
    overlapped_ms: float | None = None  # a step as the overlapped engine runs it (step N+1 launched before N is read)


class StepHarness:
    """B requests at `context` cached tokens and one decode step's machinery around them."""

    def __init__(self, model, batch: int, context: int, proposer: Proposer | None, temperature: float,
                 graphs: bool, page_size: int = 16, drafter=None, all_buckets: bool = False):
        """`drafter`: an in-memory DFlash drafter for a `DFlashProposer` (attached, not loaded);
        `all_buckets`: capture every engine bucket up to `batch` (as the engine does), not just `batch`."""
        self.model, self.device = model, model.lm_head.weight.device
        lookahead = max(1 + (proposer.max_nodes if proposer else 0), proposer.block_size if proposer else 0)
        per_row = -(-(context + lookahead) // page_size)
        num_pages = batch * per_row + 1
        self.allocator = PageAllocator(num_pages, page_size)
        dtype = model.lm_head.weight.dtype
        self.cache = model.cache_spec.allocate(num_pages, page_size, dtype, self.device)
        params = (SamplingParams(temperature=0.0) if temperature == 0 else
                  SamplingParams(temperature=temperature, top_p=0.95))
        self.seqs = []
        for _ in range(batch):
            table = PageTable(page_size)
            table.reserve(self.allocator, context + lookahead)
            self.seqs.append(SimpleNamespace(num_cached=context, tokens=[1] * (context + 1), page_table=table,
                                             params=params))
        if drafter is not None:
            proposer.attach(drafter, model, num_pages, page_size)
        self.runner = ModelRunner(model, self.cache, self.device,
                                  tuple(proposer.target_layer_ids) if proposer else ())
        self.spec_step = SpeculativeStep(proposer, device=self.device)
        self.uniforms = torch.rand(batch, self.spec_step.uniforms_per_row, dtype=torch.float64)
        self.width = 1 + (proposer.max_nodes if proposer else 0)
        self.graphed = None
        self.capture_s = None
        if graphs and self.device.type == "cuda":
            self.graphed = GraphedStep(lambda inputs, tree: self.spec_step.device_step(self.runner, inputs, tree),
                                       self.width, self.spec_step.uniforms_per_row, per_row, page_size,
                                       bool(proposer and proposer.builds_trees), self.spec_step.drafts_on_device,
                                       self.device, batch)
            self.graphed.buckets = batch_buckets(batch) if all_buckets else [batch]
            self.graphed.capture()
            self.capture_s = self.graphed.capture_seconds

    def step(self):
        inputs = decode_inputs(self.seqs, self.uniforms, self.cache.page_size, self.device)
        return self.spec_step.run(self.runner, inputs, self.graphed)

    def profile(self, steps: int = 3, top: int = 40) -> list[dict]:
        """Where a step's GPU time goes: kernels by total device time over `steps` steps (each
        kernel's own time; launch gaps are the difference to the wall time)."""
        from torch.profiler import ProfilerActivity, profile
        self.step()
        _sync(self.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                self.step()
            _sync(self.device)
        rows = []
        for ev in prof.key_averages():
            device_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if device_us and ev.key and not ev.key.startswith(("aten::", "cuda", "ProfilerStep")):
                rows.append({"kernel": ev.key[:120], "us_per_step": device_us / steps, "calls_per_step": ev.count / steps})
        rows.sort(key=lambda r: -r["us_per_step"])
        return rows[:top]

    def replay_ms(self, iters: int, warmup: int = 3) -> float | None:
        """Mean time of the bucket's graph replayed back to back (no host work between): the
        step's device time. None without graphs."""
        if self.graphed is None:
            return None
        graph = self.graphed.static[len(self.seqs), sampling_variant([s.params for s in self.seqs])].graph
        for _ in range(warmup):
            graph.replay()
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(iters):
            graph.replay()
        _sync(self.device)
        return (time.perf_counter() - start) / iters * 1e3

    def overlapped_ms(self, iters: int, warmup: int = 3) -> float | None:
        """Mean time of a step launched before the previous one is read (engine/overlap.py):
        the host's work hides behind the GPU's. Every step starts from the same prefix (the
        harness's rows do not advance), so this leaves out the overlapped engine's small
        device-side prefix/root update. None without graphs or with host-side drafting."""
        if self.graphed is None or not self.spec_step.drafts_on_device:
            return None
        previous = None
        for i in range(warmup + iters):
            if i == warmup:
                _sync(self.device)
                start = time.perf_counter()
            launched = launch_decode(self.graphed, self.seqs, self.uniforms, None)
            if previous is not None:
                previous.result()
            previous = launched
        previous.result()
        return (time.perf_counter() - start) / iters * 1e3

    def time_ms(self, iters: int, warmup: int = 3) -> float:
        for _ in range(warmup):
            self.step()
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(iters):
            self.step()                       # ends with the step's device→host read
        _sync(self.device)
        return (time.perf_counter() - start) / iters * 1e3


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes moved per second by a device-to-device copy (read + write)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    _sync(device)
    return 2 * src.numel() * src.element_size() * iters / (time.perf_counter() - start)


def weight_bytes(module: torch.nn.Module, skip_embedding: bool = True) -> int:
    """Bytes a forward reads from the weights: every parameter once (the embedding table only
    through its B looked-up rows, so it is left out unless it doubles as the LM head), and the
    packed integer weights and their scales, which quantised layers keep as buffers."""
    from blockspec.layers.int4_experts import Int4GroupedExperts
    seen, total = set(), 0
    lm_head = getattr(module, "lm_head", None)
    packed = [(f"{n}.{b}", t) for n, m in module.named_modules() if isinstance(m, Int4GroupedExperts)
              for b, t in m.named_buffers(recurse=False)]
    for name, p in [*module.named_parameters(), *packed]:
        if id(p) in seen:
            continue
        seen.add(id(p))
        if skip_embedding and "embed_tokens" in name and not (lm_head is not None and lm_head.weight is p):
            continue
        total += p.numel() * p.element_size()
    return total


@dataclass
class StepBenchConfig:
    shape: str = "qwen3-8b"
    device: str = "cuda"
    dtype: str = "bfloat16"
    context: int = 1024
    batches: list[int] = field(default_factory=lambda: [1, 16, 64])
    chain: int = 16                 # verify width of the chain (tokens incl. root)
    trees: list[int] = field(default_factory=lambda: [32, 64])
    drafter_layers: int = 5
    block_size: int = 16
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.6])
    iters: int = 20
    graphs: bool = True
    capture_all: bool = False       # also time the engine's whole decode capture (every bucket ≤ max batch)
    profile: bool = False           # kernel table of the batch-1 decode and verify steps (eager)
    attention_backend: str = "auto"
    batch_invariant: bool = False   # the target on the batch-invariant kernels (docs/batch_invariance.md)
    attention_contexts: list[int] = field(default_factory=lambda: [4096, 32768])   # MoE slices: MLA alone
    int4_experts: bool = False      # MoE slices: routed experts packed INT4, group 32 (as Kimi ships them)
    output: str | None = None


def run_step_bench(cfg: StepBenchConfig, log=print) -> dict:
    from blockspec.bench.moe_step import MOE_SHAPES, run_moe_slice_bench
    if cfg.shape in MOE_SHAPES:
        return run_moe_slice_bench(cfg, log)
    from blockspec.models.loader import parse_device, parse_dtype
    device, dtype = parse_device(cfg.device), parse_dtype(cfg.dtype)
    backend = select_backend(cfg.attention_backend, device, cfg.batch_invariant)
    raw = shape_config(cfg.shape)
    model = random_target(raw, dtype, device, backend)
    if cfg.batch_invariant:
        # As the engine does: the target's layers (the drafter stays as it is, its drafts only
        # steer what the target verifies).
        from blockspec.layers.batch_invariant import make_batch_invariant
        make_batch_invariant(model, allow_interpreter=True)
    mcfg = model.config
    bandwidth = copy_bandwidth(device)
    weights = weight_bytes(model)
    kv_per_token = model.cache_spec.bytes_per_token(dtype)
    dcfg = drafter_config(mcfg, cfg.drafter_layers, cfg.block_size)
    drafter = random_drafter(dcfg, dtype, device, backend)
    drafter_bytes = weight_bytes(drafter) + model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    log(f"shape {cfg.shape}: weights {weights / 1e9:.2f} GB, copy bandwidth {bandwidth / 1e12:.2f} TB/s, "
        f"backend {backend.name}, graphs {cfg.graphs and device.type == 'cuda'}, batch-invariant {cfg.batch_invariant}")

    def floor_ms(nbytes: float) -> float:
        return nbytes / bandwidth * 1e3

    figures: list[StepFigure] = []

    profiles = {}

    def measure(name, batch, proposer, temperature, floor_bytes, drafter=None):
        harness = StepHarness(model, batch, cfg.context, proposer, temperature, cfg.graphs, drafter=drafter)
        ms = harness.time_ms(cfg.iters)
        replay = harness.replay_ms(cfg.iters)
        overlapped = harness.overlapped_ms(cfg.iters)
        if cfg.profile and device.type == "cuda" and (batch == 1 or proposer is None):
            # The graphed step's kernels (what replay runs); the sum against the replay time is
            # the launch gaps inside the graph.
            kernels = harness.profile()
            profiles[f"{name} batch {batch}"] = {
                "graphed": harness.graphed is not None, "kernel_us_sum": sum(k["us_per_step"] for k in kernels),
                "replay_ms": replay, "top_kernels": kernels}
        fl = floor_ms(floor_bytes)
        fig = StepFigure(name, batch, harness.width, ms, fl, ms / fl, harness.capture_s, replay,
                         None if replay is None else ms - replay, overlapped)
        figures.append(fig)
        log(f"{name:<28} batch {batch:>3} width {fig.width:>3}: {ms:8.3f} ms  floor {fl:7.3f} ms  "
            f"× {fig.ratio:5.2f}" + (f"  replay {replay:7.3f} ms (× {replay / fl:5.2f})" if replay else "")
            + (f"  overlapped {overlapped:7.3f} ms" if overlapped else "")
            + (f"  capture {fig.capture_s:.1f} s" if fig.capture_s else ""))
        del harness
        if device.type == "cuda":
            torch.cuda.empty_cache()

    for batch in cfg.batches:
        kv = batch * cfg.context * kv_per_token
        for t in cfg.temperatures:
            measure(f"decode T={t:g}", batch, None, t, weights + kv)
        if batch == 1:
            tree, _ = fixed_tree("chain", cfg.chain - 1, batch, mcfg.vocab_size, device)
            measure(f"verify chain {cfg.chain}", batch, FixedTreeProposer(tree, False), 0.0, weights + kv)
            for nodes in cfg.trees:
                tree, _ = fixed_tree("tree", nodes, batch, mcfg.vocab_size, device)
                measure(f"verify tree {nodes}", batch, FixedTreeProposer(tree, True), 0.0, weights + kv)
            measure(f"dflash step (block {cfg.block_size})", batch, DFlashProposer(dcfg, cfg.block_size), 0.0,
                    weights + kv + drafter_bytes, drafter)
            for nodes in cfg.trees:
                measure(f"ddtree step (budget {nodes})", batch, DFlashProposer(dcfg, cfg.block_size, nodes), 0.0,
                        weights + kv + drafter_bytes, drafter)
    by_name = {(f.name, f.batch): f for f in figures}
    chain = by_name.get((f"verify chain {cfg.chain}", 1))
    full = by_name.get((f"dflash step (block {cfg.block_size})", 1))
    derived = {}
    if chain and full:
        # The drafter's share of a DFlash step: the whole step less a verify of the same width.
        derived["drafter_ms"] = full.ms - chain.ms
        derived["drafter_floor_ms"] = floor_ms(drafter_bytes)
    decode = {t: by_name.get((f"decode T={t:g}", 1)) for t in cfg.temperatures}
    if chain and decode.get(0.0):
        derived["verify_chain_over_decode"] = chain.ms / decode[0.0].ms
    for batch in cfg.batches:
        cold, warm = by_name.get(("decode T=0", batch)), by_name.get(("decode T=0.6", batch))
        if cold and warm:
            derived[f"t0.6_over_t0_batch{batch}"] = warm.ms / cold.ms
    if cfg.capture_all and cfg.graphs and device.type == "cuda":
        harness = StepHarness(model, max(cfg.batches), cfg.context, None, 0.0, True, all_buckets=True)
        derived["capture_all_buckets_s"] = harness.capture_s   # plain decode, greedy and sampled per bucket
        del harness
        torch.cuda.empty_cache()
    for key, value in derived.items():
        log(f"{key}: {value:.3f}")
    result = {"config": asdict(cfg), "derived": derived, "profiles": profiles, "copy_bandwidth_bytes_per_s": bandwidth, "weight_bytes": weights,
              "drafter_bytes": drafter_bytes, "kv_bytes_per_token": kv_per_token,
              "figures": [asdict(f) for f in figures]}
    if cfg.output:
        with open(cfg.output, "w") as f:
            json.dump(result, f, indent=2)
    return result

