"""Specification of cleanrl/c51_atari.py. Its replay memory, environment, videos, evaluation and checkpoint
blocks are dqn_atari.py's (tests/test_blocks.py holds the copies equal; tests/test_dqn_atari.py checks them
in depth): here, the distributional math, and one short run of each kind through the script's own loop."""

import glob
import math
import os
import re

import numpy as np
import pytest
import torch
from checkpoints import mappings_once_removed
from evaluation import assert_evaluation_printed, assert_saved_model_loads_identically, saved_model_path
from interruptions import CutOff, cut_off_at, flushing_writer
from references import assert_linear_epsilon_schedule
from run_outputs import assert_progress_lines_printed, mp4_frames
from running import (
    assert_atari_ranges_are_checked,
    assert_main_fails_with,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
)

import cleanrl.c51_atari as c51_atari
import cleanrl.dqn_atari as dqn_atari

# One torch thread: the test machine is shared, where two threads per process spin-wait each
# other out (forward passes measured 5-10x slower).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# Every tag the script promises to log.
C51_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "losses/loss",
    "losses/q_values",
]


# ---------------------------------------------------------------------------------------------
# The projection of the target distribution onto the atoms
# ---------------------------------------------------------------------------------------------
def reference_projection(next_probs, rewards, dones, atoms, gamma):
    """C51's projection as Algorithm 1 of Bellemare et al. (2017) writes it, one transition and one atom
    at a time in plain Python floats: atom j moves to Tz = r + gamma * z_j (r alone at a terminal step),
    clipped to [v_min, v_max]; at b = (Tz - v_min) / delta_z, its probability goes to the atoms l = floor(b)
    and u = ceil(b) in proportion to closeness, all of it to l when b is an atom (l == u)."""
    n, v_min, v_max = len(atoms), atoms[0], atoms[-1]
    delta_z = (v_max - v_min) / (n - 1)
    projected = []
    for probs, reward, done in zip(next_probs, rewards, dones):
        m = [0.0] * n
        for j in range(n):
            moved = min(max(reward + (1 - done) * gamma * atoms[j], v_min), v_max)
            b = min(max((moved - v_min) / delta_z, 0.0), n - 1)  # the edge's b can round past n - 1
            lower, upper = math.floor(b), math.ceil(b)
            if lower == upper:
                m[lower] += probs[j]
            else:
                m[lower] += probs[j] * (upper - b)
                m[upper] += probs[j] * (b - lower)
        projected.append(m)
    return projected


def random_probs(rng, batch: int, n_atoms: int) -> np.ndarray:
    """Distributions with mass on every atom, the edge atoms included."""
    return rng.dirichlet(np.ones(n_atoms), size=batch)


def projection_cases() -> dict[str, dict]:
    """Transitions (float64) for the projection: next_probs, rewards, dones, atoms, gamma."""
    rng = np.random.default_rng(0)
    default_atoms = np.linspace(-10.0, 10.0, 51)
    rewards = np.concatenate([rng.choice([-1.0, 0.0, 1.0], 40), rng.uniform(-3, 3, 24)])
    return {
        "random transitions, 51 atoms on [-10, 10]": dict(
            next_probs=random_probs(rng, 64, 51),
            rewards=rewards,
            dones=(rng.random(64) < 0.25).astype(np.float64),
            atoms=default_atoms,
            gamma=0.99,
        ),
        # rewards that push part of the distribution, or all of it, past v_max or v_min
        "rewards past the support's edges": dict(
            next_probs=random_probs(rng, 8, 51),
            rewards=np.array([9.9, -9.9, 12.0, -12.0, 25.0, -25.0, 3.0, -3.0]),
            dones=np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
            atoms=default_atoms,
            gamma=0.99,
        ),
        # all the mass collapses onto r, whatever the next state's distribution
        "terminal steps": dict(
            next_probs=random_probs(rng, 8, 51),
            rewards=np.array([1.0, -1.0, 0.0, 0.5, 9.9, 10.0, 15.0, -15.0]),
            dones=np.ones(8),
            atoms=default_atoms,
            gamma=0.99,
        ),
        # atoms 1 apart, integer rewards, gamma 1: every b lands exactly on an atom, the edge atoms included
        "b exactly on an atom": dict(
            next_probs=random_probs(rng, 8, 5),
            rewards=np.array([0.0, 1.0, -1.0, 2.0, 1.0, -2.0, 0.0, 1.0]),
            dones=np.array([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]),
            atoms=np.array([-2.0, -1.0, 0.0, 1.0, 2.0]),
            gamma=1.0,
        ),
    }


