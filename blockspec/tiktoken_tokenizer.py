"""Kimi's tokenizer (`tiktoken.model` + `tokenizer_config.json`) without its remote code.

Kimi K2 checkpoints ship no `tokenizer.json`: their tokenizer is `tokenization_kimi.py`
(`tokenizer_class: "TikTokenTokenizer"`), which transformers runs only with
`trust_remote_code`, and blockspec never does. What that code does is data plus tiktoken:

* the ranks are `tiktoken.model` (base64 token, space, rank per line), read by tiktoken;
* the pre-tokenisation pattern is `KIMI_PATTERN` (Han runs split from other letters);
* 256 + 2 special ids follow the ranks, named by `added_tokens_decoder` in tokenizer_config.json
  and `<|reserved_token_{id}|>` where it names none;
* text is encoded with special-token text recognised, in pieces of at most 400,000 characters
  and 25,000 consecutive (non-)whitespace characters (tiktoken's limits), so long inputs give
  the same ids as the remote code; no BOS is added;
* the chat template renders through transformers' own jinja renderer, with the named special
  tokens as variables and `tools` sorted by key, as the remote `apply_chat_template` does.

`TiktokenBackend` is one of `blockspec.tokenizer.Tokenizer`'s two backends (the other wraps a
transformers fast tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

KIMI_CLASS = "TikTokenTokenizer"
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
NUM_SPECIAL_IDS = 256 + 2
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS) -> list[str]:
    """`text` cut so that no piece has more than `max_run` consecutive whitespace or
    non-whitespace characters (one piece when none is that long)."""
    pieces, start, run, in_space = [], 0, 0, text[:1].isspace()
    for i, ch in enumerate(text):
        space = ch.isspace()
        if space != in_space:
            run, in_space = 1, space
        else:
            run += 1
            if run > max_run:
                pieces.append(text[start:i])
                start, run = i, 1
    pieces.append(text[start:])
    return pieces


def _token_text(value: Any) -> str | None:
    """A tokenizer_config token entry: a string, or an AddedToken dict with its `content`."""
    return value.get("content") if isinstance(value, dict) else value


def _chat_template(model_dir: Path, config: dict) -> str | None:
    """chat_template.jinja first (transformers gives the file priority), then the config's
    `chat_template` (a string, or a list of named templates: the "default" one)."""
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    return template


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_keys(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


class TiktokenBackend:
    """Encode/decode through a tiktoken Encoding; the chat template through transformers' renderer."""

    def __init__(self, ranks: dict[bytes, int], config: dict, chat_template: str | None, name: str = "tiktoken"):
        import tiktoken

        base = len(ranks)
        decoder = {int(i): t for i, t in (config.get("added_tokens_decoder") or {}).items()}
        names = {i: _token_text(decoder[i]) if i in decoder else f"<|reserved_token_{i}|>"
                 for i in range(base, base + NUM_SPECIAL_IDS)}
        self._encoding = tiktoken.Encoding(name=name, pat_str=KIMI_PATTERN, mergeable_ranks=ranks,
                                           special_tokens={t: i for i, t in names.items()})
        self.vocab_size: int = self._encoding.n_vocab
        # Control tokens (skipped when decoding with skip_special_tokens): every id of the
        # special block but those tokenizer_config marks "special": false.
        self.special_tokens: dict[str, int] = {
            t: i for i, t in names.items() if not (i in decoder and decoder[i].get("special") is False)}
        self._skipped = frozenset(self.special_tokens.values())
        self._by_text = {t: i for i, t in names.items()}
        self._named = {k: _token_text(config[k]) for k in NAMED_SPECIAL_TOKENS if config.get(k) is not None}
        self.eos_token_id: int | None = self._by_text.get(self._named.get("eos_token", ""))
        self.chat_template = chat_template

    @classmethod
    def load(cls, model_dir: str | Path) -> "TiktokenBackend":
        """Read `tiktoken.model`, `tokenizer_config.json` and the chat template of `model_dir`."""
        from tiktoken.load import load_tiktoken_bpe

        path = Path(model_dir)
        config_path = path / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        if config.get("tokenizer_class") != KIMI_CLASS:
            raise ValueError(f"{path / 'tiktoken.model'}: tokenizer_config.json names tokenizer_class "
                             f"{config.get('tokenizer_class')!r}; only Kimi's {KIMI_CLASS!r} is known "
                             "(its pre-tokenisation pattern lives in remote code, which blockspec never runs)")
        try:
            ranks = load_tiktoken_bpe(str(path / "tiktoken.model"))
        except Exception as exc:  # tiktoken raises ValueError / binascii.Error on a malformed file
            raise ValueError(f"could not read {path / 'tiktoken.model'}: {exc}") from exc
        return cls(ranks, config, _chat_template(path, config), name=path.name)

    def token_to_id(self, text: str) -> int | None:
        return self._by_text.get(text)

    def token_bytes(self) -> list[bytes]:
        """Every id's bytes in id order (a special token's: its text)."""
        return [self._encoding.decode_single_token_bytes(i) for i in range(self.vocab_size)]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`, special-token text as the special tokens (Kimi adds no BOS/EOS, so
        `add_special_tokens` changes nothing)."""
        return self._encode(text, lambda piece: self._encoding.encode(piece, allowed_special="all"))

    def encode_text_only(self, text: str) -> list[int]:
        """Ids of `text` with special-token text encoded as ordinary text."""
        return self._encode(text, self._encoding.encode_ordinary)

    def _encode(self, text: str, encode: Callable[[str], list[int]]) -> list[int]:
        ids: list[int] = []
        for i in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in split_long_runs(text[i:i + MAX_ENCODE_CHARS]):
                ids += encode(piece)
        return ids

    def decoder(self, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
        """ids → text (an incomplete UTF-8 tail decodes to U+FFFD, which streaming holds back)."""
        decode, skipped = self._encoding.decode, self._skipped
        if not skip_special_tokens:
            return decode
        return lambda ids: decode([i for i in ids if i not in skipped])

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat template applied as transformers applies it: messages without their None
        fields, the named special tokens as variables (template kwargs take precedence)."""
        from transformers.utils.chat_template_utils import render_jinja_template

        template_kwargs = dict(template_kwargs)
        tools = _sorted_keys(template_kwargs.pop("tools", None))
        documents = template_kwargs.pop("documents", None)
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        rendered, _ = render_jinja_template(conversations=[chat], tools=tools, documents=documents,
                                            chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt,
                                            **{**self._named, **template_kwargs})
        return rendered[0]
