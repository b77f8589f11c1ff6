"""Specification of cleanrl/ppo_atari_envpool_xla_jax_scan.py."""

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import cv2
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from checkpoints import (
    assert_run_resumes_where_its_checkpoint_left_it,
    assert_the_newest_checkpoints_are_kept_by_their_number,
)
from evaluation import (
    assert_corrupt_checkpoint_rejected,
    assert_evaluation_warns_when_emulator_settings_differ,
    assert_tracked_evaluation_logs_under_the_models_env,
    evaluate_saved_model,
    saved_model_path,
)
from fake_envs import assert_time_limit_cuts_only_episodes_that_go_on
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from references import assert_gae_matches_reference, reference_ppo_loss
from run_outputs import (
    assert_bf16_run_gives_finite_losses,
    assert_progress_follows_the_convention,
    assert_progress_line_per_iteration,
    assert_short_atari_run_logged,
    mp4_frames,
)
from running import (
    REPO_ROOT,
    assert_atari_ranges_are_checked,
    assert_ppo_ranges_are_checked,
    assert_user_error,
    free_port,
    read_scalars,
    run_dirs,
    run_script,
    subprocess_environment,
    wait_all,
)

import cleanrl.ppo_atari_envpool_xla_jax_scan as ppo_jax

SCRIPT = "ppo_atari_envpool_xla_jax_scan.py"
TWO_HOST_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
# The short run, on two host devices with one env each: 2 envs x 64 steps, 4 iterations. Random
# play finishes a few Breakout games in it.
SHORT_RUN = ["--num-envs", "2", "--num-steps", "64", "--total-timesteps", "512"]


def small_args(**overrides) -> ppo_jax.Args:
    """The Args main would compute for one device and a tiny batch."""
    args = ppo_jax.Args(**{**dict(num_envs=2, num_steps=8, num_minibatches=2, update_epochs=2), **overrides})
    args.num_devices, args.local_num_envs = 1, args.num_envs
    args.local_batch_size = args.batch_size = args.local_num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    return args


def random_batch(rng: np.random.Generator, size: int, played_fraction: float = 0.75) -> ppo_jax.Batch:
    return ppo_jax.Batch(
        obs=jnp.asarray(rng.integers(0, 256, (size, 4, 84, 84), dtype=np.uint8)),
        actions=jnp.asarray(rng.integers(0, 4, size, dtype=np.int32)),
        logprobs=jnp.asarray(np.log(rng.uniform(0.2, 0.3, size)), dtype=jnp.float32),
        values=jnp.asarray(rng.normal(size=size), dtype=jnp.float32),
        advantages=jnp.asarray(rng.normal(size=size), dtype=jnp.float32),
        returns=jnp.asarray(rng.normal(size=size), dtype=jnp.float32),
        played=jnp.asarray(rng.random(size) < played_fraction),
    )


def single_device(f, in_specs, out_specs):
    """f as main runs it, on a mesh of this process's one device."""
    mesh = Mesh(np.array(jax.devices()[:1]), ("devices",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False))


# --- The math ---------------------------------------------------------------------------------
def test_gae_scan_matches_the_textbook_definition():
    gae = jax.jit(ppo_jax.compute_gae, static_argnums=(4, 5))
    assert_gae_matches_reference(gae, jnp.asarray, np.float32, tolerance=1e-5)


def test_a_truncated_step_bootstraps_from_the_value_of_the_observation_stored_after_it():
    rewards = jnp.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = jnp.array([[0.5, 0.1], [0.2, 0.3], [0.4, 0.6]])
    truncations = jnp.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    next_value = jnp.array([0.7, 0.9])
    bootstrapped = ppo_jax.bootstrap_truncations(rewards, values, truncations, next_value, 0.5)
    np.testing.assert_allclose(bootstrapped, [[1.0 + 0.5 * 0.2, 0.0], [0.0, 1.0], [1.0, 1.0 + 0.5 * 0.9]], atol=1e-7)
    # With done = 1 at the truncated step, its advantage is r + gamma * V(last observation) - V(s).
    advantages, _ = ppo_jax.compute_gae(bootstrapped, values, truncations, next_value, 0.5, 0.95)
    np.testing.assert_allclose(advantages[0, 0], 1.0 + 0.5 * 0.2 - 0.5, atol=1e-6)


def test_episode_statistics_count_played_steps_and_reset_at_game_over_or_time_limit():
    stats = ppo_jax.EpisodeStatistics(jnp.zeros(2), jnp.zeros(2, jnp.int32))
    step = lambda stats, reward, game_over, played: ppo_jax.update_episode_statistics(
        stats, jnp.array(reward), jnp.array(game_over), jnp.array(played)
    )
    stats, _ = step(stats, [1.0, 4.0], [False, False], [True, True])
    stats, (over, returns, lengths) = step(stats, [2.0, 0.0], [True, False], [True, True])  # env 0 truncated
    assert over.tolist() == [True, False] and returns[0] == 3.0 and lengths[0] == 2
    stats, _ = step(stats, [0.0, 0.0], [False, False], [False, True])  # env 0's reset step is not played
    stats, (over, returns, lengths) = step(stats, [5.0, 1.0], [True, True], [True, True])
    assert returns.tolist() == [5.0, 5.0] and lengths.tolist() == [1, 4]
    assert stats.returns.tolist() == [0.0, 0.0] and stats.lengths.tolist() == [0, 0]


