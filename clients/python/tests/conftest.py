"""Fixtures for tests against real sidecars started by clients/test.sh.

Environment (set by clients/test.sh):
  ANARCHON_A, ANARCHON_B   two sidecars sharing one SQLite file, linked as peers
  ANARCHON_A_PID           A's process id (the lost-lease test pauses it)
  ANARCHON_C, ANARCHON_C_TOKEN   a sidecar that requires this bearer token
  ANARCHON_C_UNIX          C's --listen-unix socket, as unix:PATH
"""

import os
import time
import uuid

import pytest

import anarchon


def _env(name):
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the tests through clients/test.sh")
    return value


@pytest.fixture(scope="session")
def addr_a():
    return _env("ANARCHON_A")


@pytest.fixture(scope="session")
def addr_b():
    return _env("ANARCHON_B")


@pytest.fixture
def a(addr_a):
    with anarchon.Client(addr_a, timeout=10) as c:
        yield c


@pytest.fixture
def b(addr_b):
    with anarchon.Client(addr_b, timeout=10) as c:
        yield c


@pytest.fixture
def job(request):
    return f"py-{request.node.name.replace('_', '-')[:40]}-{uuid.uuid4().hex[:8]}"


def now_ms():
    return int(time.time() * 1000)
