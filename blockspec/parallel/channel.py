"""Rank 0's commands to the other ranks: one broadcast message per call.

A message is `(command, args)`, pickled (ints, tuples, dataclasses such as `AttentionBatch`).
On CUDA its tensors are pulled out and travel as tensors (one NCCL broadcast each, device to
device); on the CPU they stay in the pickled bytes, so a message is two gloo broadcasts (its
length, its bytes) whatever it holds; an object rank 0 names with
`ref` (its K/V cache) arrives as the receiving rank's own object of that name.
"""

from __future__ import annotations

import io
import pickle

import torch

from blockspec.parallel.group import Group


class Ref:
    """Stands for the receiving rank's own object called `name` (e.g. "cache")."""

    def __init__(self, name: str):
        self.name = name


class _Pickler(pickle.Pickler):
    def __init__(self, buffer, tensors: list, inline_tensors: bool):
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors, self.inline_tensors = tensors, inline_tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and not self.inline_tensors:
            self.tensors.append(obj)
            return ("tensor", len(self.tensors) - 1)
        if isinstance(obj, Ref):
            return ("ref", obj.name)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, buffer, tensors: list, refs: dict):
        super().__init__(buffer)
        self.tensors, self.refs = tensors, refs

    def persistent_load(self, pid):
        kind, key = pid
        if kind == "tensor":
            return self.tensors[key]
        if key not in self.refs:
            raise ValueError(f"message names {key!r}, which this rank does not hold")
        return self.refs[key]


class Channel:
    """`send` on rank 0, `receive` on every other rank, in the same order."""

    def __init__(self, group: Group):
        self.group = group

    def send(self, command: str, *args) -> None:
        buffer, tensors = io.BytesIO(), []
        _Pickler(buffer, tensors, self.group.device.type == "cpu").dump((command, args))
        tensors = [t.detach().contiguous() for t in tensors]
        header = pickle.dumps((buffer.getvalue(), [(tuple(t.shape), t.dtype) for t in tensors]))
        data = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.group.device)
        self.group.broadcast(torch.tensor([data.numel()], dtype=torch.int64, device=self.group.device))
        self.group.broadcast(data)
        for t in tensors:
            if t.device != self.group.device:
                raise ValueError(f"a broadcast tensor is on {t.device}, the group on {self.group.device}")
            self.group.broadcast(t)

    def receive(self, refs: dict) -> tuple[str, tuple]:
        """The next `(command, args)`; `refs`: this rank's objects that messages may name."""
        device = self.group.device
        size = self.group.broadcast(torch.zeros(1, dtype=torch.int64, device=device))
        data = self.group.broadcast(torch.empty(int(size.item()), dtype=torch.uint8, device=device))
        payload, metas = pickle.loads(data.cpu().numpy().tobytes())
        tensors = [self.group.broadcast(torch.empty(shape, dtype=dtype, device=device)) for shape, dtype in metas]
        return _Unpickler(io.BytesIO(payload), tensors, refs).load()
