"""A CleanRL user's command lines work here: every flag of CleanRL's script of the same name is
accepted, with the same meaning and default, except the differences each docs page lists.

The defaults below are those of CleanRL's scripts (the `Args` dataclasses of ppo.py, ppo_atari.py, ppo_atari_lstm.py,
ppo_atari_envpool.py, ppo_continuous_action.py, sac_continuous_action.py, dqn.py and dqn_atari.py in
the vwxyzjn/cleanrl repository), written down as facts."""

import dataclasses

import pytest
import tyro
from running import run_dirs, run_script

import cleanrl.c51_atari as c51_atari
import cleanrl.dqn as dqn
import cleanrl.dqn_atari as dqn_atari
import cleanrl.ppo as ppo
import cleanrl.ppo_atari as ppo_atari
import cleanrl.ppo_atari_envpool as ppo_atari_envpool
import cleanrl.ppo_atari_lstm as ppo_atari_lstm
import cleanrl.ppo_continuous_action as ppo_continuous_action
import cleanrl.sac_continuous_action as sac_continuous_action
from cleanrl import ddpg_continuous_action, td3_continuous_action

EXPERIMENT = dict(
    seed=1,
    torch_deterministic=True,
    cuda=True,
    track=False,
    wandb_project_name="cleanRL",
    wandb_entity=None,
    capture_video=False,
)
PPO_ALGORITHM = dict(
    learning_rate=2.5e-4,
    num_steps=128,
    anneal_lr=True,
    gamma=0.99,
    gae_lambda=0.95,
    num_minibatches=4,
    update_epochs=4,
    norm_adv=True,
    clip_vloss=True,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=0.5,
    target_kl=None,
)
CLEANRL_DEFAULTS = {
    ppo: dict(**EXPERIMENT, **PPO_ALGORITHM, env_id="CartPole-v1", total_timesteps=500_000, num_envs=4, clip_coef=0.2),
    ppo_atari: dict(
        **EXPERIMENT,
        **PPO_ALGORITHM,
        env_id="BreakoutNoFrameskip-v4",
        total_timesteps=10_000_000,
        num_envs=8,
        clip_coef=0.1,
    ),
    ppo_atari_lstm: dict(
        **EXPERIMENT,
        **PPO_ALGORITHM,
        env_id="BreakoutNoFrameskip-v4",
        total_timesteps=10_000_000,
        num_envs=8,
        clip_coef=0.1,
    ),
    ppo_atari_envpool: dict(
        **EXPERIMENT,
        **PPO_ALGORITHM,
        env_id="Pong-v5",
        total_timesteps=10_000_000,
        num_envs=8,
        clip_coef=0.1,
    ),
    ppo_continuous_action: dict(
        **EXPERIMENT,
        **{
            **PPO_ALGORITHM,
            "learning_rate": 3e-4,
            "num_steps": 2048,
            "num_minibatches": 32,
            "update_epochs": 10,
            "ent_coef": 0.0,
        },
        save_model=False,
        env_id="HalfCheetah-v4",
        total_timesteps=1_000_000,
        num_envs=1,
        clip_coef=0.2,
    ),
}
DQN_ALGORITHM = dict(num_envs=1, gamma=0.99, tau=1.0, start_e=1.0, save_model=False)
# TD3's and DDPG's: the same, but for TD3's target policy smoothing (its --num-envs is not offered).
DDPG_ALGORITHM = dict(
    save_model=False,
    env_id="Hopper-v4",
    total_timesteps=1_000_000,
    learning_rate=3e-4,
    buffer_size=1_000_000,
    gamma=0.99,
    tau=0.005,
    batch_size=256,
    exploration_noise=0.1,
    learning_starts=25_000,
    policy_frequency=2,
)
# Other algorithms: their own flags.
CLEANRL_OTHER_DEFAULTS = {
    sac_continuous_action: dict(
        **EXPERIMENT,
        env_id="Hopper-v4",
        total_timesteps=1_000_000,
        buffer_size=1_000_000,
        gamma=0.99,
        tau=0.005,
        batch_size=256,
        learning_starts=5000,
        policy_lr=3e-4,
        q_lr=1e-3,
        policy_frequency=2,
        target_network_frequency=1,
        alpha=0.2,
        autotune=True,
    ),
    td3_continuous_action: dict(**EXPERIMENT, **DDPG_ALGORITHM, policy_noise=0.2, noise_clip=0.5),
    ddpg_continuous_action: dict(**EXPERIMENT, **DDPG_ALGORITHM),
    dqn: dict(
        **EXPERIMENT,
        **DQN_ALGORITHM,
        env_id="CartPole-v1",
        total_timesteps=500_000,
        learning_rate=2.5e-4,
        buffer_size=10_000,
        target_network_frequency=500,
        batch_size=128,
        end_e=0.05,
        exploration_fraction=0.5,
        learning_starts=10_000,
        train_frequency=10,
    ),
    dqn_atari: dict(
        **EXPERIMENT,
        **DQN_ALGORITHM,
        env_id="BreakoutNoFrameskip-v4",
        total_timesteps=10_000_000,
        learning_rate=1e-4,
        buffer_size=1_000_000,
        target_network_frequency=1000,
        batch_size=32,
        end_e=0.01,
        exploration_fraction=0.10,
        learning_starts=80_000,
        train_frequency=4,
    ),
    c51_atari: dict(
        **EXPERIMENT,
        save_model=False,
        env_id="BreakoutNoFrameskip-v4",
        total_timesteps=10_000_000,
        learning_rate=2.5e-4,
        num_envs=1,
        n_atoms=51,
        v_min=-10,
        v_max=10,
        buffer_size=1_000_000,
        gamma=0.99,
        target_network_frequency=10_000,
        batch_size=32,
        start_e=1.0,
        end_e=0.01,
        exploration_fraction=0.10,
        learning_starts=80_000,
        train_frequency=4,
    ),
}
# Where a default differs on purpose; each is explained in the script's docs page.
DIFFERENT_DEFAULTS = {
    ppo_atari_envpool: {"env_id": "Breakout-v5"},  # one game for all the Atari scripts
    ppo_continuous_action: {"env_id": "HalfCheetah-v5"},  # gymnasium 1.x's MuJoCo tasks
    sac_continuous_action: {"env_id": "HalfCheetah-v5"},
    td3_continuous_action: {"env_id": "HalfCheetah-v5"},
    ddpg_continuous_action: {"env_id": "HalfCheetah-v5"},
}


