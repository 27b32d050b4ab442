"""Train a byte-level BPE tokenizer for a from-scratch target, with a ChatML chat template.

Special tokens come first, so their ids are fixed whatever the corpus:
  0 <|endoftext|>   document separator and padding
  1 <|im_start|>    ChatML turn start
  2 <|im_end|>      ChatML turn end: the tokenizer's EOS (generation stops after a reply)
  3 <|MASK|>        reserved for DFlash drafters (the block's placeholder tokens)
The directory it writes loads with transformers' AutoTokenizer and blockspec.tokenizer.Tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)
DEFAULT_VOCAB_SIZE = 8192

# ChatML. No default system turn; the generation prompt opens an assistant turn.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- endif -%}"
)


def corpus_texts(items: Iterable, max_chars: int | None = None) -> Iterator[str]:
    """The raw text of chats (every message's content) or documents, up to `max_chars` in all."""
    total = 0
    for item in items:
        texts = [m["content"] for m in item.messages] if hasattr(item, "messages") else [item.text]
        for text in texts:
            if max_chars is not None and total >= max_chars:
                return
            total += len(text)
            yield text


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, show_progress: bool = False):
    """A byte-level BPE (`tokenizers.Tokenizer`) with SPECIAL_TOKENS at ids 0…3.

    Every byte is in the initial alphabet, so any text encodes without an unknown token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be at least {min_size} (256 bytes + {len(SPECIAL_TOKENS)} specials)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=show_progress)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "bos_token": None,
        "unk_token": None,
        "additional_special_tokens": [IM_START, MASK],
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHATML_TEMPLATE,
    }


def save_tokenizer(tokenizer, out_dir: str | Path, model_max_length: int = 1024) -> Path:
    """Write tokenizer.json and tokenizer_config.json (with the ChatML template) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return out


def special_token_ids(tokenizer) -> dict[str, int]:
    """Ids of the special tokens in a tokenizer trained by `train_bpe`."""
    return {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}


def train_tokenizer(items: Iterable, out_dir: str | Path, vocab_size: int = DEFAULT_VOCAB_SIZE,
                    model_max_length: int = 1024, max_chars: int | None = None,
                    show_progress: bool = False):
    """Train on the corpus items (chats or documents) and save; returns the tokenizers.Tokenizer."""
    tokenizer = train_bpe(corpus_texts(items, max_chars), vocab_size, show_progress)
    save_tokenizer(tokenizer, out_dir, model_max_length)
    return tokenizer
