"""Bench/check tests: one torch thread, since tiny models on the shared 2-core machine run far
faster that way (two threads contend with the other processes)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
