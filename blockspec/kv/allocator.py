"""Page allocator and per-sequence page tables (host side, between steps).

Page 0 is reserved and never handed out: padded rows of a batch write their K/V there, so a
step never needs a data-dependent shape to skip them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockspec.kv.page_table import PageTableStore


class OutOfPages(RuntimeError):
    """Raised when an allocation cannot be satisfied; the scheduler waits or preempts."""


class PageAllocator:
    """A free list of fixed-size pages with usage accounting."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 2:
            raise ValueError("num_pages must be at least 2 (page 0 is reserved)")
        if page_size < 1:
            raise ValueError("page_size must be positive")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, 0, -1))  # pop() hands out low ids first

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def num_used_pages(self) -> int:
        return self.num_usable_pages - self.num_free_pages

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"need {n} pages, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))


@dataclass
class PageTable:
    """The pages of one sequence; position p lives in slot pages[p // S] * S + p % S.

    With a `store`, every change is mirrored into a row of its table (see kv/page_table.py)."""

    page_size: int
    pages: list[int] = field(default_factory=list)
    store: "PageTableStore | None" = field(default=None, repr=False)
    row: int | None = field(default=None, repr=False)

    @property
    def capacity(self) -> int:
        return len(self.pages) * self.page_size

    def pages_needed(self, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.page_size) - len(self.pages))

    def reserve(self, allocator: PageAllocator, num_tokens: int) -> None:
        """Make room for positions 0..num_tokens-1."""
        need = self.pages_needed(num_tokens)
        if need:
            new = allocator.allocate(need)
            if self.store is not None:
                if self.row is None:
                    self.row = self.store.acquire()
                self.store.write(self.row, len(self.pages), new)
            self.pages.extend(new)

    def truncate(self, allocator: PageAllocator, num_tokens: int) -> None:
        """Keep only the pages that hold positions 0..num_tokens-1 (rollback is this)."""
        keep = -(-num_tokens // self.page_size)
        if keep < len(self.pages):
            allocator.free(self.pages[keep:])
            if self.row is not None:
                if keep == 0:
                    self.store.release(self.row)
                    self.row = None
                else:
                    self.store.clear(self.row, keep, len(self.pages))
            del self.pages[keep:]

    def release(self, allocator: PageAllocator) -> None:
        self.truncate(allocator, 0)

    def slot(self, position: int) -> int:
        return self.pages[position // self.page_size] * self.page_size + position % self.page_size