def assert_projection_matches_reference(project, case: dict):
    """project(next_probs, rewards, dones, atoms, gamma), on float64 tensors, against reference_projection."""
    got = project(*(torch.tensor(case[name]) for name in ("next_probs", "rewards", "dones", "atoms")), case["gamma"])
    expected = reference_projection(
        *(case[name].tolist() for name in ("next_probs", "rewards", "dones", "atoms")), case["gamma"]
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", list(projection_cases()))
def test_the_projection_matches_the_papers_algorithm(case):
    assert_projection_matches_reference(c51_atari.project_distribution, projection_cases()[case])


@pytest.mark.parametrize("case", list(projection_cases()))
def test_the_projection_keeps_all_the_mass(case):
    arrays = projection_cases()[case]
    inputs = (torch.tensor(arrays[name]) for name in ("next_probs", "rewards", "dones", "atoms"))
    projected = c51_atari.project_distribution(*inputs, arrays["gamma"])
    assert (projected >= 0).all()
    np.testing.assert_allclose(projected.sum(1).numpy(), 1.0, rtol=0, atol=1e-12)


def test_the_projection_by_hand_on_five_atoms():
    atoms = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0])
    p = torch.tensor([[0.1, 0.2, 0.3, 0.25, 0.15]])

    def project(reward: float, done: float, gamma: float = 1.0) -> list[float]:
        projected = c51_atari.project_distribution(p, torch.tensor([reward]), torch.tensor([done]), atoms, gamma)
        return projected[0].tolist()

    # r = 1: every atom moves one up, exactly onto the next; the top two pile up on the top edge
    assert project(1.0, 0.0) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    # r = -0.5: every atom lands halfway between two, the bottom one below the edge, clipped onto it
    assert project(-0.5, 0.0) == pytest.approx([0.1 + 0.1, 0.1 + 0.15, 0.15 + 0.125, 0.125 + 0.075, 0.075])
    # terminal: all the mass on r, split between the atoms around it when r falls between two
    assert project(0.25, 1.0) == pytest.approx([0.0, 0.0, 0.75, 0.25, 0.0])
    assert project(-7.0, 1.0) == pytest.approx([1.0, 0.0, 0.0, 0.0, 0.0])
    # gamma 0.5, r = 0: the distribution shrinks to [-1, 1]
    assert project(0.0, 0.0, 0.5) == pytest.approx([0.0, 0.1 + 0.1, 0.1 + 0.3 + 0.125, 0.125 + 0.15, 0.0])


def projection_off_by_one_atom(next_probs, rewards, dones, atoms, gamma):
    """A deliberately wrong projection: the right masses, each one atom too high (the top one wrapped round)."""
    return torch.roll(c51_atari.project_distribution(next_probs, rewards, dones, atoms, gamma), 1, dims=1)


def projection_by_floor_and_ceil(next_probs, rewards, dones, atoms, gamma):
    """A deliberately wrong projection: floor(b) and ceil(b) as the two atoms with no special case, so a b
    exactly on an atom gives both of them a share of zero and its mass is lost."""
    n_atoms = atoms.numel()
    delta_z = (atoms[-1] - atoms[0]) / (n_atoms - 1)
    moved = (rewards[:, None] + gamma * (1.0 - dones[:, None]) * atoms).clamp(atoms[0], atoms[-1])
    b = (moved - atoms[0]) / delta_z
    lower, upper = b.floor(), b.ceil()
    target = torch.zeros_like(next_probs)
    target.scatter_add_(1, lower.long(), next_probs * (upper - b))
    return target.scatter_add_(1, upper.long(), next_probs * (b - lower))


