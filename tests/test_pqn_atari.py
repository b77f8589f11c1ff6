"""Specification of cleanrl/pqn_atari.py."""

import dataclasses
import os

import numpy as np
import pytest
import torch
import tyro
from checkpoints import (
    assert_run_resumes_where_its_checkpoint_left_it,
    assert_the_newest_checkpoints_are_kept_by_their_number,
    assert_the_random_stream_goes_on_after_a_resume,
)
from evaluation import (
    assert_evaluation_printed,
    assert_evaluation_warns_when_emulator_settings_differ,
    assert_saved_model_loads_identically,
    train_and_save_a_model,
)
from fake_envs import recording_make_envs
from references import assert_linear_epsilon_schedule
from run_outputs import (
    assert_game_0_video_logged_as_wandb_media,
    assert_progress_follows_the_convention,
    assert_progress_line_per_iteration,
    assert_short_atari_run_logged,
    assert_videos_show_whole_games_of_env_0,
    assert_warns_when_bf16_is_slow,
)
from running import (
    assert_atari_ranges_are_checked,
    assert_main_fails_with,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
    run_tracked,
)

import cleanrl.pqn_atari as pqn_atari

# One torch thread in the runs of these tests: the test machine is shared (CI runs 2 test processes on 2
# cores), where two threads per process spin-wait each other out (an evaluation measured 20x slower).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    """The runs this process starts and its own main() calls use one thread (conftest restores torch's)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


# A short run: 2 envs x 128 steps, 4 iterations of 2 updates. Random play finishes a few Breakout games in
# it, and epsilon stays high enough (it falls to 0.5) for an untrained network's games to end.
FEW_UPDATES = ["--num-minibatches", "2", "--update-epochs", "1"]
SHORT_RUN = ["--num-envs", "2", "--num-steps", "128", *FEW_UPDATES, "--total-timesteps", "1024", "--end-e", "0.5"]
# One iteration of the same.
ONE_ITERATION = ["--num-envs", "2", "--num-steps", "128", *FEW_UPDATES, "--total-timesteps", "256"]
# Every tag pqn_atari.py promises to log.
PQN_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/learning_rate",
    "charts/epsilon",
    "charts/SPS",
    "losses/td_loss",
    "losses/q_values",
]


