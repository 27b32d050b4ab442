import pytest

from dflash_fixtures import write_dflash_drafter


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, qwen3_dir):
    """A random DFlash drafter (block 5) for the tiny Qwen3 target."""
    return str(write_dflash_drafter(tmp_path_factory.mktemp("d"), qwen3_dir, block_size=5))