@pytest.mark.parametrize("case", list(projection_cases()))
def test_the_reference_check_catches_a_projection_off_by_one_atom(case):
    with pytest.raises(AssertionError):
        assert_projection_matches_reference(projection_off_by_one_atom, projection_cases()[case])


def test_the_reference_check_catches_mass_lost_where_b_lands_exactly_on_an_atom():
    with pytest.raises(AssertionError):
        assert_projection_matches_reference(projection_by_floor_and_ceil, projection_cases()["b exactly on an atom"])


# ---------------------------------------------------------------------------------------------
# The network and acting
# ---------------------------------------------------------------------------------------------
def network_with_logits(logits: list[list[float]], atoms: int) -> c51_atari.QNetwork:
    """A QNetwork on the support [-10, 10] whose outputs are these logits (num_actions x n_atoms) for any input."""
    q_network = c51_atari.QNetwork(len(logits), atoms)
    with torch.no_grad():
        q_network.head.weight.zero_()
        q_network.head.bias.copy_(torch.tensor(logits).flatten())
    return q_network


def test_the_network_gives_a_distribution_over_the_atoms_for_each_action():
    q_network = c51_atari.QNetwork(4)
    np.testing.assert_allclose(q_network.atoms.numpy(), np.linspace(-10, 10, 51), rtol=0, atol=1e-6)
    logits = q_network(torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8))
    assert logits.shape == (3, 4, 51) and logits.dtype == torch.float32
    assert "atoms" in q_network.state_dict(), "the support is saved with the weights"


def test_the_greedy_action_has_the_highest_expected_return_not_the_likeliest_atom():
    # Atoms -10, 0, 10. Action 0's likeliest atom is the highest (0.55 on +10), its mean 1; action 1's mean is
    # the highest, 3 (0.05, 0.6, 0.35); action 2 holds the likeliest atom of all (0.7 on -10), its mean -4.
    probs = [[0.45, 1e-9, 0.55], [0.05, 0.6, 0.35], [0.7, 1e-9, 0.3]]
    q_network = network_with_logits(np.log(probs).tolist(), 3)
    obs = np.zeros((16, 4, 84, 84), np.uint8)
    with torch.no_grad():
        q_values = c51_atari.q_values(q_network(torch.from_numpy(obs[:1])), q_network.atoms)
    np.testing.assert_allclose(q_values[0].numpy(), [1.0, 3.0, -4.0], atol=1e-6)
    rng = np.random.default_rng(0)
    assert (c51_atari.epsilon_greedy(q_network, obs, 0.0, rng, "cpu") == 1).all()
    assert set(c51_atari.epsilon_greedy(q_network, obs, 1.0, rng, "cpu").tolist()) == {0, 1, 2}


def test_the_bf16_acting_copy_gives_autocasts_numbers_bit_for_bit():
    q_network = c51_atari.QNetwork(4).to(memory_format=torch.channels_last)
    acting = c51_atari.acting_copy(q_network, torch.bfloat16)
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    with torch.inference_mode():
        with torch.autocast("cpu", torch.bfloat16):
            autocast_logits = q_network(obs)
        assert torch.equal(acting(obs), autocast_logits)
        assert not torch.equal(q_network(obs), autocast_logits), "fp32 differs: the check can fail"


def test_epsilon_decays_linearly_then_stays_at_its_end():
    assert_linear_epsilon_schedule(c51_atari.linear_schedule)