def test_the_ppo_objective_of_played_steps_is_the_clipped_objective_of_the_paper():
    # Every step played: the script's objective is the reference's on the same minibatch, with the
    # advantages as given (update_minibatch normalizes them before). The old log-probabilities put
    # the ratios on both sides of the clip.
    args = small_args()
    agent = ppo_jax.Agent(4)
    params = ppo_jax.init_params(agent, jax.random.key(0))
    mb = random_batch(np.random.default_rng(0), 64, played_fraction=1.0)
    loss, stats = jax.jit(lambda mb: ppo_jax.ppo_loss(params, agent, mb, mb.advantages, 64, args))(mb)
    get_action_and_value = ppo_jax.Agent.get_action_and_value
    _, newlogprob, entropy, newvalue = agent.apply(params, mb.obs, action=mb.actions, method=get_action_and_value)
    inputs = (newlogprob, entropy, newvalue, mb.logprobs, mb.advantages, mb.returns, mb.values)
    expected, expected_stats = reference_ppo_loss(
        *(np.asarray(x, np.float64).ravel().tolist() for x in inputs),
        args.clip_coef,
        args.ent_coef,
        args.vf_coef,
        norm_adv=False,
        clip_vloss=args.clip_vloss,
    )
    assert 0.1 < expected_stats["clipfrac"] < 0.9, "the data reaches both sides of the clip"
    np.testing.assert_allclose(float(loss), expected, rtol=1e-4)
    for name, value in expected_stats.items():
        np.testing.assert_allclose(float(stats[name]), value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_loss_ignores_reset_steps():
    # A minibatch with reset steps gives the loss, gradient and statistics of its played steps alone.
    args = small_args()
    agent = ppo_jax.Agent(4)
    params = ppo_jax.init_params(agent, jax.random.key(0))
    mb = random_batch(np.random.default_rng(0), 8)
    ppo_loss = lambda params, mb: ppo_jax.ppo_loss(params, agent, mb, mb.advantages, mb.played.sum(), args)
    evaluate = jax.jit(lambda mb: jax.value_and_grad(ppo_loss, has_aux=True)(params, mb))

    (loss, stats), grads = evaluate(mb)
    scrambled = random_batch(np.random.default_rng(1), 8)
    keep = lambda mine, other: jnp.where(mb.played.reshape((-1,) + (1,) * (mine.ndim - 1)), mine, other)
    (loss2, stats2), grads2 = evaluate(jax.tree.map(keep, mb, scrambled)._replace(played=mb.played))
    played_only = jax.tree.map(lambda x: x[np.asarray(mb.played)], mb)
    (loss3, stats3), grads3 = evaluate(played_only)
    for other_loss, other_stats, other_grads in [(loss2, stats2, grads2), (loss3, stats3, grads3)]:
        np.testing.assert_allclose(other_loss, loss, rtol=1e-5, atol=1e-7)
        jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7), other_stats, stats)
        jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-7), other_grads, grads)


def test_normalized_advantages_have_mean_0_and_std_1_over_played_steps():
    rng = np.random.default_rng(0)
    advantages, played = jnp.asarray(rng.normal(3.0, 2.0, 64), jnp.float32), jnp.asarray(rng.random(64) < 0.7)
    normalized = single_device(partial(ppo_jax.normalize_advantages, axis_name="devices"), (P(), P()), P())(
        advantages, played
    )
    kept = np.asarray(normalized)[np.asarray(played)]
    np.testing.assert_allclose([kept.mean(), kept.std(ddof=1)], [0.0, 1.0], atol=1e-5)


def test_the_compiled_update_takes_the_minibatch_steps_of_every_epoch_in_order():
    # update_epochs compiles into one program what a Python loop over update_minibatch would do.
    args = small_args()
    agent = ppo_jax.Agent(4)
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.scale_by_adam(eps=1e-5))
    params = ppo_jax.init_params(agent, jax.random.key(0))
    state = ppo_jax.TrainState(params, tx.init(params))
    batch = random_batch(np.random.default_rng(0), args.local_batch_size)
    keys = jax.random.split(jax.random.key(1), args.update_epochs)
    perms = jnp.stack([jax.random.permutation(k, args.local_batch_size) for k in keys])
    kwargs = dict(agent=agent, tx=tx, args=args, axis_name="devices")
    step = single_device(partial(ppo_jax.update_minibatch, **kwargs), (P(),) * 6, P())
    compiled = single_device(partial(ppo_jax.update_epochs, **kwargs), (P(),) * 4, P())

    looped, clipfracs = state, []
    for epoch in range(args.update_epochs):
        for minibatch in range(args.num_minibatches):
            looped, stats = step(looped, epoch, minibatch, batch, perms, 2.5e-4)
            clipfracs.append(stats["clipfrac"])
    scanned, scanned_stats = compiled(state, batch, perms, 2.5e-4)
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6), scanned.params, looped.params)
    # The statistics of the last minibatch, but the clip fraction: the mean over the whole update.
    stats["clipfrac"] = np.mean(clipfracs)
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6), scanned_stats, stats)
    assert not np.allclose(looped.params["params"]["actor"]["kernel"], params["params"]["actor"]["kernel"])


