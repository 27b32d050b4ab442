"""The engine's settings: one definition, shared by the Python API, every CLI command and the server."""

from __future__ import annotations

from dataclasses import dataclass

from blockspec.models.loader import parse_device, parse_dtype

SPEC_ALGORITHMS = ("none", "ngram", "dflash", "ddtree")
SPEC_VERIFY_RULES = ("auto", "target-only", "rejection")
ATTENTION_BACKENDS = ("auto", "reference", "triton")
SPEC_POLICIES = ("static", "adaptive")   # engine/spec_policy.py
DRAFT_BLOCKS = ("auto", "full", "width")  # what a narrower verify width drafts (`DFlashProposer.propose`)


@dataclass
class EngineConfig:
    model: str
    dtype: str = "float32"
    device: str = "cpu"
    spec: str = "none"
    draft_model: str | None = None
    block_size: int | None = None
    spec_verify: str = "auto"          # "target-only", "rejection" (drafts sampled from q), or the best the
                                       # proposer allows (`resolve_verify_rule`)
    tree_budget: int | None = None
    sampled_trees: bool = False        # dflash: sampled requests draft trees whose children are draws from q
                                       # (greedy ones keep the chain; docs/verification.md)
    spec_policy: str = "adaptive"      # or "static": always the method's full block / budget (docs/adaptive.md)
    draft_block: str = "auto"          # a narrower width's drafts: "full" (the whole block's, cut), "width" (a
                                       # block of that width), "auto" (full on CUDA, width elsewhere)
    tree_topk: int | None = None
    max_running_requests: int = 64
    kv_cache_tokens: int | None = None
    page_size: int = 16
    max_model_len: int | None = None
    max_prefill_tokens: int = 2048
    seed: int = 0
    detokenize: bool = True   # False: token ids only (statistical tools); stop strings then refused
    attention_backend: str = "auto"    # auto: triton on CUDA, reference on CPU
    cuda_graph: bool = True            # capture decode/verify steps on CUDA (ignored on CPU)
    cuda_graph_max_bs: int = 64        # largest captured batch; larger batches run eager (logged)
    fused_ops: bool = True             # fused Triton RMSNorm/RoPE/SwiGLU on CUDA, if equal to eager (checked)
    overlap_schedule: bool = True      # CUDA graphs + drafting on the device: launch step N+1 before reading N
    batch_invariant: bool = False      # fixed-order GEMM/attention/RMSNorm: a position's logits independent
                                       # of verify width and batch (docs/batch_invariance.md)
    tensor_parallel_size: int = 1      # ranks the target is sharded over (docs/parallelism.md)
    expert_parallel: bool = False      # with tensor_parallel_size > 1: whole experts per rank, not split experts

    def validate(self) -> None:
        if self.spec not in SPEC_ALGORITHMS:
            raise ValueError(f"spec must be one of {', '.join(SPEC_ALGORITHMS)}, got {self.spec!r}")
        if self.spec_policy not in SPEC_POLICIES:
            raise ValueError(f"spec_policy must be one of {', '.join(SPEC_POLICIES)}, got {self.spec_policy!r}")
        if self.draft_block not in DRAFT_BLOCKS:
            raise ValueError(f"draft_block must be one of {', '.join(DRAFT_BLOCKS)}, got {self.draft_block!r}")
        if self.spec_verify not in SPEC_VERIFY_RULES:
            raise ValueError(f"spec_verify must be one of {', '.join(SPEC_VERIFY_RULES)}, got {self.spec_verify!r}")
        if self.sampled_trees and self.spec != "dflash":
            raise ValueError(f"sampled_trees applies to spec 'dflash', got spec {self.spec!r} (ddtree samples its "
                             "trees' children already under spec_verify 'rejection' or 'auto')")
        if self.sampled_trees and self.spec_verify == "target-only":
            raise ValueError("sampled_trees needs spec_verify 'rejection' or 'auto': children drawn from q are "
                             "verified by recursive rejection sampling, not target-only")
        for name in ("max_running_requests", "page_size", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.page_size:
            raise ValueError("kv_cache_tokens must hold at least one page")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError("block_size must be positive")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if self.cuda_graph_max_bs < 1:
            raise ValueError("cuda_graph_max_bs must be positive")
        parse_dtype(self.dtype)
        device = parse_device(self.device)
        if self.batch_invariant:
            if self.attention_backend == "reference":
                raise ValueError("batch_invariant needs attention_backend 'triton' or 'auto', got 'reference'")
            from blockspec.layers.batch_invariant import check_batch_invariant_device
            check_batch_invariant_device(device, parse_dtype(self.dtype), allow_interpreter=True)
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}")
        if self.expert_parallel and self.tensor_parallel_size == 1:
            raise ValueError("expert_parallel needs tensor_parallel_size > 1")
        if self.tensor_parallel_size > 1 and device.type == "cuda" and self.cuda_graph:
            raise ValueError("cuda_graph: CUDA graphs are not captured with tensor_parallel_size > 1 "
                             "(each step's inputs are broadcast from the host); pass --disable-cuda-graph "
                             "(cuda_graph=False)")
        if self.batch_invariant and self.tensor_parallel_size > 1:
            raise ValueError("batch_invariant is not built for tensor_parallel_size > 1 (its all-reduces sum in "
                             "the collective's order)")