@pytest.mark.parametrize(
    "module", {**CLEANRL_DEFAULTS, **CLEANRL_OTHER_DEFAULTS}, ids=lambda m: m.__name__.split(".")[-1]
)
def test_every_cleanrl_flag_exists_with_cleanrl_default(module):
    args = tyro.cli(module.Args, args=[])
    fields = {field.name for field in dataclasses.fields(module.Args)}
    for name, cleanrl_default in {**CLEANRL_DEFAULTS, **CLEANRL_OTHER_DEFAULTS}[module].items():
        assert name in fields, f"--{name.replace('_', '-')} is missing"
        expected = DIFFERENT_DEFAULTS.get(module, {}).get(name, cleanrl_default)
        assert getattr(args, name) == expected, name


@pytest.mark.parametrize("module", CLEANRL_DEFAULTS, ids=lambda m: m.__name__.split(".")[-1])
def test_cleanrl_command_line_flags_parse_with_their_meaning(module):
    # The flags of CleanRL's README, benchmark scripts and docs, tyro 1.0 spelling.
    args = tyro.cli(
        module.Args,
        args=[
            "--seed",
            "3",
            "--track",
            "--capture-video",
            "--no-cuda",
            "--no-anneal-lr",
            "--target-kl",
            "0.015",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--total-timesteps",
            "4096",
            "--exp-name",
            "mine",
            "--wandb-project-name",
            "proj",
            "--wandb-entity",
            "team",
            "--no-torch-deterministic",
            "--no-norm-adv",
            "--no-clip-vloss",
            "--learning-rate",
            "1e-3",
        ],
    )
    assert (args.seed, args.track, args.capture_video, args.cuda, args.anneal_lr) == (3, True, True, False, False)
    assert (args.target_kl, args.num_envs, args.num_steps, args.total_timesteps) == (0.015, 2, 64, 4096)
    assert (args.exp_name, args.wandb_project_name, args.wandb_entity) == ("mine", "proj", "team")
    assert (args.torch_deterministic, args.norm_adv, args.clip_vloss, args.learning_rate) == (False, False, False, 1e-3)