def test_target_kl_stops_the_compiled_epochs_after_the_first():
    # A target KL of 0 is exceeded by the first epoch: the compiled loop must then leave the
    # parameters as one epoch left them.
    agent = ppo_jax.Agent(4)
    params = ppo_jax.init_params(agent, jax.random.key(0))
    batch = random_batch(np.random.default_rng(0), 16)
    results = []
    for args in (small_args(target_kl=0.0, update_epochs=3), small_args(update_epochs=1)):
        tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.scale_by_adam(eps=1e-5))
        perms = jnp.stack([jnp.arange(16)] * args.update_epochs)
        update = partial(ppo_jax.update_epochs, agent=agent, tx=tx, args=args, axis_name="devices")
        state = ppo_jax.TrainState(params, tx.init(params))
        state, _ = single_device(update, (P(),) * 4, P())(state, batch, perms, 2.5e-4)
        results.append(state.params)
    jax.tree.map(partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-8), *results)


def test_data_parallel_gradient_equals_the_single_device_gradient():
    # Two host devices, each with half of a minibatch, take the same step as one device with all of
    # it: advantages are normalized over the whole minibatch and the devices' gradients summed.
    code = textwrap.dedent(
        """
        import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
        from functools import partial
        import jax, numpy as np, optax
        from jax.sharding import Mesh, PartitionSpec as P
        import cleanrl.ppo_atari_envpool_xla_jax_scan as ppo_jax
        from test_ppo_atari_envpool_xla_jax_scan import random_batch, small_args
        assert jax.device_count() == 2
        agent = ppo_jax.Agent(4)
        tx = optax.chain(optax.clip_by_global_norm(0.5), optax.scale_by_adam(eps=1e-5))
        params = ppo_jax.init_params(agent, jax.random.key(0))
        state = ppo_jax.TrainState(params, tx.init(params))
        batch = random_batch(np.random.default_rng(0), 16)
        new_params = []
        for devices in (1, 2):
            args = small_args(num_minibatches=1)
            args.local_batch_size = 16 // devices
            mesh = Mesh(np.array(jax.devices()[:devices]), ("devices",))
            step = partial(ppo_jax.update_minibatch, agent=agent, tx=tx, args=args, axis_name="devices")
            specs = (P(), P(), P(), P("devices"), P(None, "devices"), P())
            sharded = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=P(), check_vma=False))
            perms = np.tile(np.arange(16 // devices), (1, devices))  # each device its own share, in order
            new_state, stats = sharded(state, 0, 0, batch, perms, 1e-3)
            new_params.append(jax.device_get(new_state.params))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), *new_params)
        print("same step")
        """
    )
    env = {**os.environ, **TWO_HOST_DEVICES}
    command = [sys.executable, "-c", code, REPO_ROOT]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "same step" in result.stdout, result.stderr[-3000:]


