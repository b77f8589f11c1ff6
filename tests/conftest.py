import os
import sys

import pytest

# The scripts live in cleanrl/ as plain files (a namespace package): tests import their pieces as
# `cleanrl.ppo_atari` etc. from the repository root.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
