"""Where generation stops: stop tokens, max_tokens and stop strings (pure functions)."""

from __future__ import annotations


def first_stop_string(text: str, stops: list[str], search_from: int) -> int | None:
    """Index in `text` where the earliest stop string begins, looking at matches that end
    after `search_from` (earlier text was already checked); None if there is none."""
    best = None
    for stop in stops:
        idx = text.find(stop, max(0, search_from - len(stop) + 1))
        if idx != -1 and (best is None or idx < best):
            best = idx
    return best


def stop_prefix_holdback(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string.

    That much text is held back from streaming: it may turn out to be the start of a stop
    string, which is never part of the output.
    """
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold


def token_stop_reason(token: int, num_output: int, max_tokens: int, stop_ids: set[int]) -> str | None:
    """"stop" if `token` ends generation, "length" if max_tokens is reached, else None."""
    if token in stop_ids:
        return "stop"
    if num_output >= max_tokens:
        return "length"
    return None
