"""Draft trees (docs/ddtree.md): best-first construction from a block drafter's marginals,
the tree attention mask, positions, the degenerate chain tree and K/V compaction indices.

A tree of budget N has a fixed width N + 1: node 0 is the root (the last committed token,
parent −1), real nodes follow in pop order (best-first, so parents precede children), and
unused slots are padding (parent −2, depth 0, token 0). Fixed shapes keep the verify step
free of host syncs and CUDA-graph capturable.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

ROOT_PARENT = -1  # parent index of node 0, the root
PAD_PARENT = -2   # parent index of a padding slot: never anyone's child


@dataclass
class DraftTree:
    """A batch of draft trees, all `[B, N + 1]` except `num_nodes [B]`.

    tokens    int64    node tokens; index 0 is the root (its token, or 0 when unknown)
    parents   int64    parent node index; root −1, padding −2; parents precede children
    depths    int64    root 0, real nodes 1…, padding 0
    num_nodes int64    real nodes per row, root excluded
    logprob   float32  cumulative draft log-probability of the node's prefix; root 0
    max_depth int      deepest node over the batch, known on the host. `build_tree` gives the
                       exact value; `chain_tree` gives the chain capacity K (an upper bound,
                       so no sync). When left None it is computed from `depths` (one sync).
    is_chain  bool     every row is a chain (node i's parent is i − 1), so accepted paths are
                       contiguous and the verify needs no K/V compaction. Known on the host;
                       False unless the builder knows it (compaction is then always done).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    num_nodes: torch.Tensor
    logprob: torch.Tensor
    max_depth: int | None = None
    is_chain: bool = False

    def __post_init__(self) -> None:
        if self.max_depth is None:
            self.max_depth = int(self.depths.max()) if self.depths.numel() else 0

    @property
    def width(self) -> int:
        """Verify width N + 1 (root included)."""
        return self.tokens.shape[1]

    def to(self, device) -> "DraftTree":
        """The same tree on `device` (no copy when it is there already)."""
        if self.tokens.device == torch.device(device):
            return self
        move = lambda t: t.to(device)  # noqa: E731
        return DraftTree(move(self.tokens), move(self.parents), move(self.depths), move(self.num_nodes),
                         move(self.logprob), self.max_depth, self.is_chain)


def top_scores(draft_logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each depth's k best log-probabilities and tokens `[B, L, k]`, float32, descending. A NaN
    or +inf score (a drafter's overflow; an infinite score made NaN by a log-softmax) ranks last,
    as −inf: no sum of scores is then NaN, so every search pops a real candidate and reads no
    token from outside the top-k (the tree kernel read one from outside its row on a NaN depth).
    Fixed after the top-k (torch's puts NaN first), so the pass over the vocabulary stays one."""
    vals, idx = torch.topk(draft_logprobs.float(), k, dim=-1)
    vals = torch.where(vals.isnan() | (vals == float("inf")), float("-inf"), vals)
    vals, order = vals.sort(dim=-1, descending=True, stable=True)     # (a no-op unless one was fixed)
    return vals, idx.gather(-1, order)


def build_tree(draft_logprobs: torch.Tensor, budget: int, topk: int | None = None,
               root_tokens: torch.Tensor | None = None) -> DraftTree:
    """The `budget` highest-probability prefixes under the factorised draft distribution.

    `draft_logprobs [B, L, V]` are per-position log-probabilities of the tokens after the
    root (they must be ≤ 0 for the result to be the optimal tree). Each depth offers its
    K = min(budget, V, topk) best tokens. One topk on the device and one transfer to the host
    feed a per-row heap search; the result goes back to the device in one transfer.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    B, L, V = draft_logprobs.shape
    device = draft_logprobs.device
    k = min(budget, V, topk if topk is not None else budget)
    if k <= 0 or L == 0:
        rows = [_RowTree() for _ in range(B)]
        top_tokens = torch.zeros(B, L * max(k, 0), dtype=torch.int64, device=device)
    else:
        top_vals, top_idx = top_scores(draft_logprobs, k)                         # [B, L, K]
        host_vals = top_vals.cpu().tolist()                                      # the one D2H copy
        rows = [_best_first_row(row_vals, budget) for row_vals in host_vals]
        top_tokens = top_idx.reshape(B, L * k)
    return _assemble(rows, budget, k, top_tokens, root_tokens, device)


class _RowTree:
    """Host-side node lists of one row, root excluded, in pop order."""

    def __init__(self) -> None:
        self.parents: list[int] = []
        self.depths: list[int] = []
        self.ranks: list[int] = []
        self.logprobs: list[float] = []


def _best_first_row(vals: list[list[float]], budget: int) -> _RowTree:
    """Pop the `budget` best rank tuples of one row; `vals[d][r]` = log q of rank r at depth d+1.

    A heap entry is (−score, insertion counter, depth, rank, parent node, parent score); the
    counter breaks ties by insertion order. Every prefix is pushed exactly once: by its
    previous sibling (rank > 0) or by its parent (rank 0), and its score never exceeds that
    pusher's, so pops come out best-first.
    """
    row = _RowTree()
    num_depths, k = len(vals), len(vals[0])
    heap = [(-vals[0][0], 0, 1, 0, 0, 0.0)]
    counter = 1
    while heap and len(row.parents) < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        score = -neg_score
        row.parents.append(parent)
        row.depths.append(depth)
        row.ranks.append(rank)
        row.logprobs.append(score)
        node = len(row.parents)                       # index of this node, root = 0
        if rank + 1 < k:
            sibling = parent_score + vals[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, counter, depth, rank + 1, parent, parent_score))
            counter += 1
        if depth < num_depths:
            child = score + vals[depth][0]
            heapq.heappush(heap, (-child, counter, depth + 1, 0, node, score))
            counter += 1
    return row


def _assemble(rows: list[_RowTree], budget: int, k: int, top_tokens: torch.Tensor,
              root_tokens: torch.Tensor | None, device: torch.device) -> DraftTree:
    """Pad the host lists to width budget + 1, ship them in one transfer, gather tokens there."""
    width = budget + 1
    parents, depths, flat_idx, logprob = [], [], [], []
    for row in rows:
        pad = budget - len(row.parents)
        parents.append([ROOT_PARENT] + row.parents + [PAD_PARENT] * pad)
        depths.append([0] + row.depths + [0] * pad)
        # Position of each node's token in the flattened [L * K] top-k table.
        flat_idx.append([0] + [(d - 1) * k + r for d, r in zip(row.depths, row.ranks)] + [0] * pad)
        logprob.append([0.0] + row.logprobs + [0.0] * pad)
    max_depth = max((max(row.depths, default=0) for row in rows), default=0)
    # Best-first pops give parents before children, so a chain row is parents 0, 1, 2, …
    is_chain = all(row.parents == list(range(len(row.parents))) for row in rows)

    # Pack everything in one int64 tensor (log-probs bit-cast through int32) for one H2D copy.
    logprob_bits = torch.tensor(logprob, dtype=torch.float32).reshape(-1, width).view(torch.int32)
    packed = torch.stack([
        torch.tensor(parents, dtype=torch.int64).reshape(-1, width),
        torch.tensor(depths, dtype=torch.int64).reshape(-1, width),
        torch.tensor(flat_idx, dtype=torch.int64).reshape(-1, width),
        logprob_bits.to(torch.int64),
    ]).to(device)
    parents_d, depths_d, flat_d = packed[0], packed[1], packed[2]
    logprob_d = packed[3].to(torch.int32).view(torch.float32)

    is_real = parents_d >= 0
    if top_tokens.shape[1] > 0:
        tokens = torch.where(is_real, top_tokens.gather(1, flat_d), 0)
    else:
        tokens = torch.zeros_like(parents_d)
    if root_tokens is not None:
        tokens[:, 0] = root_tokens.to(device=device, dtype=torch.int64)
    return DraftTree(tokens=tokens, parents=parents_d, depths=depths_d,
                     num_nodes=is_real.sum(dim=1), logprob=logprob_d, max_depth=max_depth, is_chain=is_chain)


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """`[B, N+1, N+1]` bool: [b, i, j] is True iff j is i or an ancestor of i.

    Pointer doubling: after step s, `reach[i]` holds i's ancestors closer than 2^s and `jump[i]`
    is its 2^s-th ancestor, so ⌈log2(N+1)⌉ steps cover any depth. A sentinel node W (empty
    reach, jumping to itself) stands for "no ancestor": the root's −1 and padding's −2.
    """
    B, W = parents.shape
    device = parents.device
    sentinel = W
    jump = torch.where(parents >= 0, parents, sentinel)
    jump = torch.cat([jump, torch.full((B, 1), sentinel, dtype=jump.dtype, device=device)], dim=1)
    eye = torch.eye(W, dtype=torch.bool, device=device)
    reach = torch.cat([eye, torch.zeros(1, W, dtype=torch.bool, device=device)])
    reach = reach.unsqueeze(0).expand(B, W + 1, W).contiguous()          # [B, W+1, W]
    span = 1
    while span < W:
        reach = reach | reach.gather(1, jump[:, :, None].expand(B, W + 1, W))
        jump = jump.gather(1, jump)
        span *= 2
    return reach[:, :W]


def tree_positions(depths: torch.Tensor, prefix_len: torch.Tensor) -> torch.Tensor:
    """RoPE position of every node: the root sits at prefix_len, a node at prefix_len + depth."""
    return prefix_len[:, None].to(depths.dtype) + depths


def with_rows(tree: DraftTree, other: DraftTree, rows: torch.Tensor) -> DraftTree:
    """`tree` with the rows where `rows [B]` is True taken from `other` (same shape). Its
    `max_depth` bounds both; it is a chain only where both are."""
    if other.tokens.shape != tree.tokens.shape:
        raise ValueError(f"trees of shapes {tuple(tree.tokens.shape)} and {tuple(other.tokens.shape)} cannot mix rows")
    pick = lambda a, b: torch.where(rows.view(-1, *[1] * (a.dim() - 1)), b, a)  # noqa: E731
    return DraftTree(pick(tree.tokens, other.tokens), pick(tree.parents, other.parents), pick(tree.depths, other.depths),
                     pick(tree.num_nodes, other.num_nodes), pick(tree.logprob, other.logprob),
                     max(tree.max_depth, other.max_depth), tree.is_chain and other.is_chain)


def chain_tree(draft_tokens: torch.Tensor, root_tokens: torch.Tensor,
               num_drafts: torch.Tensor | None = None) -> DraftTree:
    """A linear chain root → d1 → … → dK as a tree (linear DFlash through the tree path).

    Drafts at index ≥ num_drafts[b] become padding. Log-probs are unknown here and left 0;
    `max_depth` is the capacity K, which needs no sync.
    """
    B, K = draft_tokens.shape
    device = draft_tokens.device
    if num_drafts is None:
        num_drafts = torch.full((B,), K, dtype=torch.int64, device=device)
    num_drafts = num_drafts.to(device=device, dtype=torch.int64).clamp(0, K)
    node = torch.arange(K + 1, device=device)
    is_real = (node[None, :] >= 1) & (node[None, :] <= num_drafts[:, None])
    is_root = (node == 0)[None, :]
    parents = torch.where(is_real, node - 1, torch.where(is_root, ROOT_PARENT, PAD_PARENT))
    depths = torch.where(is_real, node, 0)
    drafts = torch.cat([root_tokens.to(device=device, dtype=torch.int64)[:, None],
                        draft_tokens.to(torch.int64)], dim=1)
    tokens = torch.where(is_real | is_root, drafts, 0)
    logprob = torch.zeros(B, K + 1, dtype=torch.float32, device=device)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, num_nodes=num_drafts,
                     logprob=logprob, max_depth=K, is_chain=True)


def accepted_kv_indices(path: torch.Tensor, accept_len: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which verify-written K/V entries survive, for compaction to offsets 0…accept_len.

    `path [B, D+1]` lists the root and accepted nodes in depth order (−1 padded); a node's
    index is its K/V offset from the first slot the verify wrote, and offsets increase along
    the path, so moving entry i to offset i never overwrites an entry still to be read.
    Returns `src [B, D+1]` (the offsets, 0 where unused) and `keep [B, D+1]` (the first
    accept_len + 1 entries).
    """
    steps = torch.arange(path.shape[1], device=path.device)
    keep = (steps[None, :] <= accept_len[:, None]) & (path >= 0)
    src = torch.where(keep, path, 0).to(torch.int64)
    return src, keep


def truncate_tree(tree: DraftTree, width: int, row_widths: torch.Tensor | None = None) -> DraftTree:
    """The first `width` nodes of every row (root included): the adaptive policy's chain of
    length `width`, or tree of budget `width − 1` (`engine/spec_policy.py`).

    Parents precede children, so a prefix of the nodes is a tree. For a chain it is the chain of
    that length; for a best-first tree (`build_tree` numbers nodes in pop order) it is the tree
    `build_tree` would give for budget `width − 1`; for children drawn in index order
    (`sampled_tree`) it keeps the first draws, still draws from q without replacement.
    `row_widths [B]` (optional, each ≤ width) narrows single rows further: their later nodes
    become padding, so a batch can mix rows that speculate with rows that decode plainly
    (row width 1) in one verify. Returns `[B, width]` fields, `max_depth ≤ width − 1`.
    """
    if not 1 <= width <= tree.width:
        raise ValueError(f"width must be between 1 and the tree's width {tree.width}, got {width}")
    keep = lambda t: t[:, :width]  # noqa: E731
    tokens, parents, depths, logprob = keep(tree.tokens), keep(tree.parents), keep(tree.depths), keep(tree.logprob)
    limit = torch.full_like(tree.num_nodes, width - 1)
    if row_widths is not None:
        row_widths = row_widths.to(device=tokens.device, dtype=torch.int64)
        if row_widths.shape != tree.num_nodes.shape:
            raise ValueError(f"row_widths must be [B] = {tuple(tree.num_nodes.shape)}, got {tuple(row_widths.shape)}")
        node = torch.arange(width, device=tokens.device)
        padding = (node[None, :] >= row_widths[:, None]) & (node[None, :] > 0)
        tokens = torch.where(padding, 0, tokens)
        parents = torch.where(padding, PAD_PARENT, parents)
        depths = torch.where(padding, 0, depths)
        logprob = torch.where(padding, 0.0, logprob)
        limit = torch.minimum(limit, (row_widths - 1).clamp(min=0))
    num_nodes = torch.minimum(tree.num_nodes, limit)
    max_depth = min(tree.max_depth if tree.max_depth is not None else width - 1, width - 1)
    return DraftTree(tokens.contiguous(), parents.contiguous(), depths.contiguous(), num_nodes, logprob.contiguous(),
                     max_depth, tree.is_chain)