def test_the_replay_memory_takes_dqn_atari_s_bytes_per_step():
    # The same class (tests/test_blocks.py): 7,056 bytes of frame and 8 of action, reward and flags per step,
    # so 7.064 GB at the default 1M steps; built at 10k steps here, its arrays scale with the steps.
    sizes = {}
    for module in (c51_atari, dqn_atari):
        rb = module.FrameReplayBuffer(10_000, 2)
        sizes[module.__name__] = sum(getattr(rb, name).nbytes for name in rb.SLOT_ARRAYS)
    assert sizes["cleanrl.c51_atari"] == sizes["cleanrl.dqn_atari"] == 10_000 * (84 * 84 + 8)


# ---------------------------------------------------------------------------------------------
# The update, in a run
# ---------------------------------------------------------------------------------------------
def test_the_target_is_the_target_networks_distribution_of_its_greedy_action(tmp_path, monkeypatch):
    # 40 steps past learning_starts, an update every 4: 10 updates, the target network never updated, the
    # Q-network learning fast enough to differ from it from the first update on.
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    networks, batches, checked = [], [], []

    class RecordedQNetwork(c51_atari.QNetwork):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            networks.append(self)

    class RecordedMemory(c51_atari.FrameReplayBuffer):
        def sample(self, *args, **kwargs):
            batches.append(super().sample(*args, **kwargs))
            return batches[-1]

    project = c51_atari.project_distribution

    def checked_projection(next_probs, rewards, dones, atoms, gamma):
        q_network, target_network = networks[0], networks[1]
        with torch.no_grad():
            target_probs = torch.softmax(target_network(batches[-1]["next_obs"]), dim=2)
        greedy = c51_atari.q_values(target_network(batches[-1]["next_obs"]), atoms).argmax(1)
        torch.testing.assert_close(next_probs, target_probs[torch.arange(len(greedy)), greedy], rtol=0, atol=0)
        torch.testing.assert_close(rewards, batches[-1]["rewards"], rtol=0, atol=0)
        torch.testing.assert_close(dones, batches[-1]["dones"], rtol=0, atol=0)
        assert gamma == 0.99 and torch.equal(atoms, torch.linspace(-10, 10, 51))
        if next(q_network.parameters()).grad is not None:  # after the first update the two differ
            with torch.no_grad():
                assert not torch.allclose(q_network(batches[-1]["next_obs"]), target_network(batches[-1]["next_obs"]))
            checked.append(len(batches))
        return project(next_probs, rewards, dones, atoms, gamma)

    monkeypatch.setattr(c51_atari, "QNetwork", RecordedQNetwork)
    monkeypatch.setattr(c51_atari, "FrameReplayBuffer", RecordedMemory)
    monkeypatch.setattr(c51_atari, "project_distribution", checked_projection)
    args = dict(total_timesteps=440, learning_starts=400, buffer_size=2000, end_e=0.5, learning_rate=0.01)
    c51_atari.main(c51_atari.Args(**args, target_network_frequency=10**6, cuda=False))
    assert len(networks) == 2 and len(batches) == 10 and len(checked) == 9, (len(networks), len(batches), checked)


