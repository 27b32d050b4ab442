"""Session-wide test setup: tests/ on sys.path, two torch threads, tiny checkpoints built once."""

from __future__ import annotations

import sys
from pathlib import Path

# Test helper modules (fixtures.py, dflash_fixtures.py) import as top-level modules whatever
# pytest's import mode.
TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import os  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Without CUDA the Triton kernels run under Triton's interpreter. The variable is read when a
# kernel is defined, so it is set here, before any test module can import one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fixtures import write_llama, write_qwen2, write_qwen3, write_tiny_vocab_qwen3  # noqa: E402

# The test machine's cores are shared; more threads only contend.
torch.set_num_threads(2)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> str:
    """Llama, llama3 RoPE scaling, config.json in the old rope_theta/rope_scaling convention."""
    return str(write_llama(tmp_path_factory.mktemp("llama")))


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> str:
    """Qwen2 with q/k/v bias, new rope_parameters convention, template in chat_template.jinja."""
    return str(write_qwen2(tmp_path_factory.mktemp("qwen2")))


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory) -> str:
    """Qwen3 with tied embeddings and q/k norms."""
    return str(write_qwen3(tmp_path_factory.mktemp("qwen3")))


@pytest.fixture(scope="session")
def qwen3_sharded_dir(tmp_path_factory) -> str:
    """Untied 3-layer Qwen3 in several safetensors shards, old rope convention."""
    return str(write_qwen3(tmp_path_factory.mktemp("qwen3_sharded"), sharded=True, num_layers=3,
                           tie_word_embeddings=False, rope_convention="old"))


@pytest.fixture(scope="session")
def tiny_vocab_dir(tmp_path_factory) -> str:
    """Qwen3 over a 12-token vocabulary, for exact-enumeration statistical tests."""
    return str(write_tiny_vocab_qwen3(tmp_path_factory.mktemp("tiny_vocab")))


@pytest.fixture(scope="session")
def deepseek_dir(tmp_path_factory) -> str:
    """DeepSeek-V3: MLA with q_lora, 1 dense layer then 8 sigmoid-routed experts + 1 shared."""
    from moe_fixtures import write_deepseek_v3
    return str(write_deepseek_v3(tmp_path_factory.mktemp("deepseek_v3")))


@pytest.fixture(scope="session")
def qwen3_moe_dir(tmp_path_factory) -> str:
    """Qwen3-MoE: 8 softmax-routed experts (top-2, renormalised), layer 1 dense."""
    from moe_fixtures import write_qwen3_moe
    return str(write_qwen3_moe(tmp_path_factory.mktemp("qwen3_moe")))