# ---------------------------------------------------------------------------------------------
# Q(lambda)-returns
# ---------------------------------------------------------------------------------------------
def reference_q_lambda_returns(rewards, values, dones, next_value, gamma, q_lambda):
    """The lambda-return of Watkins-style Q(lambda) written out, one env and one step at a time, plain
    Python floats: G_t = (1 - lambda) * sum_{n=1}^{N-1} lambda^(n-1) G_t^(n) + lambda^(N-1) G_t^(N), where
    N is the number of steps left in the rollout and the n-step return G_t^(n) = r_t + ... +
    gamma^(n-1) r_{t+n-1} + gamma^n max_a Q(s_{t+n}, a); an n-step return that reaches the end of the
    learning episode (a done at step t+k, k < n) stops there, with no bootstrap. max_a Q(s_k, a) is
    values[k], or next_value after the rollout's last step."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    returns = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):

        def max_q(k):
            return next_value[env] if k == num_steps else values[k][env]

        def n_step_return(t, n):
            total = 0.0
            for k in range(t, t + n):
                total += gamma ** (k - t) * rewards[k][env]
                if dones[k][env]:
                    return total
            return total + gamma**n * max_q(t + n)

        for t in range(num_steps):
            left = num_steps - t
            weighted = sum((1 - q_lambda) * q_lambda ** (n - 1) * n_step_return(t, n) for n in range(1, left))
            returns[t][env] = weighted + q_lambda ** (left - 1) * n_step_return(t, left)
    return returns


def rollout_data():
    """A rollout of 16 steps of 3 envs: random float64 rewards and max-Q values, dones inside it (env 0's
    last episode ends on the rollout's last step, env 1's two in a row, env 2's on its first step), and a
    bootstrap value for the observations after it."""
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(2, 16, 3))
    dones = np.zeros((16, 3))
    dones[[3, 9, 15], 0] = dones[[5, 6], 1] = dones[[0, 11], 2] = 1.0
    next_value = rng.normal(size=3)
    return rewards, values, dones, next_value


def assert_matches_the_reference(q_lambda_returns):
    """q_lambda_returns(rewards, values, dones, next_value, gamma, lambda) on torch tensors against the
    written-out reference, for lambda 0.65 (CleanRL's), 0 and 1."""
    rewards, values, dones, next_value = rollout_data()
    for q_lambda in (0.65, 0.0, 1.0):
        inputs = (torch.tensor(x) for x in (rewards, values, dones, next_value))
        returns = q_lambda_returns(*inputs, 0.99, q_lambda)
        expected = reference_q_lambda_returns(
            rewards.tolist(), values.tolist(), dones.tolist(), next_value.tolist(), 0.99, q_lambda
        )
        np.testing.assert_allclose(returns.numpy(), expected, rtol=1e-10, atol=1e-10, err_msg=f"{q_lambda=}")


def test_q_lambda_returns_are_the_lambda_weighted_n_step_returns():
    assert_matches_the_reference(pqn_atari.q_lambda_returns)


def test_q_lambda_0_is_the_one_step_q_learning_target_and_1_the_discounted_return():
    rewards, values, dones, next_value = (torch.tensor(x) for x in rollout_data())
    following = torch.cat([values[1:], next_value[None]])  # max_a Q(s_{t+1}, a)
    one_step = pqn_atari.q_lambda_returns(rewards, values, dones, next_value, 0.9, 0.0)
    torch.testing.assert_close(one_step, rewards + 0.9 * (1 - dones) * following, rtol=1e-12, atol=1e-12)
    monte_carlo = pqn_atari.q_lambda_returns(rewards, values, dones, next_value, 0.9, 1.0)
    expected, running = torch.empty_like(rewards), next_value
    for t in reversed(range(len(rewards))):
        running = rewards[t] + 0.9 * (1 - dones[t]) * running
        expected[t] = running
    torch.testing.assert_close(monte_carlo, expected, rtol=1e-12, atol=1e-12)


def wrong_returns_without_reset_at_dones(rewards, values, dones, next_value, gamma, q_lambda):
    """A deliberately wrong version: it bootstraps across the end of a learning episode."""
    return pqn_atari.q_lambda_returns(rewards, values, torch.zeros_like(dones), next_value, gamma, q_lambda)


def wrong_returns_bootstrapping_the_last_step_from_its_own_value(rewards, values, dones, next_value, gamma, q_lambda):
    """A deliberately wrong version: the last step bootstraps from max_a Q of its own observation."""
    return pqn_atari.q_lambda_returns(rewards, values, dones, values[-1], gamma, q_lambda)


def wrong_returns_with_lambda_and_1_minus_lambda_swapped(rewards, values, dones, next_value, gamma, q_lambda):
    """A deliberately wrong version: the weights of the lambda-return and of max_a Q exchanged."""
    return pqn_atari.q_lambda_returns(rewards, values, dones, next_value, gamma, 1.0 - q_lambda)


@pytest.mark.parametrize(
    "wrong",
    [
        wrong_returns_without_reset_at_dones,
        wrong_returns_bootstrapping_the_last_step_from_its_own_value,
        wrong_returns_with_lambda_and_1_minus_lambda_swapped,
    ],
)
def test_the_reference_catches_a_wrong_q_lambda_return(wrong):
    with pytest.raises(AssertionError):
        assert_matches_the_reference(wrong)


# ---------------------------------------------------------------------------------------------
# Exploration and network
# ---------------------------------------------------------------------------------------------
def test_epsilon_decays_linearly_then_stays_at_its_floor():
    assert_linear_epsilon_schedule(pqn_atari.linear_schedule)


def test_epsilon_greedy_is_greedy_at_0_uniform_at_1_and_draws_the_same_numbers_either_way():
    q_values = torch.tensor([[0.0, 2.0, 1.0, -1.0]]).repeat(4000, 1)
    torch.manual_seed(0)
    assert (pqn_atari.epsilon_greedy(q_values, 0.0) == 1).all()
    after_greedy = torch.get_rng_state()
    torch.manual_seed(0)
    counts = torch.bincount(pqn_atari.epsilon_greedy(q_values, 1.0), minlength=4)
    assert torch.equal(torch.get_rng_state(), after_greedy), "a resumed run's stream goes on whatever the coins"
    assert counts.min() > 850 and counts.max() < 1150, counts  # 1000 each, uniform
    torch.manual_seed(0)
    greedy_share = (pqn_atari.epsilon_greedy(q_values, 0.2) == 1).float().mean().item()
    assert abs(greedy_share - (0.8 + 0.2 / 4)) < 0.03, greedy_share


def test_layer_norm_on_channels_last_maps_is_nn_layer_norm_of_the_whole_map():
    torch.manual_seed(0)
    ours, reference = pqn_atari.LayerNorm2d([32, 20, 20]), torch.nn.LayerNorm([32, 20, 20])
    with torch.no_grad():
        ours.weight.normal_(), ours.bias.normal_()
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(5, 32, 20, 20)
    for layout in (torch.contiguous_format, torch.channels_last):
        inputs = [x.clone().contiguous(memory_format=layout).requires_grad_() for _ in range(2)]
        out, expected = ours(inputs[0]), reference(inputs[1])
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        grad = torch.randn_like(out)
        out.backward(grad), expected.backward(grad)
        torch.testing.assert_close(inputs[0].grad, inputs[1].grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad, rtol=1e-4, atol=1e-4)
    assert ours(x.contiguous(memory_format=torch.channels_last)).is_contiguous(memory_format=torch.channels_last)


def test_the_bf16_acting_copy_gives_the_q_values_of_autocast_bit_for_bit():
    # The rollout acts and bootstraps with the copy; the update computes under autocast on the fp32 weights.
    torch.manual_seed(0)
    q_network = pqn_atari.QNetwork(4).to(memory_format=torch.channels_last)
    acting = pqn_atari.acting_copy(q_network, torch.bfloat16)
    with torch.no_grad():  # weights an update has moved: LayerNorm weights off 1 and biases off 0 too
        for p in q_network.parameters():
            p.add_(0.05 * torch.randn_like(p))
    acting.load_state_dict(q_network.state_dict())
    assert {p.dtype for name, p in acting.named_parameters() if "network.0." in name} == {torch.bfloat16}
    norms = [m for m in acting.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 4 and all(m.weight.dtype == torch.float32 for m in norms), "LayerNorms stay fp32"
    obs = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    with torch.inference_mode():
        with torch.autocast("cpu", torch.bfloat16):
            expected = q_network(obs)
        q_values = acting(obs)
    assert q_values.dtype == expected.dtype == torch.float32, "the head runs in fp32"
    torch.testing.assert_close(q_values, expected, rtol=0, atol=0)


def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, capsys):
    assert_warns_when_bf16_is_slow(pqn_atari, monkeypatch, capsys)


# ---------------------------------------------------------------------------------------------
# Environment and episode statistics
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "Breakout-v5"])
def test_env_id_styles_name_the_same_game(env_id):
    assert pqn_atari.atari_game(env_id) == "breakout"