# ---------------------------------------------------------------------------------------------
# A short run, in bf16: logs, videos, progress, saved model and its evaluation, the checkpoint
# ---------------------------------------------------------------------------------------------
# 1 env, 600 steps, updates from step 400 on, every 4 steps: 50 updates. Epsilon ends at 0.5: an untrained
# greedy policy may never press FIRE, and the games must go on; the time limit ends env 0's games 0 and 1.
SHORT_RUN = ["--total-timesteps", "600", "--learning-starts", "400", "--buffer-size", "2000", "--end-e", "0.5"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("short_run")
    extras = ["--max-episode-steps", "250", "--capture-video", "--progress-interval", "0", "--checkpoint-every", "600"]
    bf16 = ["--mixed-precision", "bf16", "--save-model", "--eval-episodes", "1"]
    result = run_script("c51_atari.py", *SHORT_RUN, *extras, *bf16, cwd=cwd, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    return cwd, result


def test_a_short_bf16_run_executes_its_updates_and_logs_every_tag(short_run):
    cwd, result = short_run
    assert "finished 600 steps and 50 updates" in result.stdout
    scalars = read_scalars(run_dirs(cwd)[0])
    assert set(C51_TAGS) <= set(scalars)
    # a loss point per 100 steps that held updates (the first update is at step 404)
    assert [step for step, _ in scalars["losses/loss"]] == [500, 600]
    # the cross-entropy against a distribution over 51 atoms: positive, at most about log(51) early on
    assert all(0 < value < 2 * math.log(51) for _, value in scalars["losses/loss"])
    assert all(-10 <= value <= 10 for _, value in scalars["losses/q_values"])
    # whole unclipped games (all five lives) of random play
    assert all(length > 50 for _, length in scalars["charts/episodic_length"])
    assert all(r >= 0 and r == int(r) for _, r in scalars["charts/episodic_return"])


def test_the_short_run_prints_progress_lines_and_records_whole_games_of_env_0(short_run):
    cwd, result = short_run
    assert_progress_lines_printed(result.stderr, [f"{step}/600" for step in range(100, 601, 100)])
    # Games 0 and 1 of env 0 (the only env), each video its game's first screen and one screen per step;
    # the evaluation's game in a folder of its own.
    (run_dir,) = run_dirs(cwd)
    lengths = [int(length) for _, length in read_scalars(run_dir)["charts/episodic_length"]]
    videos = os.path.join(str(cwd), "videos", os.path.basename(run_dir))
    assert sorted(os.listdir(videos))[:2] == ["game-0.mp4", "game-1.mp4"]
    for game in (0, 1):
        assert mp4_frames(os.path.join(videos, f"game-{game}.mp4")).shape == (lengths[game] + 1, 210, 160, 3)
    assert os.listdir(videos + "-eval") == ["game-0.mp4"]


def test_the_checkpoint_holds_the_networks_adam_and_the_replay_memory(short_run):
    cwd, _ = short_run
    (path,) = glob.glob(os.path.join(str(cwd), "runs", "*", "checkpoints", "step-000000600.pt"))
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["num_updates"] == 50 and checkpoint["global_step"] == 600
    assert all(int(state["step"]) == 50 for state in checkpoint["optimizer"]["state"].values())
    assert torch.equal(checkpoint["model"]["atoms"], torch.linspace(-10, 10, 51))
    assert checkpoint["target_network"].keys() == checkpoint["model"].keys()
    rb = c51_atari.FrameReplayBuffer(2000, 1)
    rb.load_state_dict(checkpoint["replay_memory"])
    assert rb.valid.sum() == 600, "every step of the run is stored"


def test_the_saved_model_is_evaluated_and_plays_again_from_its_file(short_run, tmp_path):
    cwd, result = short_run
    assert result.stdout.count("eval_episode=") == 1
    evaluation = ("--eval-checkpoint", saved_model_path("c51_atari.py", cwd), "--eval-episodes", "1")
    again = run_script("c51_atari.py", *evaluation, "--max-episode-steps", "250", cwd=tmp_path, env=ONE_THREAD)
    assert_evaluation_printed(again, 1)
    assert "warning" not in again.stderr


def test_loaded_model_equals_saved_model(tmp_path):
    assert_saved_model_loads_identically(c51_atari, tmp_path)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_is_a_one_line_error(tmp_path):
    result = run_script("c51_atari.py", "--v-min", "10", "--v-max", "-10", cwd=tmp_path, env=ONE_THREAD)
    assert_user_error(result, "--v-min must be below --v-max, got 10.0 and -10.0")


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(c51_atari.check_args, c51_atari.Args)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(n_atoms=1), "--n-atoms must be at least 2"),
        (dict(v_min=5.0, v_max=5.0), "--v-min must be below --v-max, got 5.0 and 5.0"),
        (dict(env_id="NoSuchGameNoFrameskip-v4"), "unknown Atari env id"),
        (dict(num_envs=3, buffer_size=1000), "not divisible by --num-envs 3"),
        (dict(total_timesteps=50_000), "would never update"),
        (dict(target_network_frequency=0), "--target-network-frequency must be positive"),
        (dict(gamma=1.5), "--gamma must lie in [0, 1], got 1.5"),
        (dict(buffer_size=14, num_envs=2), "fewer than 8 steps per env"),
    ],
    ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None,
)
def test_bad_sizes_and_rates_are_rejected_with_a_message_naming_the_flag(overrides, message):
    assert_main_fails_with(c51_atari.check_args, c51_atari.Args(**overrides), message)


