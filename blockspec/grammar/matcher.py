"""Grammar state of requests: the engine's compiler (one per vocabulary) and one matcher per
request, advanced along every draft path of a step and rolled back to the committed state.

Token masks are xgrammar bitmasks, int32 `[rows, ceil(V / 32)]` on the host (bit t % 32 of word
t // 32 set = token t allowed); `grammar/mask.py` turns them into boolean masks on the device.
"""

from __future__ import annotations

from blockspec.structured_output import StructuredOutput, clean_error

ALL_ALLOWED = -1  # an int32 word with every bit set
# What a special token's bytes are prefixed with in the vocabulary xgrammar sees. 0xFF is never
# part of UTF-8, and every text rule (strings, regexes, JSON) matches UTF-8 only, so a special
# token is allowed only where a grammar names it by id (a structural tag's `token` format, e.g.
# Kimi's tool-call markers) or as a stop token; never as the text it decodes to, which the
# detokenizer would drop.
SPECIAL_TOKEN_PREFIX = b"\xff"


def tokenizer_info(tokenizer, vocab_size: int):
    """The `xgrammar.TokenizerInfo` of a blockspec `Tokenizer` (either backend: the Kimi tiktoken
    one has no transformers tokenizer): each id's bytes, special tokens marked as above, the
    tokenizer's EOS ids as stop tokens. Ids past the tokenizer's are never allowed."""
    import xgrammar as xgr
    hf = tokenizer.hf_tokenizer
    add_prefix_space = False
    if hf is not None:  # transformers' vocabularies store bytes in several encodings: xgrammar's decoding
        hf_info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size)
        vocab, add_prefix_space = list(hf_info.decoded_vocab), hf_info.add_prefix_space
    else:
        vocab = tokenizer.token_bytes()
    vocab = (vocab + [b""] * vocab_size)[:vocab_size]
    for text, i in tokenizer.special_token_ids.items():
        if i < vocab_size:
            vocab[i] = SPECIAL_TOKEN_PREFIX + text.encode()
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size,
                             stop_token_ids=list(tokenizer.eos_token_ids) or None, add_prefix_space=add_prefix_space)


class GrammarCompiler:
    """Compiles specs against one vocabulary (a blockspec `Tokenizer`'s); xgrammar caches
    compiled grammars, so a schema sent by many requests is compiled once. `vocab_size` is the
    model's (its logits' width): ids past the tokenizer's are never allowed."""

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, cache_enabled=True)

    @property
    def bitmask_words(self) -> int:
        return -(-self.vocab_size // 32)

    def compile(self, spec: StructuredOutput):
        try:
            return self.compiler.compile_grammar(spec.grammar())
        except RuntimeError as e:
            raise ValueError(f"{spec.field}: the grammar cannot be compiled: {clean_error(e)}") from None

    def matcher(self, spec: StructuredOutput, stop_ids: set[int]) -> "RequestGrammar":
        """A request's matcher. `stop_ids` end the request (allowed once the grammar is complete,
        and only then). xgrammar's rollback is unbounded, so any draft depth can be walked back."""
        if not stop_ids:
            raise ValueError(f"{spec.field}: a constrained request needs a stop token to end on "
                             "(ignore_eos needs stop_token_ids)")
        return RequestGrammar(self.compile(spec), sorted(stop_ids))


class RequestGrammar:
    """One request's matcher, always at its committed state between steps."""

    def __init__(self, compiled, stop_ids: list[int]):
        import xgrammar as xgr
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_ids)

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def accept(self, tokens: list[int]) -> None:
        """Commit tokens. A committed token the grammar refuses is a bug (every committed token
        was sampled from a masked distribution), so it raises instead of drifting."""
        for t in tokens:
            if self.matcher.is_terminated():
                return  # the stop token was accepted; the engine ends the request on it
            if not self.matcher.accept_token(int(t)):
                raise RuntimeError(f"the grammar refused committed token {t}")

    def fill_committed(self, bitmask, row: int) -> None:
        """bitmask[row] ← the tokens allowed next after the committed output."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def walk_tree(self, tokens: list[int], parents: list[int], bitmask, row0: int) -> list[bool]:
        """Masks at every node of a draft tree and which nodes' tokens the grammar allows.

        tokens, parents: one row of a DraftTree (node 0 the root = the last committed token,
        parents before children, padding's parent −2). Fills bitmask[row0 + i] with the tokens
        allowed after the path root → i for every node i reached through allowed tokens; other
        rows are left as they are (the caller fills them with ALL_ALLOWED: they are never
        sampled from). Returns allowed[i]: node i's token and all its ancestors' are allowed.
        The matcher is advanced along each path and rolled back, so it ends where it started.
        """
        width = len(tokens)
        children: list[list[int]] = [[] for _ in range(width)]
        for i in range(1, width):
            if parents[i] >= 0:
                children[parents[i]].append(i)
        allowed = [False] * width
        allowed[0] = True
        matcher = self.matcher
        stack = [(0, 0)]           # (node, depth); a node's children are visited before its siblings'
        depth_now = 0
        while stack:
            node, depth = stack.pop()
            if depth < depth_now:  # back up to this node's parent
                matcher.rollback(depth_now - depth)
                depth_now = depth
            if node:
                if not matcher.accept_token(tokens[node]):
                    continue
                allowed[node] = True
                depth_now += 1
            if matcher.is_terminated():
                continue               # a stop token: nothing after it is ever committed
            matcher.fill_next_token_bitmask(bitmask, row0 + node)
            stack.extend((child, depth_now) for child in reversed(children[node]))
        if depth_now:
            matcher.rollback(depth_now)
        return allowed

    def guided_argmax(self, logits, bitmask, unpack) -> list[int]:
        """Greedy drafts under the grammar: for each depth of `logits [L, V]` (host), the argmax
        among the allowed tokens after the drafts chosen so far (`bitmask [1, words]` scratch,
        `unpack(bitmask) -> [V] bool`). Past a stop token (or a dead end) the drafts are the
        plain argmax: nothing after a stop is ever committed. Rolled back to the committed state."""
        matcher = self.matcher
        drafts = logits.argmax(-1).tolist()
        depth = 0
        for k in range(len(drafts)):
            if matcher.is_terminated():
                break
            matcher.fill_next_token_bitmask(bitmask, 0)
            token = int(logits[k].masked_fill(~unpack(bitmask), float("-inf")).argmax())
            if not matcher.accept_token(token):
                break
            drafts[k] = token
            depth += 1
        if depth:
            matcher.rollback(depth)
        return drafts
