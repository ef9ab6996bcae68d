"""The tests run against a real daemon, which the caller starts (make test does, from
cmd/appliance's TestPythonClient) and names in the environment:

  SANDCELL_SOCKET               its Unix socket (this uid: runner, approver, admin)
  SANDCELL_TEST_URL             its TCP address, http://127.0.0.1:PORT
  SANDCELL_TEST_TOKEN           a runner's bearer token
  SANDCELL_TEST_APPROVER_TOKEN  an approver's bearer token
  SANDCELL_TEST_RETRY_TOKEN     another runner's (runs.max_per_caller = 2)
  SANDCELL_TEST_NATIVE          "1" where the native backend is installed
"""

import os

import pytest

import sandcell


def _env(name: str) -> str:
    v = os.environ.get(name)
    if not v:
        pytest.exit(f"{name} is not set: these tests need a running daemon (make test starts one)", returncode=2)
    return v


@pytest.fixture(scope="session")
def socket_path() -> str:
    return _env("SANDCELL_SOCKET")


@pytest.fixture(scope="session")
def url() -> str:
    return _env("SANDCELL_TEST_URL")


@pytest.fixture()
def client(socket_path):
    with sandcell.Client(socket_path) as c:
        yield c


@pytest.fixture()
def agent(url):
    """A runner over TCP, with its token."""
    with sandcell.Client(url=url, token=_env("SANDCELL_TEST_TOKEN")) as c:
        yield c


@pytest.fixture()
def approver(url):
    with sandcell.Client(url=url, token=_env("SANDCELL_TEST_APPROVER_TOKEN")) as c:
        yield c


@pytest.fixture()
def native() -> bool:
    if os.environ.get("SANDCELL_TEST_NATIVE") != "1":
        pytest.skip("the native backend is not installed here (make native)")
    return True