# ---------------------------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------------------------
def test_a_resumed_run_goes_on_with_the_checkpoints_memory_and_target_network(tmp_path, monkeypatch, capsys):
    # 500 steps, updates from step 100 every 4, target updates at 250 and 500, a checkpoint every 300. The
    # first attempt is cut off at step 400, after its checkpoint at 300 and with the 100 steps past it on disk.
    # The resumed run checkpoints every 100 steps. At 400, before its next target update, the target network
    # is still the one of the checkpoint at 300 (a fresh one would be the initial weights, and bootstrap from
    # them until 500); the memory holds the checkpoint's steps; Adam has counted on from its 50 updates.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(c51_atari, "SummaryWriter", flushing_writer(c51_atari))
    torch.set_num_threads(1)
    args = dict(total_timesteps=500, learning_starts=100, buffer_size=2000, end_e=0.5, target_network_frequency=250)
    uncut = cut_off_at(c51_atari, monkeypatch, 400)
    with pytest.raises(CutOff):
        c51_atari.main(c51_atari.Args(**args, checkpoint_every=300, cuda=False))
    uncut()
    (run_dir,) = run_dirs(tmp_path)
    resumed_from = os.path.join(run_dir, "checkpoints", "step-000000300.pt")
    saved = torch.load(resumed_from, weights_only=True)
    assert saved["num_updates"] == 50
    capsys.readouterr()

    written, save_checkpoint = {}, c51_atari.save_checkpoint

    def save_and_read_back(folder, name, state, *rest, **kwargs):  # each is removed by the next one
        save_checkpoint(folder, name, state, *rest, **kwargs)
        written[state["global_step"]] = torch.load(os.path.join(folder, name), weights_only=True)

    monkeypatch.setattr(c51_atari, "save_checkpoint", save_and_read_back)
    mapped, watcher = mappings_once_removed(resumed_from)
    c51_atari.main(c51_atari.Args(**args, checkpoint_every=100, resume="auto", cuda=False))
    output = capsys.readouterr().out
    watcher.join(timeout=10)
    assert not watcher.is_alive() and mapped == [], "the removed checkpoint's disk space is held by the run"
    assert re.search(r"resuming \S+ at step 300 from runs/\S+/checkpoints/step-000000300\.pt", output), output
    assert "finished 500 steps and 100 updates" in output
    assert run_dirs(tmp_path) == [run_dir], "the resumed run goes on in its own directory"
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["charts/SPS"]] == list(range(100, 501, 100)), "every step logged once"
    assert [step for step, _ in scalars["losses/loss"]] == list(range(200, 501, 100))
    game_steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert game_steps == sorted(set(game_steps)), "every game once, none from the cut-off attempt past 300"

    at_400 = written[400]
    for name, value in saved["target_network"].items():
        assert torch.equal(at_400["target_network"][name], value), name
    assert not torch.equal(at_400["model"]["head.weight"], saved["model"]["head.weight"]), "the Q-network learned on"
    assert all(int(state["step"]) == 75 for state in at_400["optimizer"]["state"].values()), "Adam counted on"
    kept = int(saved["replay_memory"]["pos"][0]) + 1  # the slots up to the checkpoint's last observation
    for name in ("frames", "actions", "rewards", "dones"):
        np.testing.assert_array_equal(
            at_400["replay_memory"][name][0][:kept].numpy(), saved["replay_memory"][name][0][:kept].numpy()
        )
    assert not torch.equal(written[500]["target_network"]["head.weight"], saved["target_network"]["head.weight"])
