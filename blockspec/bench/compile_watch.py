"""Triton compiles during a timed run, so a benchmark can say which of its rounds paid for them.

A compile of a new specialisation costs 0.3–2 s on a GPU host, against steps of under a
millisecond: one compile inside a timed round of `bench offline --compare-static` moves its tok/s
by more than any configuration does. `CompileWatch` counts them through Triton's JIT hooks (the
hook before a compile and the one after it); in the interpreter nothing is compiled and nothing
is counted.
"""

from __future__ import annotations

import time


def _runtime_knobs():
    """Triton's runtime knobs (where its JIT hooks live), or None without Triton or them."""
    try:
        import triton.knobs
    except ImportError:
        return None
    runtime = getattr(triton.knobs, "runtime", None)
    return runtime if runtime is not None and hasattr(runtime, "jit_post_compile_hook") else None


class CompileWatch:
    """`with CompileWatch() as watch:` … then `watch.compiles` (kernel names, in order) and
    `watch.seconds` (their total compile time). Hooks already installed keep being called."""

    def __init__(self):
        self.compiles: list[str] = []
        self.seconds = 0.0
        self._knobs = _runtime_knobs()
        self._saved = None
        self._started: float | None = None

    def __enter__(self) -> "CompileWatch":
        if self._knobs is None:
            return self
        before, after = self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook
        self._saved = (before, after)

        def on_cache_miss(**kwargs):
            self._started = time.perf_counter()
            # A true answer from this hook skips the compile: only the hook we found may say so.
            return before(**kwargs) if before is not None else None

        def on_compiled(**kwargs):
            if self._started is not None:
                self.seconds += time.perf_counter() - self._started
                self._started = None
            fn = kwargs.get("fn")
            self.compiles.append(getattr(fn, "name", None) or str(kwargs.get("repr", "?"))[:60])
            return after(**kwargs) if after is not None else None

        self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook = on_cache_miss, on_compiled
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook = self._saved
            self._saved = None

    def summary(self) -> dict:
        """{"triton_compiles": n, "compile_seconds": s, "compiled": {kernel: count}} for a record."""
        counts: dict[str, int] = {}
        for name in self.compiles:
            counts[name] = counts.get(name, 0) + 1
        return {"triton_compiles": len(self.compiles), "compile_seconds": round(self.seconds, 3),
                "compiled": counts}