def test_episode_statistics_count_every_step_and_reset_at_game_over():
    stats = pqn_atari.EpisodeStatistics(2)
    assert stats.step(np.array([1.0, 4.0]), np.array([False, False])) == []
    assert stats.step(np.array([2.0, 0.0]), np.array([True, False])) == [(0, 3.0, 2)]
    assert stats.step(np.array([5.0, 1.0]), np.array([True, True])) == [(0, 5.0, 1), (1, 5.0, 3)]


@pytest.mark.parametrize("mixed_precision", ["none", "bf16"])
def test_rollout_targets_are_built_from_what_the_envs_did_and_the_latest_weights(
    tmp_path, monkeypatch, mixed_precision
):
    """Two iterations of 2 envs x 64 steps, a 60-step time limit: random play loses lives, ends games and
    hits the limit. At each iteration the returns are computed from: `dones` at every life loss, game over
    and time limit; rewards clipped to their sign, plus gamma * max_a Q(the real last observation) where
    the time limit stopped a game (truncated, not terminated); max_a Q of every observation the rollout
    saw and of the one after it, by the Q-network as the last update left it (under bf16: its autocast
    forward, which the rollout's bf16 copy must give bit for bit)."""
    monkeypatch.chdir(tmp_path)
    made = recording_make_envs(pqn_atari, monkeypatch, observations=True)
    networks, real_q_network = [], pqn_atari.QNetwork
    monkeypatch.setattr(pqn_atari, "QNetwork", lambda *a: networks.append(real_q_network(*a)) or networks[-1])
    args = pqn_atari.Args(
        num_envs=2, num_steps=64, total_timesteps=256, max_episode_steps=60, end_e=0.5, update_epochs=1
    )
    args = dataclasses.replace(args, num_minibatches=2, mixed_precision=mixed_precision, cuda=False)
    autocast = torch.autocast("cpu", torch.bfloat16, enabled=mixed_precision == "bf16")
    checked, real_returns = [], pqn_atari.q_lambda_returns

    def max_q(obs: np.ndarray) -> torch.Tensor:
        with torch.inference_mode(), autocast:
            return networks[0](torch.from_numpy(obs)).max(dim=1).values

    def q_lambda_returns(rewards, values, dones, next_value, gamma, q_lambda):
        envs, first = made[0], checked.count("iteration") * args.num_steps  # this iteration's first step
        lives = envs.steps[first - 1][3]["lives"] if first else np.full(args.num_envs, 5)
        for t in range(args.num_steps):
            reward, terminated, truncated, info = envs.steps[first + t]
            life_lost = (info["lives"] < lives) & ~(terminated | truncated)
            lives = info["lives"]
            expected_done = (terminated | truncated | life_lost).astype(np.float32)
            np.testing.assert_array_equal(dones[t].numpy(), expected_done, err_msg=f"step {first + t}")
            expected_reward = torch.from_numpy(np.sign(reward).astype(np.float32))
            if truncated.any():  # a time limit, not a death: plus gamma * max_a Q(the real last observation)
                cut = torch.from_numpy(truncated & ~terminated)
                expected_reward += (gamma * max_q(info["final_obs"]) * cut).float()
                checked.append("truncation")
            torch.testing.assert_close(rewards[t], expected_reward, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(values[t], max_q(envs.observations[first + t]), rtol=0, atol=0)
            if life_lost.any():
                checked.append("life loss")
        torch.testing.assert_close(next_value, max_q(envs.observations[first + args.num_steps]), rtol=0, atol=0)
        checked.append("iteration")
        return real_returns(rewards, values, dones, next_value, gamma, q_lambda)

    monkeypatch.setattr(pqn_atari, "q_lambda_returns", q_lambda_returns)
    pqn_atari.main(args)
    assert checked.count("iteration") == 2 and "truncation" in checked and "life loss" in checked, checked
    (run_dir,) = run_dirs(tmp_path)
    assert all(np.isfinite(value) for _, value in read_scalars(run_dir)["losses/td_loss"])


# ---------------------------------------------------------------------------------------------
# A run: what it logs, records, uploads and prints
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run for the tests of what a run logs, records, uploads and prints: videos on,
    tracked (wandb offline), a progress line every iteration."""
    cwd = tmp_path_factory.mktemp("short_run")
    video_run = [*SHORT_RUN, "--capture-video", "--progress-interval", "0"]
    return cwd, run_tracked("pqn_atari.py", *video_run, cwd=cwd, env=ONE_THREAD)


def test_short_training_run_logs_every_tag_for_every_iteration(short_run):
    cwd, result = short_run
    assert "finished 4 iterations, 1024 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    scalars = assert_short_atari_run_logged(run_dir, batch_size=256, tags=PQN_TAGS, loss_tag="losses/td_loss")
    # epsilon at each iteration's last step, falling from 1 to 0.5 over a tenth of the 1024 steps
    epsilons = [value for _, value in scalars["charts/epsilon"]]
    np.testing.assert_allclose(epsilons, [0.5] * 4)


def test_wandb_offline_run_is_created_with_the_videos(short_run):
    cwd, _ = short_run
    assert_game_0_video_logged_as_wandb_media(cwd)


def test_capture_video_writes_rgb_videos_of_whole_games_of_env_0(short_run):
    cwd, _ = short_run
    # A video holds its game's first screen and one screen per step.
    assert_videos_show_whole_games_of_env_0(cwd, num_envs=2, extra_screens=1)


def test_off_a_terminal_progress_interval_0_prints_a_plain_progress_line_per_iteration(short_run):
    cwd, result = short_run
    assert_progress_line_per_iteration(result.stderr, read_scalars(run_dirs(cwd)[0]), batch_size=256, iterations=4)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(pqn_atari.Progress, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Saved models and evaluation
# ---------------------------------------------------------------------------------------------
def test_save_then_evaluate_round_trip(tmp_path):
    # An untrained network's greedy games are long (it seldom serves the ball): the games explore more.
    evaluation = ["--eval-episodes", "2", "--eval-epsilon", "0.5"]
    result, model_path = train_and_save_a_model(
        "pqn_atari.py", *ONE_ITERATION, "--mixed-precision", "bf16", *evaluation, cwd=tmp_path
    )
    assert result.stdout.count("eval_episode=") == 2
    result = run_script("pqn_atari.py", "--eval-checkpoint", model_path, *evaluation, cwd=tmp_path)
    assert_evaluation_printed(result, 2)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(pqn_atari, tmp_path)


def test_loaded_model_equals_saved_model(tmp_path):
    assert_saved_model_loads_identically(pqn_atari, tmp_path)


def test_evaluation_plays_the_requested_number_of_whole_games(monkeypatch):
    made = recording_make_envs(pqn_atari, monkeypatch)
    q_network = pqn_atari.QNetwork(4)
    args = pqn_atari.Args(eval_epsilon=0.5)  # an untrained greedy network may never serve the ball
    returns = pqn_atari.evaluate(q_network, "BreakoutNoFrameskip-v4", 2, torch.device("cpu"), args, seed=1)
    assert len(returns) == 2 and all(r >= 0 for r in returns)
    # Each of the 2 envs played one game to its end: all 5 lives lost, no time limit, and the
    # returns are those games' whole scores.
    (envs,) = made
    lives = np.full(2, 5)
    for env in range(2):
        drops, score = 0, 0.0
        for reward, terminated, truncated, info in envs.steps:
            assert not truncated[env]
            score += reward[env]
            if terminated[env]:
                break
            drops += info["lives"][env] < lives[env]
            lives[env] = info["lives"][env]
        assert terminated[env] and drops == 4, (env, drops)
        assert score in returns


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown Atari env id"),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
        (["--q-lambda", "1.5"], "--q-lambda must lie in [0, 1], got 1.5"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script("pqn_atari.py", *args, cwd=tmp_path), message)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(total_timesteps=100), "smaller than one batch"),
        (dict(update_epochs=0), "must be positive"),
        (dict(eval_episodes=0), "must be positive"),
        (dict(eval_checkpoint="missing.cleanrl_model"), "does not exist"),
        (dict(checkpoint_every=-1), "--checkpoint-every must be 0 (never) or positive"),
        (dict(max_episode_steps=0), "--max-episode-steps must be positive"),
        (dict(max_grad_norm=-1.0), "--max-grad-norm must not be negative, got -1.0"),
        (dict(gamma=1.01), "--gamma must lie in [0, 1], got 1.01"),
        (dict(start_e=-0.1), "--start-e must lie in [0, 1], got -0.1"),
        (dict(end_e=2.0), "--end-e must lie in [0, 1], got 2.0"),
        (dict(exploration_fraction=1.5), "--exploration-fraction must lie in [0, 1], got 1.5"),
        (dict(eval_epsilon=-1.0), "--eval-epsilon must lie in [0, 1], got -1.0"),
    ],
)
def test_bad_values_stop_main_with_a_one_line_error(tmp_path, monkeypatch, overrides, message):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(pqn_atari.main, pqn_atari.Args(**overrides), message)
    assert not os.path.exists(tmp_path / "runs"), "nothing is written"


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(
        pqn_atari.check_args, lambda **o: pqn_atari.Args(batch_size=1024, minibatch_size=256, num_iterations=9765, **o)
    )


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    assert_main_fails_with(pqn_atari.main, pqn_atari.Args(eval_checkpoint="corrupt.cleanrl_model"), "not a readable")


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory(tmp_path, monkeypatch, capsys):
    args = dict(num_envs=2, num_steps=128, num_minibatches=2, update_epochs=1, end_e=0.5, eval_epsilon=0.5, cuda=False)
    assert_run_resumes_where_its_checkpoint_left_it(
        pqn_atari, tmp_path, monkeypatch, capsys, args, changed=("q_lambda", 0.5), loss_tag="losses/td_loss"
    )


def test_after_a_resume_the_random_stream_goes_on_from_the_checkpoint(tmp_path, monkeypatch):
    assert_the_random_stream_goes_on_after_a_resume(pqn_atari, tmp_path, monkeypatch)


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(pqn_atari, tmp_path, "iteration", 7)


# ---------------------------------------------------------------------------------------------
# CleanRL's command lines
# ---------------------------------------------------------------------------------------------
# The defaults of CleanRL's pqn_atari_envpool.py (its Args dataclass in the vwxyzjn/cleanrl repository),
# written down as facts. env_id differs on purpose: CleanRL's `Breakout-v5` is envpool's name, which this
# script also takes; its default is the NoFrameskip-v4 id of the other ale-py scripts (the same game).
CLEANRL_PQN_DEFAULTS = dict(
    seed=1,
    torch_deterministic=True,
    cuda=True,
    track=False,
    wandb_project_name="cleanRL",
    wandb_entity=None,
    capture_video=False,
    total_timesteps=10_000_000,
    learning_rate=2.5e-4,
    num_envs=8,
    num_steps=128,
    anneal_lr=True,
    gamma=0.99,
    num_minibatches=4,
    update_epochs=4,
    max_grad_norm=10.0,
    start_e=1.0,
    end_e=0.01,
    exploration_fraction=0.10,
    q_lambda=0.65,
)


def test_every_cleanrl_flag_exists_with_cleanrl_default():
    args = tyro.cli(pqn_atari.Args, args=[])
    for name, cleanrl_default in CLEANRL_PQN_DEFAULTS.items():
        assert getattr(args, name) == cleanrl_default, name
    assert args.env_id == "BreakoutNoFrameskip-v4"
    parsed = tyro.cli(pqn_atari.Args, args=["--env-id", "Breakout-v5", "--q-lambda", "0.5", "--no-anneal-lr"])
    assert (parsed.env_id, parsed.q_lambda, parsed.anneal_lr) == ("Breakout-v5", 0.5, False)
