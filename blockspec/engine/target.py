"""The target an engine runs: given, loaded, or sharded over tensor-parallel workers; then made
ready for CUDA (merged projections, fused ops) and, with `batch_invariant`, switched to the
fixed-order kernels."""

from __future__ import annotations

import logging

import torch

from blockspec.engine.config import EngineConfig
from blockspec.models.fast_path import prepare_for_cuda
from blockspec.models.loader import load_target

log = logging.getLogger("blockspec.engine")


def target_for(config: EngineConfig, device: torch.device, backend, target=None):
    """`target`: one already loaded for this config (tests share a tensor-parallel target between
    engines); its owner closes it, and it is returned as it is."""
    parallel = config.tensor_parallel_size > 1
    if target is not None:
        if parallel and getattr(target, "size", 1) != config.tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size is {config.tensor_parallel_size} but the given target "
                             f"has {getattr(target, 'size', 1)} ranks")
        return target
    if parallel:   # rank 0's view of the sharded target; the other ranks are worker processes
        from blockspec.parallel.workers import start_tensor_parallel
        model = start_tensor_parallel(config.model, config.dtype, device, config.attention_backend, backend,
                                      config.tensor_parallel_size, config.expert_parallel)
    else:
        model = load_target(config.model, config.dtype, device, backend)
    if device.type == "cuda":
        if parallel:
            model.prepare_for_cuda(config.fused_ops)
        else:
            prepare_for_cuda(model, config.fused_ops)
    if config.batch_invariant:
        # After the merged projections exist, before any graph capture (docs/batch_invariance.md).
        from blockspec.layers.batch_invariant import make_batch_invariant
        switched = make_batch_invariant(model, allow_interpreter=True)
        log.info("batch-invariant kernels: %d linear/RMSNorm layers, attention %s", switched, backend.name)
    return model
