"""The adaptive policy's acceptance model for chains: per request, the rate at which each draft
position is accepted once every position before it was.

A chain of w nodes holds w − 1 drafts, the first w − 1 of the full block's (the drafter makes
the whole block in one pass: `DFlashProposer.propose`), and its walk accepts a prefix of them.
Write h_k for the chance that draft k is accepted given drafts 1 … k − 1 were; then

    E[w] = Σ_{k < w} Π_{j ≤ k} h_j      (expected accepted drafts at width w)

A step at width W that accepted a drafts tells: drafts 1 … a accepted; draft a + 1 rejected when
a < W − 1; nothing of the positions after. Every step teaches its positions, whatever width it
ran, and a step that ran short of a good stretch (all its drafts accepted) leaves the positions
past it unobserved rather than counted as rejected. The per-width figures of
`engine/acceptance.py` cannot take that: a width w > W is not observed by a step at W, so the
figures of wide chains came only from probes, which run when the choice went narrow because
drafts were being rejected. Replayed on recorded T = 0 traces at the H100's step costs
(`blockspec/bench/policy_sim.py`), those figures kept the policy on chain 8 through long accepted
stretches, 0.92× the static chain 16; these reach 0.97–1.0×.

Each h_k is an EMA (α 0.2: every step teaches the positions it reached, so a rate needs less
weight on its last observation than a width's figure did; in the replay, 0.3 / 0.2 / 0.1 / 0.05
gave 0.97 / 1.00 / 1.00 / 0.98× the best static width at T = 0, c = 1) per request and per temperature class (β, moved once a step towards the
mean of its rows that observed position k, as `AcceptanceModel`), a new request starts from its
class, positions never observed read as accepted (optimistic: measure before giving up), and
positions a step did not observe relax (`relax`) towards the class's rate. Plain steps observe
nothing: a run of them on one batch is kept as a stretch and relaxed in closed form when read.
"""

from __future__ import annotations

import numpy as np

from blockspec.engine.acceptance import AcceptanceModel


