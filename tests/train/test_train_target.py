"""train-target: the tokenizer it trains, and a tiny run whose output transformers and blockspec load."""

import argparse
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from blockspec import LLM, SamplingParams
from blockspec.tokenizer import Tokenizer
from blockspec.train import tokenizer_train as TT
from blockspec.train.cli import add_train_target_arguments, run_train_target
from blockspec.train.data import text_documents
from fixtures import CORPUS


def test_trained_tokenizer_loads_everywhere(tmp_path):
    tok = TT.train_tokenizer(text_documents(CORPUS.splitlines()), tmp_path, vocab_size=320)
    assert TT.special_token_ids(tok) == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|MASK|>": 3}
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token == "<|im_end|>" and hf.pad_token_id == 0
    text = "Déjà vu: 東京 🙂 <|MASK|> code()"
    assert hf.decode(hf.encode(text, add_special_tokens=False)) == text
    ours = Tokenizer.load(tmp_path)
    assert ours.mask_token_id == 3
    chat = [{"role": "user", "content": "hi"}]
    assert ours.render_chat(chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def target_args(tmp_path, *extra):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(CORPUS)
    parser = add_train_target_arguments(argparse.ArgumentParser())
    return parser.parse_args([
        "--data", f"text:{corpus}", "--out", str(tmp_path / "target"), "--vocab-size", "320",
        "--layers", "2", "--hidden-size", "32", "--heads", "4", "--kv-heads", "2", "--intermediate-size", "64",
        "--max-len", "64", "--batch-size", "4", "--lr", "3e-3", "--no-progress", "--device", "cpu", *extra])


@pytest.fixture(scope="module")
def trained_target(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train_target")
    assert run_train_target(target_args(tmp, "--steps", "12", "--eval-every", "6",
                                        "--held-out-fraction", "0.3")) == 0
    return tmp / "target"


def test_target_dir_loads_in_transformers_and_blockspec(trained_target):
    out = trained_target
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 13))
    assert any("eval_loss" in r for r in log) and (out / "loss_curve.png").stat().st_size > 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["tie_word_embeddings"]
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert set(config["eos_token_id"]) == {hf_tok.convert_tokens_to_ids("<|im_end|>"),
                                           hf_tok.convert_tokens_to_ids("<|endoftext|>")}
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = hf_tok.encode("The lighthouse keeper", add_special_tokens=False)
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, min_new_tokens=8,
                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    out_tokens = LLM(model=str(out)).generate(prompt, SamplingParams(temperature=0, max_tokens=8,
                                                                     ignore_eos=True))[0].token_ids
    assert out_tokens == ref


def test_train_target_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="one of --steps, --epochs and --time-budget"):
        run_train_target(target_args(tmp_path, "--steps", "2", "--epochs", "1"))
    with pytest.raises(ValueError, match="one of --steps, --epochs and --time-budget"):
        run_train_target(target_args(tmp_path, "--steps", "2", "--time-budget", "5"))
    with pytest.raises(ValueError, match="--time-budget must be positive"):
        run_train_target(target_args(tmp_path, "--time-budget", "0"))
    with pytest.raises(ValueError, match="kv heads"):
        run_train_target(target_args(tmp_path, "--kv-heads", "3"))
    with pytest.raises(ValueError, match="--data"):
        args = target_args(tmp_path)
        args.data = "nonsense"
        run_train_target(args)