def test_bf16_leaves_the_heads_in_fp32():
    # Values and log-probabilities feed GAE and the ratio: under bf16 they must still be the fp32
    # heads applied to the (bf16) hidden features, not bf16-rounded numbers (as in the torch scripts).
    agent = ppo_jax.Agent(4, jnp.bfloat16)
    params = ppo_jax.init_params(agent, jax.random.key(0))
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.integers(0, 256, (16, 4, 84, 84), dtype=np.uint8))
    action = jnp.asarray(rng.integers(0, 4, 16), jnp.int32)
    hidden = agent.apply(params, obs, method=ppo_jax.Agent.hidden)
    _, logprob, _, value = agent.apply(params, obs, action=action, method=ppo_jax.Agent.get_action_and_value)
    assert hidden.dtype == jnp.bfloat16 and value.dtype == logprob.dtype == jnp.float32
    fp64 = lambda x: np.asarray(x, np.float64)
    dense = lambda head: fp64(hidden) @ fp64(params["params"][head]["kernel"]) + fp64(params["params"][head]["bias"])
    logits = dense("actor")
    expected_logprob = (logits - np.log(np.exp(logits).sum(1, keepdims=True)))[np.arange(16), np.asarray(action)]
    np.testing.assert_allclose(value, dense("critic")[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logprob, expected_logprob, rtol=1e-6, atol=1e-6)


# --- Environment ids --------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["Breakout-v5", "ALE/Breakout-v5", "BreakoutNoFrameskip-v4"])
def test_env_id_styles_name_the_same_envpool_task(env_id):
    assert ppo_jax.envpool_task(env_id) == "Breakout-v5"


@pytest.mark.parametrize("env_id", ["NoSuchGame-v5", "Ant-v5", "CartPole-v1"])
def test_non_atari_or_unknown_ids_are_rejected(env_id):
    with pytest.raises(SystemExit, match="unknown Atari env id"):
        ppo_jax.envpool_task(env_id)


# --- The compiled rollout ---------------------------------------------------------------------
def test_compiled_rollout_equals_a_python_replay_of_its_actions_including_truncated_games():
    # The rollout, with envpool's steps inside one lax.scan, against the same seeds and actions
    # replayed through envpool's Python API: observations, reset steps, and every finished game's
    # score and length, with a time limit that cuts some games.
    num_envs, time_limit, seed = 3, 150, 5
    agent = ppo_jax.Agent(4)
    params = ppo_jax.init_params(agent, jax.random.key(0))
    envs = ppo_jax.make_envs("Breakout-v5", num_envs, 0.0, seed, max_episode_steps=time_limit)
    handle, _, _, env_step = envs.xla()
    obs, info = envs.reset()
    state = ppo_jax.EnvState(
        handle,
        obs,
        np.zeros(num_envs, bool),
        ppo_jax.EpisodeStatistics(np.zeros(num_envs, np.float32), np.zeros(num_envs, np.int32)),
        info["lives"],
    )
    play = jax.jit(partial(ppo_jax.rollout, agent, env_step, num_steps=100))
    chunks = []
    for i in range(6):
        state, transitions, _ = play(params, state, jax.random.key(i))
        chunks.append(jax.device_get(transitions))
    envs.close()
    t = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
    compiled_games = [
        (s, i, float(t.episodic_returns[s, i]), int(t.episodic_lengths[s, i])) for s, i in zip(*np.nonzero(t.game_over))
    ]

    replay = ppo_jax.make_envs("Breakout-v5", num_envs, 0.0, seed, max_episode_steps=time_limit)
    obs, info = replay.reset()
    returns, lengths = np.zeros(num_envs), np.zeros(num_envs, int)
    reset_step = np.zeros(num_envs, bool)
    replayed_games, truncated_games, game_overs = [], 0, 0
    for s in range(len(t.actions)):
        np.testing.assert_array_equal(t.obs[s], obs)
        np.testing.assert_array_equal(t.played[s], ~reset_step)
        lives = info["lives"]
        obs, reward, terminated, truncated, info = replay.step(t.actions[s])
        np.testing.assert_array_equal(t.rewards[s], reward)
        np.testing.assert_array_equal(t.truncations[s], ppo_jax.time_limit_cuts(truncated, info, lives))
        returns += info["reward"]
        lengths += ~reset_step
        for i in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            assert lengths[i] == info["elapsed_step"][i]
            replayed_games.append((s, i, float(returns[i]), int(lengths[i])))
            truncated_games += bool(truncated[i])
            game_overs += bool(info["terminated"][i])
            returns[i], lengths[i] = 0, 0
        reset_step = terminated | truncated
    replay.close()
    assert compiled_games == replayed_games
    assert truncated_games >= 1 and game_overs >= 1, (truncated_games, game_overs)


def test_the_time_limit_is_bootstrapped_only_where_the_learning_episode_goes_on():
    assert_time_limit_cuts_only_episodes_that_go_on(ppo_jax)


def test_the_video_shadow_env_plays_the_same_game_as_the_env_it_records():
    # The recorder's "shadow": env 0's seed and settings but full-size RGB frames, fed env 0's
    # actions. It must play env 0's very game: the same emulator RAM, rewards, lives, episode ends
    # and time limit at every step (sticky actions on, so the random draws must match too), and its
    # frames, turned gray and resized to 84x84, must be what the agent saw.
    seed, time_limit = 7, 250
    envs = ppo_jax.make_envs("Breakout-v5", 3, 0.25, seed, max_episode_steps=time_limit)
    shadow = ppo_jax.make_envs("Breakout-v5", 1, 0.25, seed, max_episode_steps=time_limit, rgb_frames=True)
    obs, _ = envs.reset()
    frame, _ = shadow.reset()
    rng = np.random.default_rng(0)
    lives_lost, games_ended = 0, 0
    for _ in range(600):
        actions = rng.integers(0, 4, 3)
        obs, reward, terminated, truncated, info = envs.step(actions)
        frame, shadow_reward, shadow_terminated, shadow_truncated, shadow_info = shadow.step(actions[:1])
        assert frame.shape == (1, 3, 210, 160)
        for key in ("ram", "lives", "reward", "terminated", "elapsed_step"):
            np.testing.assert_array_equal(shadow_info[key][0], info[key][0], err_msg=key)
        assert (shadow_reward[0], shadow_terminated[0], shadow_truncated[0]) == (reward[0], terminated[0], truncated[0])
        gray = cv2.cvtColor(np.ascontiguousarray(frame[0].transpose(1, 2, 0)), cv2.COLOR_RGB2GRAY)
        small = cv2.resize(gray, (84, 84), interpolation=cv2.INTER_AREA)
        assert np.abs(small.astype(int) - obs[0, -1]).max() <= 1
        lives_lost += bool(terminated[0])
        games_ended += bool(info["terminated"][0] or truncated[0])
    envs.close()
    shadow.close()
    assert lives_lost >= 5 and games_ended >= 2, (lives_lost, games_ended)


def test_a_video_recorder_whose_env_ends_a_game_the_shadow_did_not_stops_and_says_so(tmp_path, capfd):
    # Never a video of a different game: a shadow that lost sync (here: told a game ended after 50
    # steps, long before any Breakout game over) writes nothing more and leaves no partial file.
    recorder = ppo_jax.ReplayVideoRecorder(str(tmp_path), "Breakout-v5", 0, ppo_jax.Args())
    game_over = np.zeros(50, bool)
    game_over[-1] = True
    recorder.add(np.zeros(50, np.int32), game_over, np.zeros(50, np.float32))
    recorder.close()
    assert "lost sync" in capfd.readouterr().err
    assert os.listdir(tmp_path) == []


def test_loaded_model_equals_saved_model(tmp_path):
    # A model is a flax Agent bound to its parameters.
    params = ppo_jax.init_params(ppo_jax.Agent(4), jax.random.key(3))
    args = ppo_jax.Args()
    path = str(tmp_path / "agent.cleanrl_model")
    ppo_jax.save_model(path, ppo_jax.Agent(4).bind(params), args)
    loaded, saved_args = ppo_jax.load_model(path, jax.devices()[0])
    assert loaded.num_actions == 4 and saved_args["env_id"] == args.env_id
    assert jax.tree.structure(loaded.variables) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, loaded.variables, params)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(ppo_jax, tmp_path)


