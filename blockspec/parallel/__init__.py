"""Tensor and expert parallelism over torch.distributed (docs/parallelism.md).

`group.py` the process group and its collectives; `layers.py` the sharded layers (row-parallel
linear, vocabulary-parallel embedding and head, sharded mixture of experts); `sharding.py`
which slice of each module and checkpoint tensor a rank holds; `load.py` a rank's shard read
slice by slice from safetensors; `channel.py` rank 0's calls broadcast to the other ranks;
`workers.py` the worker processes and the rank-0 target that drives them.
"""
