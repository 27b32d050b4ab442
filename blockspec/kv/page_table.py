"""Every sequence's page list mirrored in one persistent tensor, updated as pages come and go.

A step's page table is then one row gather and one host→device copy, not a Python list per row
rebuilt each step. A sequence takes a row when it gets its first page and gives it back when it
holds none (finished, aborted or preempted), so at most `max_running_requests` rows are in use.
"""

from __future__ import annotations

import torch


class PageTableStore:
    """`table [rows, max_pages]` int64 on the host; row r lists one sequence's pages, then zeros."""

    def __init__(self, rows: int, max_pages: int):
        self.table = torch.zeros(rows, max_pages, dtype=torch.int64)
        self._free = list(range(rows - 1, -1, -1))

    @property
    def max_pages(self) -> int:
        return self.table.shape[1]

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.table.shape[0]} page-table rows are in use")
        return self._free.pop()

    def write(self, row: int, start: int, pages: list[int]) -> None:
        if start + len(pages) > self.max_pages:
            raise ValueError(f"a sequence needs {start + len(pages)} pages, the table holds {self.max_pages}")
        self.table[row, start:start + len(pages)] = torch.tensor(pages, dtype=torch.int64)

    def clear(self, row: int, start: int, end: int) -> None:
        self.table[row, start:end] = 0

    def release(self, row: int) -> None:
        self.table[row] = 0
        self._free.append(row)

    def rows(self, rows: list[int], width: int) -> torch.Tensor:
        """`[len(rows), width]` page table of those rows (one gather)."""
        return self.table[torch.tensor(rows), :width]
