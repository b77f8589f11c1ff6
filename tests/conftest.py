import fcntl
import os
import shutil
import sys
import tempfile

import pytest

# The scripts live in cleanrl/ as plain files (a namespace package): tests import their pieces as
# `cleanrl.ppo_atari` etc. from the repository root.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# JAX compiles the same small programs in many tests, most of them in a process of their own: its
# persistent cache keeps each compiled program on disk, keyed on the program, its devices and JAX's
# version, so that a later test loads it instead of compiling it again (a short run of the JAX
# script: about 38 s instead of 47-58 s on the 2-core machine). Set before any test imports JAX;
# the scripts the tests start inherit it.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"cleanrl-fast-tests-jax-cache-{os.getuid()}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


# The README's command runs the tests in 2 processes (pytest-xdist), which share the cores. A test
# marked `alone` measures speed (which process is faster) and needs the machine to itself: it holds
# this lock exclusively, every other test holds it shared, from its setup (module fixtures included)
# to its teardown. Two pytest sessions of one user on one machine share it as well.
CORES_LOCK = os.path.join(tempfile.gettempdir(), f"cleanrl-fast-tests-{os.getuid()}.lock")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with open(CORES_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        return (yield)


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """The scripts' main() sets torch's thread count (dqn.py and others: one thread); give the later
    tests in this process their default back."""
    if "torch" not in sys.modules:  # a test that never imported torch changed nothing
        yield
        return
    torch = sys.modules["torch"]
    num_threads = torch.get_num_threads()
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture
def make_hosts():
    """make_hosts(n) -> a benchmark/hosts.py Cluster of n hosts (node1 .. nodeN, each its own address,
    name and disk under a new folder /tmp/hosts-XXXXXXXX), removed after the test whatever its outcome.
    Skips where hosts cannot be made (not root, no network namespaces), saying why. The folder is short,
    not pytest's tmp_path: the daemons on the hosts (munged, slurmstepd) make Unix sockets in it, whose
    paths must fit in 108 bytes, and under pytest-xdist tmp_path alone takes 70."""
    from benchmark.hosts import Cluster, hosts_missing

    if reason := hosts_missing():
        pytest.skip(reason)
    made = []

    def make(n: int, rate: str | None = None) -> Cluster:
        made.append(Cluster(n, tempfile.mkdtemp(prefix="hosts-", dir="/tmp")).up())
        if rate is not None:
            made[-1].limit(rate)
        return made[-1]

    yield make
    for cluster in made:
        cluster.down()
        shutil.rmtree(cluster.root, ignore_errors=True)