def test_patch_convolution_equals_xla_convolution():
    # On CPU (PATCH_CONVOLUTIONS_ON_CPU) the network computes its convolutions as matrix products of
    # image patches: the same function of the same parameters as XLA's convolution.
    x = jax.random.normal(jax.random.key(0), (3, 20, 20, 8))
    for kernel_size, stride in [(8, 4), (4, 2), (3, 1)]:
        layer = partial(ppo_jax.Conv, 16, kernel_size, stride)
        params = jax.jit(layer().init)(jax.random.key(1), x)
        apply = lambda im2col: jax.jit(layer(im2col=im2col).apply)(params, x)
        np.testing.assert_allclose(apply(True), apply(False), rtol=1e-5, atol=1e-5)


# --- Whole runs -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("short_run")
    result = run_script(
        SCRIPT,
        *SHORT_RUN,
        "--save-model",
        "--eval-episodes",
        "2",
        "--progress-interval",
        "0",
        "--capture-video",
        "--track",
        cwd=cwd,
        env=TWO_HOST_DEVICES,
    )
    return cwd, result


def test_short_training_run_logs_every_tag_for_every_iteration(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    assert "2 cpu device(s) on 1 process(es): 2 envs (1 per device), batch 128" in result.stdout
    assert "finished 4 iterations, 512 steps" in result.stdout
    assert "warning" not in result.stderr  # fp32: nothing to warn of
    (run_dir,) = run_dirs(cwd)
    assert_short_atari_run_logged(run_dir, batch_size=128)


def test_off_a_terminal_progress_interval_0_prints_a_plain_progress_line_per_iteration(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    assert_progress_line_per_iteration(result.stderr, read_scalars(run_dir), batch_size=128, iterations=4)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ppo_jax.Progress, monkeypatch)


def recorded_games(video_folder: str) -> dict[int, np.ndarray]:
    """{game number: its frames} of the videos in a folder; no unfinished (`.partial`) video may be left."""
    names = sorted(os.listdir(video_folder))
    assert names and all(re.fullmatch(r"game-\d+\.mp4", name) for name in names), names
    return {int(name[5:-4]): mp4_frames(os.path.join(video_folder, name)) for name in names}


def assert_whole_rgb_games(videos: dict[int, np.ndarray], lengths: list[int]):
    """The videos are env 0's games on the capped cubic schedule, each game whole: one full-size RGB
    frame per played step, as many as the game's length."""
    assert sorted(videos) == [game for game in range(len(lengths)) if game in (0, 1, 8, 27, 64, 125)]
    for game, frames in videos.items():
        assert frames.shape[1:] == (210, 160, 3)
        assert (frames[..., 0] != frames[..., 2]).any(), "colour, not gray"
        assert len(frames) == lengths[game]


def test_capture_video_records_whole_rgb_games_of_env_0_in_training_and_evaluation(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    run_name, scalars = os.path.basename(run_dir), read_scalars(run_dir)
    # Env i's games are logged at the global steps s with (s - 1) % num_envs == i; 2 envs here.
    env_0_lengths = [int(length) for step, length in scalars["charts/episodic_length"] if (step - 1) % 2 == 0]
    assert env_0_lengths, "env 0 finished a game"
    assert_whole_rgb_games(recorded_games(str(cwd / "videos" / run_name)), env_0_lengths)
    # The evaluation's env 0 plays game 0 of the evaluation (2 games over 2 envs), recorded whole: the
    # shadow's game ended where the evaluation's did (else it would say it lost sync).
    eval_videos = recorded_games(str(cwd / "videos" / f"{run_name}-eval"))
    assert sorted(eval_videos) == [0] and eval_videos[0].shape[1:] == (210, 160, 3) and len(eval_videos[0]) > 50
    assert "lost sync" not in result.stderr


def test_under_track_every_video_is_uploaded_to_wandb(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    videos = {os.path.relpath(path, cwd / "videos") for path in glob.glob(str(cwd / "videos" / "*" / "*.mp4"))}
    (wandb_files,) = glob.glob(str(cwd / "wandb" / "offline-run-*" / "files"))
    uploaded = {os.path.relpath(path, wandb_files) for path in glob.glob(os.path.join(wandb_files, "*", "*.mp4"))}
    assert videos and uploaded == videos


def test_two_devices_hold_identical_parameters(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    digests = re.search(r"parameters sha256 per device (\w+) (\w+)\n", result.stdout).groups()
    assert digests[0] == digests[1]


def short_run_digests(short_run) -> list[str]:
    """The parameters' digest on each of short_run's two devices."""
    return list(re.search(r"parameters sha256 per device (\w+) (\w+)\n", short_run[1].stdout).groups())


def process_digests(outputs: list[str]) -> list[str]:
    """The parameters' digest printed by each process of a job (one device each), in process order."""
    return [re.search(rf"process {i}: parameters sha256 per device (\w+)\n", out)[1] for i, out in enumerate(outputs)]


def test_two_processes_sharing_a_folder_train_the_job_of_one_process_with_two_devices_and_one_writes_it(
    short_run, tmp_path
):
    # Two processes on loopback in one folder (one host, or hosts on a shared filesystem): jax.distributed
    # joins their devices into one job, which must be short_run's job of two devices, bit for bit; the
    # folder is the run's once: one process keeps its TensorBoard events and checkpoints (a second writer
    # would find the run locked, or log every step twice).
    coordinator = ["--coordinator-address", f"127.0.0.1:{free_port()}", "--num-processes", "2"]
    command = [sys.executable, os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *SHORT_RUN, "--checkpoint-every", "2"]
    launches = []
    for process_id in (0, 1):
        process = subprocess.Popen(
            [*command, *coordinator, "--process-id", str(process_id)],
            cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        launches.append((process, tmp_path))
    (output0, rc0, _), (output1, rc1, _) = wait_all(launches, timeout=300)
    assert rc0 == 0 and rc1 == 0, output0 + output1
    assert "2 cpu device(s) on 2 process(es): 2 envs (1 per device), batch 128" in output0
    assert "finished 4 iterations, 512 steps" in output0 and "finished" not in output1
    assert process_digests([output0, output1]) == short_run_digests(short_run)
    (run_dir,) = run_dirs(tmp_path)
    assert len(glob.glob(os.path.join(run_dir, "events.*"))) == 1 and "checkpoint runs/" not in output1
    assert [step for step, _ in read_scalars(run_dir)["losses/value_loss"]] == [128, 256, 384, 512]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == [
        "iteration-0000002.msgpack",
        "iteration-0000004.msgpack",
        "lock",
    ]


# --- Across hosts (benchmark/hosts.py: each host its own address, name and disk) -----------------
def start_on_hosts(cluster, args: list[str], logs, hosts=(1, 2)) -> list[subprocess.Popen]:
    """The script's job on `hosts`, process i - 1 on node i, the coordinator on node1, each in its own disk's
    folder; node i's output goes to logs/node{i}.txt."""
    coordinator = ["--coordinator-address", "node1:7777", "--num-processes", str(len(hosts))]
    command = [sys.executable, os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *args, *coordinator]
    env = subprocess_environment({"OMP_NUM_THREADS": "1"})
    return [
        cluster.popen(i, [*command, "--process-id", str(i - 1)], env=env, stdout=open(logs / f"node{i}.txt", "w"),
                      stderr=subprocess.STDOUT)
        for i in hosts
    ]  # fmt: skip


def run_on_hosts(cluster, args: list[str], logs, timeout=300) -> list[str]:
    """start_on_hosts, then the outputs of its processes once all have exited 0."""
    processes = start_on_hosts(cluster, args, logs)
    try:
        codes = [process.wait(timeout=timeout) for process in processes]
    finally:
        for i in (1, 2):
            cluster.kill(i)
    outputs = [(logs / f"node{i}.txt").read_text() for i in (1, 2)]
    assert codes == [0, 0], "\n".join(outputs)
    return outputs


def checkpoint_state(path: str):
    return flax.serialization.msgpack_restore(Path(path).read_bytes())["train_state"]


def test_two_hosts_train_the_job_of_two_devices_each_keeping_the_whole_run_on_its_disk(short_run, make_hosts, tmp_path):
    # node1 and node2 (jax.distributed over their own addresses, the coordinator on node1) train short_run's
    # job bit for bit, and each host's disk holds the whole run: every step's scalars and every checkpoint.
    cluster = make_hosts(2)
    args = [*SHORT_RUN, "--checkpoint-every", "2", "--resume", "auto"]
    outputs = run_on_hosts(cluster, args, tmp_path)
    assert "2 cpu device(s) on 2 process(es): 2 envs (1 per device), batch 128" in outputs[0]
    assert process_digests(outputs) == short_run_digests(short_run)
    (run1,), (run2,) = run_dirs(cluster.disk(1)), run_dirs(cluster.disk(2))
    assert os.path.basename(run1) == os.path.basename(run2), "one run, one name"
    scalars = [read_scalars(run1), read_scalars(run2)]
    assert [step for step, _ in scalars[0]["losses/value_loss"]] == [128, 256, 384, 512]
    for tag in scalars[0].keys() - {"charts/SPS"}:  # SPS: each host's own clock
        assert scalars[0][tag] == scalars[1][tag], tag
    last = [os.path.join(run, "checkpoints", "iteration-0000004.msgpack") for run in (run1, run2)]
    jax.tree.map(np.testing.assert_array_equal, checkpoint_state(last[0]), checkpoint_state(last[1]))

    # node1 replaced by a machine with an empty disk: the same command agrees on node2's newest checkpoint,
    # copies it to node1 with the run's TensorBoard file and resumes there (the run is finished: no step left).
    shutil.rmtree(os.path.join(cluster.disk(1), "runs"))
    outputs = run_on_hosts(cluster, args, tmp_path)
    checkpoint = f"runs/{os.path.basename(run1)}/checkpoints/iteration-0000004.msgpack"
    assert f"process 0: copied {checkpoint} and 1 TensorBoard file(s) from process 1" in outputs[0]
    assert "copied" not in outputs[1]
    assert f"resuming {os.path.basename(run1)} at step 512 from {checkpoint}" in outputs[0]
    assert process_digests(outputs) == short_run_digests(short_run)
    assert read_scalars(run1).keys() == scalars[1].keys()
    for tag, values in read_scalars(run1).items():
        assert values == scalars[1][tag], tag


@pytest.mark.parametrize("lost", [2, 1], ids=["node2", "node1-of-process-0"])
def test_a_job_that_loses_a_host_ends_and_resumes_on_the_other_alone_from_its_own_disk(make_hosts, tmp_path, lost):
    # jax.distributed has no elastic restart: the loss of either host (kill -9 of all its processes, after a
    # checkpoint) ends the job within seconds. The documented restart, the same command on the host left
    # without the coordinator, resumes from the newest checkpoint on that host's own disk and finishes the
    # budget, every iteration logged once in that disk's TensorBoard events.
    cluster = make_hosts(2)
    left = 3 - lost
    args = ["--num-envs", "2", "--num-steps", "64", "--total-timesteps", "768", "--checkpoint-every", "2"]
    args += ["--resume", "auto", "--progress-interval", "0"]
    processes = start_on_hosts(cluster, args, tmp_path)
    deadline = time.monotonic() + 300
    while not glob.glob(os.path.join(cluster.disk(left), "runs", "*", "checkpoints", "iteration-0000002.msgpack")):
        assert time.monotonic() < deadline and processes[left - 1].poll() is None, (
            tmp_path / f"node{left}.txt"
        ).read_text()
        time.sleep(0.1)
    cluster.kill(lost)
    killed = time.monotonic()
    code = processes[left - 1].wait(timeout=120)
    ended_after = time.monotonic() - killed
    output = (tmp_path / f"node{left}.txt").read_text()
    assert "finished" not in output, "the kill came after the end: nothing was lost"
    assert code != 0 and ended_after < 30, (code, ended_after, output[-3000:])
    if lost == 2:  # process 0 is left: it says so in one line (process 1 is ended by JAX itself)
        assert code == 1 and output.strip().splitlines()[-1].startswith("error: process 0 lost the job"), output

    (run_dir,) = run_dirs(cluster.disk(left))
    newest = max(glob.glob("iteration-*.msgpack", root_dir=os.path.join(run_dir, "checkpoints")))  # 2 or later
    command = [sys.executable, os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *args]
    env = subprocess_environment({"OMP_NUM_THREADS": "1"})
    result = cluster.run(left, command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    step = 128 * int(newest[len("iteration-") : -len(".msgpack")])
    assert f"resuming {os.path.basename(run_dir)} at step {step:,} from runs/" in result.stdout
    assert f"{newest}\n1 cpu device(s) on 1 process(es)" in result.stdout
    assert "finished 6 iterations, 768 steps" in result.stdout
    assert run_dirs(cluster.disk(left)) == [run_dir]
    scalars = read_scalars(run_dir)
    for tag in ("losses/value_loss", "charts/learning_rate", "charts/SPS"):
        assert [step for step, _ in scalars[tag]] == [128 * i for i in range(1, 7)], tag
    game_steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert game_steps == sorted(set(game_steps)), "no game twice"


def test_save_then_evaluate_round_trip(short_run):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("eval_episode=") == 2
    evaluate_saved_model(SCRIPT, saved_model_path(SCRIPT, cwd), 3, cwd=cwd)


def test_an_evaluation_under_track_with_videos_reaches_wandb(short_run, tmp_path):
    cwd, result = short_run
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "evaluation"
    assert_tracked_evaluation_logs_under_the_models_env(
        SCRIPT,
        saved_model_path(SCRIPT, cwd),
        "Breakout-v5",
        "Pong-v5",
        folder,
        "--eval-episodes",
        "1",
        "--max-episode-steps",
        "300",
        "--capture-video",
    )
    assert glob.glob(str(folder / "wandb" / "offline-run-*" / "files" / "*-eval" / "*.mp4")), "videos uploaded"


def test_bf16_training_run_gives_finite_losses(tmp_path):
    args = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128"]
    result = assert_bf16_run_gives_finite_losses(SCRIPT, *args, cwd=tmp_path)
    assert "warning: XLA:CPU has no fast bf16 path: bf16 runs slower than fp32" in result.stderr


PROCESS_0_OF_2, PROCESS_1_OF_2 = (["--num-processes", "2", "--process-id", str(i)] for i in (0, 1))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGame-v5"], "unknown Atari env id"),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--num-steps", "0"], "must be positive"),
        (["--eval-episodes", "0"], "must be positive"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be 0 (never) or positive"),
        (["--num-processes", "2", "--process-id", "0"], "need --coordinator-address"),
        (["--coordinator-address", "nowhere.invalid:7777", *PROCESS_1_OF_2], "host 'nowhere.invalid' does not resolve"),
        # nothing listens on loopback's port 1: a coordinator that never starts, given up on after --join-timeout
        (["--coordinator-address", "127.0.0.1:1", "--join-timeout", "2", *PROCESS_1_OF_2], "in 2 s: [Errno 111]"),
        (["--clip-coef", "-0.1"], "--clip-coef must not be negative, got -0.1"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script(SCRIPT, *args, cwd=tmp_path), message)


def test_a_coordinator_port_taken_on_process_0s_host_is_a_one_line_error(tmp_path):
    with socket.create_server(("0.0.0.0", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = run_script(SCRIPT, "--coordinator-address", address, *PROCESS_0_OF_2, cwd=tmp_path)
    assert_user_error(result, f"the coordinator's port {address.split(':')[1]} is taken on ")


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(ppo_jax.check_args, lambda **o: small_args(num_iterations=100, **o))
    assert_ppo_ranges_are_checked(ppo_jax.check_args, ppo_jax.Args)


def test_num_envs_that_does_not_split_over_the_devices_is_a_one_line_error(tmp_path):
    result = run_script(SCRIPT, "--num-envs", "3", cwd=tmp_path, env=TWO_HOST_DEVICES)
    assert_user_error(result, "--num-envs 3 does not split evenly over 2 devices", "multiple of 2")


# CleanRL's own command lines for its ppo_atari_envpool_xla_jax_scan.py (its docs and benchmark
# scripts), with the budget cut down to two iterations.
CLEANRL_INVOCATIONS = [
    ["--env-id", "Breakout-v5", "--total-timesteps", "256", "--num-envs", "8", "--num-steps", "16", "--seed", "1"],
    ["--env-id", "Pong-v5", "--track", "--total-timesteps", "128", "--num-envs", "4", "--num-steps", "16"],
]


@pytest.mark.parametrize("invocation", CLEANRL_INVOCATIONS, ids=["breakout-num-envs-8", "pong-track"])
def test_cleanrl_command_lines_run_with_num_envs_as_the_total_over_devices(tmp_path, invocation):
    result = run_script(SCRIPT, *invocation, cwd=tmp_path, env=TWO_HOST_DEVICES)
    assert result.returncode == 0, result.stderr
    num_envs = int(invocation[invocation.index("--num-envs") + 1])
    batch = num_envs * 16
    assert f"on 1 process(es): {num_envs} envs ({num_envs // 2} per device), batch {batch}," in result.stdout
    assert f"finished 2 iterations, {2 * batch} steps" in result.stdout
    (run_dir,) = run_dirs(tmp_path)
    assert [step for step, _ in read_scalars(run_dir)["charts/SPS"]] == [batch, 2 * batch]


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected(SCRIPT, tmp_path)


def assert_model_is_the_checkpoints(checkpoint_path: str, model_path: str):
    # Adam went on counting from the checkpoint's updates, not from zero; the model is the checkpoint's.
    read = lambda path: flax.serialization.msgpack_restore(Path(path).read_bytes())
    checkpoint, model = read(checkpoint_path), read(model_path)
    params, adam = checkpoint["train_state"]["params"], checkpoint["train_state"]["opt_state"]["1"]
    updates = 4 * checkpoint["args"]["update_epochs"] * checkpoint["args"]["num_minibatches"]
    assert int(adam["count"]) == updates
    assert jax.tree.structure(model["params"]) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, model["params"], params)


def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory_on_any_number_of_devices(
    tmp_path, monkeypatch, capsys
):
    args = dict(num_envs=2, num_steps=64)
    assert_run_resumes_where_its_checkpoint_left_it(
        ppo_jax, tmp_path, monkeypatch, capsys, args, "msgpack", assert_model_is_the_checkpoints
    )

    # The checkpoint of this one-device run, resumed on two devices: the job's batch is split anew.
    (run_dir,) = run_dirs(tmp_path)
    os.remove(os.path.join(run_dir, "checkpoints", "iteration-0000004.msgpack"))
    other = tmp_path / "other"
    os.makedirs(other / "runs")
    os.rename(run_dir, other / "runs" / os.path.basename(run_dir))
    checkpoint = f"runs/{os.path.basename(run_dir)}/checkpoints/iteration-0000002.msgpack"
    result = run_script(
        SCRIPT, "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "512", "--checkpoint-every", "2",
        "--resume", checkpoint, cwd=other, env=TWO_HOST_DEVICES,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "2 cpu device(s) on 1 process(es): 2 envs (1 per device)" in result.stdout
    assert f"resuming {os.path.basename(run_dir)} at step 256 from {checkpoint}" in result.stdout
    assert "finished 4 iterations, 512 steps" in result.stdout
    scalars = read_scalars(str(other / "runs" / os.path.basename(run_dir)))
    assert [step for step, _ in scalars["losses/value_loss"]] == [128, 256, 384, 512]


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(ppo_jax, tmp_path, "iteration", 7, extension="msgpack")
