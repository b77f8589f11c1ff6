import os
import sys

# The scripts live in cleanrl/ as plain files (a namespace package): tests import their pieces as
# `cleanrl.ppo_atari` etc. from the repository root.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
