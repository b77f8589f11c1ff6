"""The run-infrastructure blocks (progress, logging, run lock, checkpoints, videos, evaluation) are one
design each, copied into every script that has them: duplication by design, held under this test.
A copy may differ from the others only in lines that end in `# this script` (the env library, the
network's type, the serialization); any other difference is drift, and fails here with the diff."""

import ast
import difflib
import os

import pytest
from running import REPO_ROOT

MARK = "# this script"

# Which scripts carry which block: the families, then the blocks each family shares. A script that
# gains a block joins its family's list.
JAX = "ppo_atari_envpool_xla_jax_scan.py"
ATARI_PPO = ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py", "ppo_atari_lstm.py"]  # torch PPO on Atari
ATARI_TORCH = [
    *ATARI_PPO,
    "dqn_atari.py",
    "c51_atari.py",
    "pqn_atari.py",
]  # videos of env 0's games step by step, evaluation
ATARI = [*ATARI_TORCH, JAX]  # saved models, the evaluation's report
DETERMINISTIC_POLICIES = ["td3_continuous_action.py", "ddpg_continuous_action.py"]  # MuJoCo, replay buffer checkpointed
WITH_CHECKPOINTS = [*ATARI_TORCH, JAX, *DETERMINISTIC_POLICIES]
FRAME_MEMORY = ["dqn_atari.py", "c51_atari.py"]  # the off-policy Atari scripts' replay memory, each frame once
# gymnasium's RecordVideo records their videos; finish_logging hands the files to wandb.
SMALL_SCRIPTS = ["ppo.py", "ppo_continuous_action.py", "sac_continuous_action.py", *DETERMINISTIC_POLICIES]
ALL = [*ATARI, "dqn.py", *SMALL_SCRIPTS]
BF16_CNN = [*ATARI_PPO, "pqn_atari.py"]  # torch CNNs with --mixed-precision bf16
BLOCKS = {
    "fail": ALL,
    "start_logging": ALL,
    "Progress": ALL,
    "finish_logging": [*SMALL_SCRIPTS, "dqn.py"],
    "check_env_exists": ["dqn.py", "ppo_continuous_action.py", "sac_continuous_action.py", *DETERMINISTIC_POLICIES],
    "warn_if_bf16_is_slow": [*BF16_CNN, "c51_atari.py"],
    "keep_freed_memory": [*BF16_CNN, *DETERMINISTIC_POLICIES],
    "acting_copy": BF16_CNN,
    "capped_cubic": ATARI,
    "VideoRecorder": ATARI_TORCH,
    "save_model": [*ATARI, "dqn.py"],
    "load_model": [*ATARI, "dqn.py"],
    "evaluate": [s for s in ATARI_TORCH if s != "ppo_atari_lstm.py"],  # the LSTM's carries and resets its state
    "run_evaluation": ATARI,
    "lock_run": WITH_CHECKPOINTS,
    "RESUMABLE_CHANGES": WITH_CHECKPOINTS,
    "save_checkpoint": WITH_CHECKPOINTS,
    "load_checkpoint": WITH_CHECKPOINTS,
    "FrameReplayBuffer": FRAME_MEMORY,
    "MIN_SLOTS_PER_ENV": FRAME_MEMORY,
    **dict.fromkeys(
        ["make_env", "ReplayBuffer", "save_policy", "load_policy", "evaluate_policy"], DETERMINISTIC_POLICIES
    ),
}


def blocks_of(source: str) -> dict[str, list[str]]:
    """The text of each top-level function, class and constant of a script, by name; the statements
    that build one constant (`X = ...`, `X |= ...`) are one block."""
    lines, blocks = source.splitlines(), {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            name = node.name
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            name = getattr(target, "id", None)
        else:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        blocks.setdefault(name, []).extend(lines[first - 1 : node.end_lineno])
    return blocks


def shared_text(block: list[str]) -> list[str]:
    """A block without its marked lines: the text every copy must share."""
    return [line for line in block if not line.rstrip().endswith(MARK) and f"{MARK}:" not in line]


def drift(copies: dict[str, list[str]]) -> str:
    """'' when every copy shares its unmarked text with the first; else the diffs against it."""
    (first, reference), *others = copies.items()
    diffs = []
    for script, block in others:
        diff = difflib.unified_diff(shared_text(reference), shared_text(block), first, script, lineterm="")
        diffs.extend(diff)
    return "\n".join(diffs)


@pytest.fixture(scope="module")
def scripts() -> dict[str, dict[str, list[str]]]:
    names = {script for holders in BLOCKS.values() for script in holders}
    found = {}
    for script in sorted(names):
        with open(os.path.join(REPO_ROOT, "cleanrl", script)) as f:
            found[script] = blocks_of(f.read())
    return found


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_every_copy_of_a_block_is_the_same_text_but_for_marked_lines(scripts, block):
    missing = [script for script in BLOCKS[block] if block not in scripts[script]]
    assert not missing, f"{block} is missing from {missing}"
    copies = {script: scripts[script][block] for script in BLOCKS[block]}
    assert drift(copies) == "", f"{block} has drifted:\n{drift(copies)}"


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_marked_lines_stay_few(scripts, block):
    # A block that differs in most of its lines is not one design: give each script its own.
    for script in BLOCKS[block]:
        text = scripts[script][block]
        assert len(text) - len(shared_text(text)) <= max(2, len(text) // 3), (script, block)


def test_a_changed_copy_is_caught():
    source = "def f(x):\n    return x + 1\n\n\ndef g():\n    return 2  # this script\n"
    changed = source.replace("x + 1", "x + 2").replace("return 2", "return 3")
    assert drift({"a.py": blocks_of(source)["g"], "b.py": blocks_of(changed)["g"]}) == "", "marked lines may differ"
    report = drift({"a.py": blocks_of(source)["f"], "b.py": blocks_of(changed)["f"]})
    assert "-    return x + 1" in report and "+    return x + 2" in report


# Each script is copied alone into users' projects: it may import libraries, never a file of this project.
SCRIPTS = sorted(name for name in os.listdir(os.path.join(REPO_ROOT, "cleanrl")) if name.endswith(".py"))
PROJECT_MODULES = {"cleanrl", "benchmark", "cloud", "tests"} | {name[: -len(".py")] for name in SCRIPTS}


def project_imports(source: str) -> list[str]:
    """The modules of this project that a script imports, anywhere in it (a function's deferred import too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
            found.extend(module for module in modules if module.split(".")[0] in PROJECT_MODULES)
    return found


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_imports_no_file_of_the_project(script):
    with open(os.path.join(REPO_ROOT, "cleanrl", script)) as f:
        assert project_imports(f.read()) == [], f"{script} would not run copied alone"


def test_an_import_of_the_project_is_caught():
    source = "import os\nimport torch.nn as nn\n\n\ndef f():\n    import wandb\n    from ppo_atari import Agent\n"
    assert project_imports(source) == ["ppo_atari"]
    assert project_imports("from cleanrl.dqn import QNetwork\nfrom . import x\nimport benchmark.events\n") == [
        "cleanrl.dqn",
        ".",
        "benchmark.events",
    ]
