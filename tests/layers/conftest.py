"""Without CUDA the Triton kernels run under Triton's interpreter on CPU tensors.

TRITON_INTERPRET is read when a `@triton.jit` function is defined, so it is set here, before any
test module in this directory imports `blockspec.layers.triton_ops`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
