"""Engine TokenLogprobs in the shapes of OpenAI's API (chat `logprobs.content`, the legacy
completions `logprobs` object), for whole responses and for stream chunks alike, so the
concatenated chunks equal the non-streamed body.

Values are the target's raw log-probabilities (before logit_bias, penalties, temperature and
the filters; `blockspec/logprobs.py`). A token's text is its own decode with special tokens kept;
`bytes` is that text's UTF-8 (a token holding part of a multi-byte character decodes to U+FFFD).
"""

from __future__ import annotations

from blockspec.logprobs import TokenLogprob


class LogprobFormatter:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._texts[token_id]

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self.text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def chat(self, logprobs: list[TokenLogprob]) -> dict:
        """`choice.logprobs` of a chat response or chunk: top_logprobs are the k most likely."""
        content = [{**self._entry(lp.token_id, lp.logprob), "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
                   for lp in logprobs]
        return {"content": content, "refusal": None}

    def completion(self, logprobs: list[TokenLogprob], text_offset: int) -> dict:
        """`choice.logprobs` of a completion or chunk whose first token starts at character
        `text_offset` of the completion. As OpenAI documents, top_logprobs holds the k most
        likely tokens and the sampled one (so up to k + 1 entries)."""
        tokens, offsets = [], []
        for lp in logprobs:
            offsets.append(text_offset)
            tokens.append(self.text(lp.token_id))
            text_offset += len(tokens[-1])
        top = [{self.text(t): v for t, v in [*lp.top, (lp.token_id, lp.logprob)]} for lp in logprobs]
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs], "top_logprobs": top,
                "text_offset": offsets}

    def completion_length(self, logprobs: list[TokenLogprob]) -> int:
        """Characters the tokens' texts take (to continue text_offset in the next chunk)."""
        return sum(len(self.text(lp.token_id)) for lp in logprobs)
