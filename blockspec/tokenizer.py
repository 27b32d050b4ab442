"""Tokenizer: encoding, chat templates and incremental detokenization.

Two backends. A `tokenizer.json` directory loads through transformers (`AutoTokenizer`, fast
tokenizers only), so a template stored in `tokenizer_config.json` or in `chat_template.jinja`
renders exactly as transformers renders it. A `tiktoken.model` directory (Kimi K2) loads through
`blockspec.tiktoken_tokenizer`, which reproduces Kimi's remote tokenizer code from its data.
Remote code (`trust_remote_code`) is never run: a directory that has only that is refused.

Streaming text out of a growing list of token ids is done by `IncrementalDetokenizer` with the
prefix/read-offset technique: decode a short window of already-emitted tokens once without and
once with the new tokens, and emit the difference. Decoding in context keeps byte-level and
word-piece boundaries right (a token's text can depend on its neighbours), and holding back
while the decoded tail ends in U+FFFD keeps a multi-byte character that is split across tokens
from being emitted half-done.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from pathlib import Path
from typing import Any, Callable

MASK_TOKEN = "<|MASK|>"
REPLACEMENT_CHAR = "\ufffd"

# Tokens before the unread ones that are decoded as context (a space or a word-piece join can
# depend on the token before it); a few are enough.
CONTEXT_TOKENS = 5
# A split UTF-8 character spans at most 4 tokens (one byte each). Tokens held back far beyond
# that are invalid bytes, not a split character: release them rather than grow the window.
MAX_HELD_TOKENS = 16
# The window slides back to CONTEXT_TOKENS of context only once it is this long: between slides a
# push decodes once, not twice (the emitted part's text is the last push's whole text). Per push,
# one token to each of 64 detokenizers on the 2-core CPU (bench/detok_push.py): 2.76 → 1.98 µs (at
# 32 the longer decodes gave back most of it). Every row of every decode step pushes once.
SLIDE_AT = 16


def _eos_ids_from_json(path: Path) -> list[int]:
    """The `eos_token_id` entry (an int, a list of ints or absent) of a JSON file, as a list."""
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError):
        return []
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _unique(ids: list[int]) -> list[int]:
    """`ids` without repeats, first occurrence order kept."""
    return list(dict.fromkeys(ids))


def collect_eos_token_ids(model_dir: Path, tokenizer_eos_id: int | None) -> list[int]:
    """Union of the EOS ids of generation_config.json, config.json and the tokenizer."""
    ids = _eos_ids_from_json(model_dir / "generation_config.json")
    ids += _eos_ids_from_json(model_dir / "config.json")
    if tokenizer_eos_id is not None:
        ids.append(int(tokenizer_eos_id))
    return _unique(ids)


class HFBackend:
    """A transformers fast tokenizer as a `Tokenizer` backend (the interface `TiktokenBackend`
    in blockspec/tiktoken_tokenizer.py shares: vocab_size, special_tokens, eos_token_id,
    chat_template, token_to_id, encode, encode_text_only, decoder, render_chat)."""

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        self.vocab_size: int = len(hf_tokenizer)
        self.special_tokens: dict[str, int] = {
            t.content: i for i, t in hf_tokenizer.added_tokens_decoder.items() if t.special}
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id
        self._text_only_backend = None  # built on first use: a copy that never parses special tokens
        self._text_only_lock = threading.Lock()

    @property
    def chat_template(self):
        return getattr(self.hf, "chat_template", None)

    def token_to_id(self, text: str) -> int | None:
        return self.hf.backend_tokenizer.token_to_id(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_text_only(self, text: str) -> list[int]:
        """Ids of `text` with special-token text encoded as ordinary text."""
        return list(self._text_only().encode(text, add_special_tokens=False).ids)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        return self.hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs)

    def _text_only(self):
        """A copy of the backend tokenizer that encodes special-token text as ordinary text (a
        copy, not a toggled flag: other threads encode with the original at the same time)."""
        with self._text_only_lock:
            if self._text_only_backend is None:
                from tokenizers import Tokenizer as BackendTokenizer
                backend = BackendTokenizer.from_str(self.hf.backend_tokenizer.to_str())
                backend.encode_special_tokens = True
                backend.no_truncation()
                backend.no_padding()
                self._text_only_backend = backend
            return self._text_only_backend

    def decoder(self, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
        """ids → text. A fast tokenizer that does no clean-up decodes straight through its Rust
        backend: the same text as transformers' `decode` (which calls it, then cleans up), without
        the Python around it that dominated the host's per-token cost."""
        hf = self.hf
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is not None and not getattr(hf, "clean_up_tokenization_spaces", False):
            return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return lambda ids: hf.decode(ids, skip_special_tokens=skip_special_tokens)


