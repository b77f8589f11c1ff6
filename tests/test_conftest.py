"""The lock of tests/conftest.py that lets a speed-measuring test run with no other test beside it
under `pytest -n 2`."""

import fcntl

import pytest
from conftest import CORES_LOCK


def test_every_test_holds_the_cores_lock_shared():
    with open(CORES_LOCK) as other:
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # other tests can run beside this one
        fcntl.flock(other, fcntl.LOCK_UN)
        with pytest.raises(BlockingIOError):  # an `alone` test must wait for it
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.alone
def test_a_test_marked_alone_holds_the_cores_lock_exclusively():
    with open(CORES_LOCK) as other, pytest.raises(BlockingIOError):  # no other test can start
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
