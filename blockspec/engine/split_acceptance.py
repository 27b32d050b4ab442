"""The acceptance model of an engine whose greedy rows draft chains and sampled rows trees
(DFlash with `sampled_trees`): each row's figures come from the model of the shape it drafts —
per-position rates for a greedy row's chain (`engine/chain_acceptance.py`), per-width figures
for a sampled row's tree (`engine/acceptance.py`: a chain's per-position reading, E[w] = Σ
Π h, assumes a width w holds drafts 1 … w − 1, which a tree of budget w − 1 does not).

A row's kind is fixed by its request (greedy or not), kept per request id once seen. The
batch's totals are the two models' totals over their rows, added; a batch of one kind (the
usual case) is handed to its model whole, so it costs what that model alone does.
"""

from __future__ import annotations

from blockspec.engine.acceptance import AcceptanceModel
from blockspec.engine.chain_acceptance import ChainAcceptance

GREEDY_CLASS = "greedy"


class SplitAcceptance:
    """`AcceptanceModel`'s interface (what `SpecPolicy` calls) over two models: `chain` for
    greedy rows, `tree` for the others."""

    def __init__(self, widths: list[int]):
        self.chain, self.tree = ChainAcceptance(widths), AcceptanceModel(widths)
        self.widths = self.chain.widths
        self._greedy: dict[str, bool] = {}
        # The last batch's split: (its ids, the greedy rows' positions, the others').
        self._last: tuple[list[str], list[int], list[int]] | None = None

    def _split(self, request_ids: list[str], klass_of) -> tuple[list[int], list[int]]:
        """The positions of the greedy rows and of the others (a row's class asked once per request)."""
        last = self._last
        if last is not None and last[0] == request_ids:
            return last[1], last[2]
        greedy, other = [], []
        for i, request_id in enumerate(request_ids):
            is_greedy = self._greedy.get(request_id)
            if is_greedy is None:
                is_greedy = self._greedy[request_id] = klass_of(i) == GREEDY_CLASS
            (greedy if is_greedy else other).append(i)
        self._last = (list(request_ids), greedy, other)
        return greedy, other

    def _parts(self, request_ids: list[str], klass_of):
        """(model, its rows' ids, their positions in the batch) for each model with rows here."""
        return self._parts_of(request_ids, *self._split(request_ids, klass_of))

    def _parts_of(self, request_ids: list[str], greedy: list[int], other: list[int]):
        if not other:
            return [(self.chain, request_ids, None)]
        if not greedy:
            return [(self.tree, request_ids, None)]
        return [(model, [request_ids[i] for i in rows], rows) for model, rows in ((self.chain, greedy), (self.tree, other))]

    def expected_totals(self, request_ids: list[str], klass_of) -> dict[int, float]:
        """width → Σ over the rows of 1 + E_row[w], each row from its own model."""
        totals = dict.fromkeys(self.widths, 0.0)
        for model, ids, rows in self._parts(request_ids, klass_of):
            part = model.expected_totals(ids, klass_of if rows is None else (lambda j, rows=rows: klass_of(rows[j])))
            for w, t in part.items():
                totals[w] += t
        return totals

    def expected(self, request_id: str, klass: str, width: int) -> float:
        model = self.chain if self._greedy.get(request_id, klass == GREEDY_CLASS) else self.tree
        return model.expected(request_id, klass, width)

    def observe_step(self, request_ids: list[str], klass_of, path_nodes: list[list[int]], ran_width) -> None:
        for model, ids, rows in self._parts(request_ids, klass_of):
            if rows is None:
                model.observe_step(ids, klass_of, path_nodes, ran_width)
                continue
            ran = ran_width if isinstance(ran_width, int) else [ran_width[i] for i in rows]
            model.observe_step(ids, lambda j, rows=rows: klass_of(rows[j]), [path_nodes[i] for i in rows], ran)

    def extend_stretch(self, request_ids: list[str]) -> bool:
        """Both models' plain stretches of their rows, or neither (then the step is observed in full)."""
        last = self._last
        if last is None or last[0] != request_ids:
            return False
        parts = self._parts_of(request_ids, last[1], last[2])
        if not all(model.in_stretch(ids) for model, ids, _ in parts):
            return False
        for model, ids, _ in parts:
            model.extend_stretch(ids)
        return True

    def forget(self, request_id: str) -> None:
        if self._greedy.pop(request_id, None) is not None:
            self._last = None
        self.chain.forget(request_id)
        self.tree.forget(request_id)