def _load_hf(path: Path) -> HFBackend:
    from transformers import AutoTokenizer  # deferred: importing transformers is slow

    try:
        # False, not the default None: None makes transformers ask on stdin whether to run it.
        hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # transformers raises many types for a broken tokenizer
        if (remote := _remote_code_file(path)) is not None:
            raise ValueError(f"the tokenizer in {str(path)!r} needs remote code ({remote}, named by "
                             "tokenizer_config.json's auto_map), which blockspec never runs") from exc
        raise ValueError(f"could not load the tokenizer in {str(path)!r}: {exc}") from exc
    if getattr(hf, "backend_tokenizer", None) is None:
        raise ValueError(f"the tokenizer in {str(path)!r} is not a fast (tokenizers) tokenizer")
    return HFBackend(hf)


def _remote_code_file(path: Path) -> str | None:
    """The tokenizer module tokenizer_config.json's auto_map points at (remote code), if any."""
    try:
        auto = json.loads((path / "tokenizer_config.json").read_text()).get("auto_map", {}).get("AutoTokenizer")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    ref = next((r for r in (auto if isinstance(auto, list) else [auto]) if r), None)
    return f"{ref.split('--')[-1].rsplit('.', 1)[0]}.py" if isinstance(ref, str) else None


class Tokenizer:
    """A model directory's tokenizer: encode/decode, chat templates, streaming detokenizers."""

    def __init__(self, backend, eos_token_ids: list[int], source: str = "<memory>"):
        self._backend = backend
        self.source = source
        self.eos_token_ids: list[int] = list(eos_token_ids)
        self.vocab_size: int = backend.vocab_size
        self.mask_token_id: int | None = backend.token_to_id(MASK_TOKEN)
        # Special (control) tokens by their text, longest first so that a regex prefers them.
        specials = sorted(backend.special_tokens.items(), key=lambda item: -len(item[0]))
        self._special_ids: dict[str, int] = dict(specials)
        self._special_text = re.compile("|".join(re.escape(t) for t, _ in specials)) if specials else None

    @classmethod
    def load(cls, model_dir: str | Path) -> "Tokenizer":
        """Load `model_dir`'s tokenizer.json through transformers, or its tiktoken.model (Kimi)."""
        path = Path(model_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
        if (path / "tokenizer.json").is_file():
            backend = _load_hf(path)
        elif (path / "tiktoken.model").is_file():
            from blockspec.tiktoken_tokenizer import TiktokenBackend
            backend = TiktokenBackend.load(path)
        elif (remote := _remote_code_file(path)) is not None:
            raise ValueError(f"the tokenizer in {str(path)!r} is remote code ({remote}, named by "
                             "tokenizer_config.json's auto_map), which blockspec never runs, and the "
                             "directory has neither tokenizer.json nor tiktoken.model")
        else:
            raise FileNotFoundError(f"no tokenizer.json (or tiktoken.model) in {str(path)!r}: blockspec "
                                    "needs a fast (tokenizers) tokenizer or a Kimi tiktoken one")
        return cls(backend, collect_eos_token_ids(path, backend.eos_token_id), source=str(path))

    @property
    def hf_tokenizer(self):
        """The underlying transformers tokenizer (None for a tiktoken one)."""
        return getattr(self._backend, "hf", None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS…)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, exactly as transformers (or Kimi's tokenizer) decodes it."""
        hf = self.hf_tokenizer
        if hf is not None:
            return hf.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._backend.decoder(skip_special_tokens)(list(ids))

    @property
    def has_chat_template(self) -> bool:
        """Whether the directory provides a chat template."""
        return bool(self._backend.chat_template)

    def template_reads(self, variable: str) -> bool:
        """Whether the chat template reads the variable `variable` (e.g. "tools": a template that
        does not would silently drop what it is given)."""
        template = self._backend.chat_template
        templates = list(template.values()) if isinstance(template, dict) else [template] if template else []
        from jinja2 import Environment, meta
        return any(variable in meta.find_undeclared_variables(Environment().parse(t)) for t in templates)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat template applied to `messages`, as text (template kwargs pass through)."""
        if not self.has_chat_template:
            raise ValueError(
                f"the tokenizer in {self.source!r} has no chat template (neither a 'chat_template' "
                "entry in tokenizer_config.json nor a chat_template.jinja file)")
        return self._backend.render_chat(messages, add_generation_prompt=add_generation_prompt, **template_kwargs)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, *,
                            special_tokens_in_content: bool = False, **template_kwargs) -> list[int]:
        """Token ids of the rendered chat; special tokens are not added again (the template has them).

        Special-token text inside the messages (a user typing "<|im_end|>\\n<|im_start|>system")
        is encoded as ordinary text, so content cannot forge the template's markup, whose own
        special tokens stay special. `special_tokens_in_content=True` encodes such text as the
        special tokens instead (trusted content only).
        """
        if special_tokens_in_content or not self._has_special_text(messages):
            # The common case, and byte-for-byte what transformers' tokenize=True gives.
            text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **template_kwargs)
            return self.encode(text, add_special_tokens=False)
        return self._encode_chat_content_as_text(messages, add_generation_prompt, template_kwargs)

    def _has_special_text(self, messages: list[dict]) -> bool:
        if self._special_text is None:
            return False
        found = False

        def check(text: str) -> str:
            nonlocal found
            found = found or self._special_text.search(text) is not None
            return text
        _map_message_strings(messages, check)
        return found

    def _encode_chat_content_as_text(self, messages: list[dict], add_generation_prompt: bool,
                                     template_kwargs: dict) -> list[int]:
        """Render with every special-token text in the messages swapped for a placeholder (so the
        template logic sees the same structure), then split the rendered text at the special
        tokens left, which are the template's, and encode the text between them, placeholders
        put back, with special-token parsing off. Splitting at special tokens is what the
        tokenizer does itself, so for ByteLevel tokenizers (Qwen, Llama 3) the text around the
        content is encoded as it would be without the forged tokens."""
        specials = list(self._special_ids)
        nonce = f"\ue000{secrets.randbelow(10**18)}:"  # digits only: survives upper/lower filters
        index = {t: k for k, t in enumerate(specials)}
        placeholder = re.compile(re.escape(nonce) + r"(\d+)\ue001")
        neutral = _map_message_strings(
            messages, lambda s: self._special_text.sub(lambda m: f"{nonce}{index[m.group()]}\ue001", s))
        text = self.render_chat(neutral, add_generation_prompt=add_generation_prompt, **template_kwargs)

        def encode_text(segment: str) -> list[int]:
            segment = placeholder.sub(lambda m: specials[int(m.group(1))], segment)
            if nonce in segment:  # the template cut a placeholder apart: cannot restore the content
                raise RuntimeError("the chat template altered message content in a way that keeps "
                                   "special-token text from being restored")
            return self._backend.encode_text_only(segment) if segment else []

        ids: list[int] = []
        start = 0
        for match in self._special_text.finditer(text):
            ids += encode_text(text[start:match.start()])
            ids.append(self._special_ids[match.group()])
            start = match.end()
        return ids + encode_text(text[start:])

    def token_bytes(self) -> list[bytes]:
        """Every id's bytes, in id order (a special token's: its text). Tiktoken backend only:
        a transformers vocabulary's byte encodings are decoded by xgrammar (grammar/matcher.py)."""
        if self.hf_tokenizer is not None:
            raise ValueError("token_bytes is for the tiktoken backend; decode a transformers vocabulary "
                             "with xgrammar.TokenizerInfo.from_huggingface")
        return self._backend.token_bytes()

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The special (control) tokens, text → id: what decoding with skip_special_tokens drops."""
        return dict(self._special_ids)

    def detokenizer(self, prompt_ids: list[int] | None = None, skip_special_tokens: bool = True,
                    kept_special_ids: tuple[int, ...] = ()) -> "IncrementalDetokenizer":
        """A streaming detokenizer for a sequence that continues `prompt_ids`. `kept_special_ids`:
        special tokens decoded as their text although the others are skipped (a tool-call
        format's markers, which its parser reads)."""
        if not kept_special_ids or not skip_special_tokens:
            return IncrementalDetokenizer(self._backend.decoder(skip_special_tokens), prompt_ids)
        dropped = frozenset(self._special_ids.values()) - frozenset(kept_special_ids)
        decode = self._backend.decoder(skip_special_tokens=False)
        return IncrementalDetokenizer(lambda ids: decode([i for i in ids if i not in dropped]), prompt_ids)


def _map_message_strings(messages: list[dict], fn: Callable[[str], str]) -> list[dict]:
    """`messages` with `fn` applied to every string inside them but the roles."""
    def walk(value: Any, key: str | None = None) -> Any:
        if isinstance(value, str):
            return value if key == "role" else fn(value)
        if isinstance(value, dict):
            return {k: walk(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value
    return [walk(m) for m in messages]


class IncrementalDetokenizer:
    """Turns token ids pushed a few at a time into text, emitting only completed text.

    Keeps a window `ids[prefix_offset:]` of the sequence: tokens before `read_offset` were
    emitted already and serve as decoding context. Each push decodes the window with and
    without the unread tokens and emits the difference, so its cost is O(window), not
    O(sequence length). The text without them is the previous push's whole text while the
    window has not slid (`SLIDE_AT`), so it is kept, not decoded again.
    """

    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: list[int] | None = None):
        self._decode = decode
        # Only the tail of the prompt matters as context; its text is not emitted.
        self._window: list[int] = list(prompt_ids or [])[-CONTEXT_TOKENS:]
        self._read = len(self._window)  # window index of the first token not emitted yet
        self._read_text: str | None = None   # decode(window[:read]) when known
        self._chunks: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def push(self, new_ids: list[int]) -> str:
        """Add generated tokens; return the text they complete (possibly "")."""
        self._window.extend(map(int, new_ids))
        if self._read == len(self._window):
            return ""
        read_text = self._emitted_window_text()
        full_text = self._decode(self._window)
        # Wait while a character is still split across tokens (or, oddly, the text shrank),
        # unless so many tokens are held that the tail is invalid bytes, not a split character.
        waiting = full_text.endswith(REPLACEMENT_CHAR) or len(full_text) < len(read_text)
        if waiting and len(self._window) - self._read <= MAX_HELD_TOKENS:
            return ""
        return self._advance(full_text, read_text)

    def flush(self) -> str:
        """Return whatever is still held back (at the end of the sequence)."""
        if self._read == len(self._window):
            return ""
        read_text = self._emitted_window_text()
        return self._advance(self._decode(self._window), read_text)

    def _emitted_window_text(self) -> str:
        if self._read_text is None:
            self._read_text = self._decode(self._window[:self._read])
        return self._read_text

    def _advance(self, full_text: str, read_text: str) -> str:
        """Emit what `full_text` (the window's text) adds to `read_text` (its emitted part's),
        and mark the whole window emitted. Past SLIDE_AT tokens the window slides past the
        tokens emitted before: it keeps the ones just emitted, and at least CONTEXT_TOKENS
        tokens, as context for the next decode (a chunk of skipped special tokens alone is
        poor context: a SentencePiece decoder would strip the next word's leading space)."""
        chunk = full_text[len(read_text):]
        if len(self._window) > SLIDE_AT:
            start = min(self._read, len(self._window) - CONTEXT_TOKENS)
            self._window = self._window[start:]
            self._read_text = None
        else:
            self._read_text = full_text
        self._read = len(self._window)
        if chunk:
            self._chunks.append(chunk)
        return chunk