class ChainAcceptance(AcceptanceModel):
    """`AcceptanceModel`'s interface over per-position acceptance rates (module docstring): its
    table's columns are draft positions 1 … max(widths) − 1, not widths."""

    def __init__(self, widths: list[int], alpha: float = 0.2, batch_alpha: float = 0.05, relax: float = 0.1):
        super().__init__(widths, alpha, batch_alpha, relax)
        P = max(max(self.widths) - 1, 1)                            # draft positions
        self._table = np.full((16, P), np.nan)                        # [rows, P] h_k
        self._k = np.arange(P)                                        # [P] position k + 1's index
        self._prior = np.ones(P)                                      # never observed: accepted
        self._prior_list = self._prior.tolist()
        self._reads = np.array([w - 1 for w in self.widths])         # E[w] = S[w − 1], S[0] = 0
        self._counts = np.zeros(self._table.shape)                  # a request's observations per position
        self._masks: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # ran width → `_masks_at`

    def _new_row(self) -> int:
        row = super()._new_row()
        if len(self._counts) < len(self._table):
            self._counts = np.concatenate([self._counts, np.zeros((len(self._table) - len(self._counts),
                                                                  self._counts.shape[1]))])
        self._counts[row] = 0.0
        return row

    # ---- reading --------------------------------------------------------------------------------
    def expected(self, request_id: str, klass: str, width: int) -> float:
        if width not in self._index:
            return float(width - 1)
        return self.expected_totals([request_id], lambda i: klass)[width] - 1.0

    def expected_totals(self, request_ids: list[str], klass_of) -> dict[int, float]:
        """width → Σ over the rows of 1 + E_row[w]."""
        stretch = self._stretch
        if stretch is not None and stretch.ids == request_ids:
            f = (1.0 - self.relax) ** stretch.steps
            if len(request_ids) <= self.scalar_rows:       # (at T = 1 most full choices read a stretch)
                return self._totals_of_rates([[b + f * d for b, d in zip(read, decay)]
                                              for read, decay in zip(stretch.read, stretch.decay)])
            rates = np.array(stretch.read) + f * np.array(stretch.decay)
        else:
            self._settle()
            rows, idx = self._read_rows(request_ids, klass_of)
            if len(rows) <= self.scalar_rows:
                return self._totals_of_rates(list(map(self._figures, rows)))
            rates = self._table.take(rows if idx is None else idx, 0)
            if np.isnan(rates).any():
                rates = self._filled(rates, rows)
        sums = np.zeros(rates.shape[1] + 1)
        sums[1:] = np.cumprod(rates, 1).sum(0).cumsum()               # S[j] summed over the rows
        return dict(zip(self.widths, (sums[self._reads] + len(request_ids)).tolist()))

    def _totals_of_rates(self, per_row: list[list[float]]) -> dict[int, float]:
        """width → Σ over the rows of 1 + E[w], from each row's rates (Python: a few rows)."""
        sums = [0.0] * (self._table.shape[1] + 1)         # S[j] summed over the rows
        for rates in per_row:
            reach, total = 1.0, 0.0
            for j, h in enumerate(rates, 1):
                reach *= h
                total += reach
                sums[j] += total
        B = float(len(per_row))
        return {w: B + sums[w - 1] for w in self.widths}

    # ---- learning -------------------------------------------------------------------------------
    def _observe(self, rows: list[int], idx: np.ndarray, path_nodes: list[list[int]], ran_width) -> None:
        """A row's positions 1 … a accepted, a + 1 rejected when a < its width − 1 (`seen`); the
        others relax towards the class's rate."""
        B = len(rows)
        if B <= self.scalar_rows:
            ran = [ran_width] * B if isinstance(ran_width, int) else ran_width
            self._observe_few(rows, path_nodes, [a if a < w - 1 else a - 1 for a, w in zip(map(len, path_nodes), ran)])
            return
        table, k = self._table, self._k
        accepted = np.fromiter(map(len, path_nodes), np.int64, B)                            # [B]
        if isinstance(ran_width, int):      # (the usual step: one width, its masks by accepted count)
            took_of, seen_of = self._masks_at(ran_width)
            took, seen = took_of[accepted], seen_of[accepted]                                # [B, P]
        else:
            accepted = accepted[:, None]
            took = k < accepted
            seen = took | ((k == accepted) & (accepted < np.asarray(ran_width)[:, None] - 1))
        classes = self._classes_of(rows)
        old, klass = table[idx], table[classes]
        counts = self._counts[idx] + seen
        self._counts[idx] = counts
        rate = np.maximum(self.alpha, 1.0 / (counts + 1.0))
        # Seen positions move by their rate towards took, the others by `relax` towards the
        # class: one expression (the per-row rules' arithmetic, element for element).
        new = old + np.where(seen, rate, self.relax) * (np.where(seen, took, klass) - old)
        if np.isnan(new.sum()):   # a rate never observed takes its first observation; one without a class rate stays
            new = np.where(seen, np.where(np.isnan(old), took, new), np.where(np.isnan(new), old, new))
        table[idx] = new
        of = None if len(self._live) == 1 else classes
        for klass_row in (set(self._live) if of is None else set(of.tolist())):
            mine = slice(None) if of is None else of == klass_row
            self._observe_class(klass_row, took[mine].sum(0).tolist(), seen[mine].sum(0).tolist())

    def _masks_at(self, ran_width: int) -> tuple[np.ndarray, np.ndarray]:
        """`[P + 1, P]` bool, by accepted count a: the positions a step at `ran_width` accepted
        (took) and observed (seen: the accepted ones, and the rejected a + 1 when a < W − 1)."""
        masks = self._masks.get(ran_width)
        if masks is None:
            a = np.arange(len(self._k) + 1)[:, None]
            took = self._k < a
            masks = self._masks[ran_width] = (took, took | ((self._k == a) & (a < ran_width - 1)))
        return masks

    def _observe_few(self, rows: list[int], path_nodes: list[list[int]], lasts: list[int]) -> None:
        """`_observe` a row at a time (few rows: numpy's per-call cost dominates there); `lasts`:
        each row's last position seen (0-based)."""
        table, counts_table, alpha, relax, P = self._table, self._counts, self.alpha, self.relax, self._table.shape[1]
        sums: dict[int, tuple[list, list]] = {}
        for row, path, last in zip(rows, path_nodes, lasts):
            klass, a, n = self._fallback[row], len(path), last + 1
            old, counts = table[row].tolist(), counts_table[row].tolist()
            new = []
            for o, c, target in zip(old[:n], counts[:n], [1.0] * a + [0.0]):
                rate = 1.0 / (c + 2.0)
                rate = rate if rate > alpha else alpha
                new.append(target if o != o else o + rate * (target - o))
            base = table[klass].tolist()[n:]
            new += [o + relax * (b - o) if o == o and b == b else o for o, b in zip(old[n:], base)]
            table[row] = new
            counts_table[row, :n] += 1.0
            total, count = sums.setdefault(klass, ([0.0] * P, [0] * P))
            for p in range(min(a, P)):
                total[p] += 1.0
            for p in range(n):
                count[p] += 1
        for klass, (total, count) in sums.items():
            self._observe_class(klass, total, count)

    def _stretch_terms(self, read: np.ndarray, decay: np.ndarray) -> tuple[list, list]:
        """Each row's (a total is not a sum of rates: `expected_totals` reads a few rows in Python)."""
        return read.tolist(), decay.tolist()
