"""The real Engine on a tiny checkpoint, for server tests.

Directly, from a fixture (with the session's `qwen3_dir`):

    engine = make_real_engine(qwen3_dir, spec="dflash", draft_dir=drafter, max_running_requests=32)

Or to run the generic server tests against the real engine (tests/server is on sys.path there):

    BLOCKSPEC_SERVER_TEST_ENGINE=real_engine:build_engine          # no speculation
    BLOCKSPEC_SERVER_TEST_ENGINE=real_engine:build_ngram_engine
    BLOCKSPEC_SERVER_TEST_ENGINE=real_engine:build_dflash_engine   # random DFlash drafter

The no-argument factories write the tiny Qwen3 checkpoint (and the drafter) once per process
into a temporary directory that is removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
from pathlib import Path

_TESTS_DIR = Path(__file__).resolve().parent.parent
if str(_TESTS_DIR) not in sys.path:  # fixtures.py / dflash_fixtures.py live in tests/
    sys.path.insert(0, str(_TESTS_DIR))

from blockspec.engine.config import EngineConfig
from blockspec.engine.engine import Engine  # noqa: E402

DRAFT_BLOCK_SIZE = 8   # the random drafter's trained block size
SPEC_BLOCK_SIZE = 4    # block size the engines run with (small: cheap verify steps on CPU)


def make_real_engine(model_dir: str, *, spec: str = "none", draft_dir: str | None = None,
                     **config: object) -> Engine:
    """An Engine on `model_dir`; `config` overrides EngineConfig fields. The speculation policy
    is static: these servers are checked to give a seeded request the same answer whatever the
    load, which the adaptive policy promises for the distribution only (docs/adaptive.md)."""
    fields = dict(model=str(model_dir), spec=spec, dtype="float32", device="cpu", spec_policy="static")
    if spec in ("ngram", "dflash", "ddtree"):
        fields["block_size"] = SPEC_BLOCK_SIZE
    if spec in ("dflash", "ddtree"):
        if draft_dir is None:
            raise ValueError(f"spec {spec!r} needs draft_dir")
        fields["draft_model"] = str(draft_dir)
    fields.update(config)
    return Engine(EngineConfig(**fields))


@functools.lru_cache(maxsize=None)
def tiny_checkpoints() -> tuple[str, str]:
    """(tiny Qwen3 dir, random DFlash drafter dir), written once per process."""
    from dflash_fixtures import write_dflash_drafter
    from fixtures import write_qwen3

    root = Path(tempfile.mkdtemp(prefix="blockspec-real-engine-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    model = write_qwen3(root / "qwen3")
    drafter = write_dflash_drafter(root / "drafter", model, block_size=DRAFT_BLOCK_SIZE)
    return str(model), str(drafter)


def build_engine() -> Engine:
    model, _ = tiny_checkpoints()
    return make_real_engine(model)


def build_ngram_engine() -> Engine:
    model, _ = tiny_checkpoints()
    return make_real_engine(model, spec="ngram")


def build_dflash_engine() -> Engine:
    model, drafter = tiny_checkpoints()
    return make_real_engine(model, spec="dflash", draft_dir=drafter)
