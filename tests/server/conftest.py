"""Fixtures over `live.py`: one live server (fake or real engine) per test module."""

import httpx
import openai
import pytest

from live import live_server


@pytest.fixture(scope="module")
def server():
    with live_server() as s:
        yield s


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.async_engine.model_name


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        yield c