@pytest.mark.parametrize("module", [dqn, dqn_atari], ids=lambda m: m.__name__.split(".")[-1])
def test_cleanrl_dqn_command_line_flags_parse_with_their_meaning(module):
    args = tyro.cli(
        module.Args,
        args=[
            "--seed",
            "3",
            "--track",
            "--capture-video",
            "--no-cuda",
            "--save-model",
            "--num-envs",
            "2",
            "--total-timesteps",
            "4096",
            "--learning-rate",
            "1e-3",
            "--buffer-size",
            "2000",
            "--gamma",
            "0.9",
            "--tau",
            "0.5",
            "--target-network-frequency",
            "100",
            "--batch-size",
            "16",
            "--start-e",
            "0.9",
            "--end-e",
            "0.1",
            "--exploration-fraction",
            "0.2",
            "--learning-starts",
            "500",
            "--train-frequency",
            "2",
        ],
    )
    assert (args.seed, args.track, args.capture_video, args.cuda, args.save_model) == (3, True, True, False, True)
    assert (args.num_envs, args.total_timesteps, args.learning_rate, args.buffer_size) == (2, 4096, 1e-3, 2000)
    assert (args.gamma, args.tau, args.target_network_frequency, args.batch_size) == (0.9, 0.5, 100, 16)
    assert (args.start_e, args.end_e, args.exploration_fraction) == (0.9, 0.1, 0.2)
    assert (args.learning_starts, args.train_frequency) == (500, 2)


@pytest.mark.parametrize(
    "script, command",
    [
        ("ppo.py", ["--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "1024", "--no-cuda"]),
        (
            "ppo_atari.py",
            ["--env-id", "BreakoutNoFrameskip-v4", "--seed", "1", "--total-timesteps", "256", "--num-envs", "2"],
        ),
        (
            "ppo_atari_envpool.py",
            ["--env-id", "Breakout-v5", "--seed", "1", "--total-timesteps", "256", "--num-envs", "2"],
        ),
        (
            "ppo_continuous_action.py",
            [
                "--env-id",
                "Hopper-v4",
                "--seed",
                "1",
                "--total-timesteps",
                "256",
                "--num-steps",
                "128",
                "--num-minibatches",
                "2",
            ],
        ),
        (
            "sac_continuous_action.py",
            [
                "--env-id",
                "Hopper-v4",
                "--seed",
                "1",
                "--total-timesteps",
                "150",
                "--learning-starts",
                "100",
                "--batch-size",
                "32",
            ],
        ),
        ("dqn.py", ["--env-id", "CartPole-v1", "--seed", "1", "--total-timesteps", "500", "--learning-starts", "400"]),
        (
            "dqn_atari.py",
            [
                "--env-id",
                "BreakoutNoFrameskip-v4",
                "--seed",
                "1",
                "--total-timesteps",
                "300",
                "--learning-starts",
                "280",
                "--buffer-size",
                "1000",
            ],
        ),
    ],
)
def test_cleanrl_invocations_train(tmp_path, script, command):
    result = run_script(script, *command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("finished"), result.stdout
    assert len(run_dirs(tmp_path)) == 1
