"""Saved models and their evaluation: the checks every script that saves a model must pass."""

import glob
import os
import re

from running import assert_user_error, read_scalars, run_dirs, run_script, run_tracked


def assert_saved_model_loads_identically(module, tmp_path):
    """A torch Atari script's save_model -> load_model keeps the weights bit for bit and the args."""
    import torch

    args = module.Args()
    path = str(tmp_path / "model.cleanrl_model")
    network = save_fresh_model(module, path, args)
    loaded, saved_args = module.load_model(path, torch.device("cpu"))
    assert saved_args["env_id"] == args.env_id
    outputs = (lambda net, obs: net(obs)) if hasattr(module, "QNetwork") else (lambda net, obs: net.get_value(obs))
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(outputs(loaded, obs), outputs(network, obs), rtol=0, atol=0)


def assert_evaluation_warns_when_emulator_settings_differ(module, tmp_path):
    """--eval-checkpoint plays under the command's sticky-action probability and time limit. When these
    are not the ones the model was trained with, its returns do not compare with the training run's, and
    the evaluation says so on stderr. One short game each time (an untrained model, games cut at 100 and
    50 steps). The game is the model's whatever --env-id says, and so is the run's name."""
    script = os.path.basename(module.__file__)
    trained = ("--repeat-action-probability", "0.25", "--max-episode-steps", "100")
    save_fresh_model(
        module,
        str(tmp_path / "model.cleanrl_model"),
        module.Args(repeat_action_probability=0.25, max_episode_steps=100),
    )
    evaluation = ("--eval-checkpoint", "model.cleanrl_model", "--eval-episodes", "1")
    same = run_script(script, *evaluation, *trained, cwd=tmp_path)
    assert_evaluation_printed(same, 1)
    assert "warning: evaluating" not in same.stderr
    model_env_id = module.Args().env_id
    other_game = ("--env-id", model_env_id.replace("Breakout", "Pong"))
    other = run_script(script, *evaluation, "--max-episode-steps", "50", *other_game, cwd=tmp_path)
    assert_evaluation_printed(other, 1)
    for run_dir in run_dirs(tmp_path):
        assert os.path.basename(run_dir).startswith(f"{model_env_id.replace('/', '_')}__"), run_dir
    assert "warning: evaluating with --repeat-action-probability 0.0; the model was trained with 0.25" in other.stderr
    assert "warning: evaluating with --max-episode-steps 50; the model was trained with 100" in other.stderr


def save_fresh_model(module, path: str, args):
    """An Atari script's save_model of an untrained network for Breakout's 4 actions; returns what
    it saved (the network, or the JAX script's parameters)."""
    if hasattr(module, "init_params"):  # the JAX script saves its agent bound to parameters
        import jax

        params = module.init_params(module.Agent(4), jax.random.key(0))
        module.save_model(path, module.Agent(4).bind(params), args)
        return params
    network = module.QNetwork(4) if hasattr(module, "QNetwork") else module.Agent(4)
    module.save_model(path, network, args)
    return network


def saved_model_path(script: str, cwd) -> str:
    """The one model a run of `script` in `cwd` saved (--save-model): `{script's name}.cleanrl_model` in
    its run's folder."""
    model_name = os.path.basename(script).removesuffix(".py") + ".cleanrl_model"
    (model_path,) = glob.glob(os.path.join(str(cwd), "runs", "*", model_name))
    return model_path


def train_and_save_a_model(script: str, *args: str, cwd, env: dict | None = None, timeout: int = 600):
    """A training run of `script` with `args` and --save-model in `cwd`: it exits 0 and saves one model.
    Returns (the run's CompletedProcess, the model's path)."""
    result = run_script(script, *args, "--save-model", cwd=cwd, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result, saved_model_path(script, cwd)


def evaluate_saved_model(script: str, model_path: str, num_games: int, cwd, env: dict | None = None):
    """`script --eval-checkpoint MODEL --eval-episodes NUM_GAMES` in `cwd`: it plays and prints that many
    games and their mean (assert_evaluation_printed). Returns the CompletedProcess."""
    result = run_script(script, "--eval-checkpoint", model_path, "--eval-episodes", str(num_games), cwd=cwd, env=env)
    assert_evaluation_printed(result, num_games)
    return result


def assert_evaluation_printed(result, num_games: int):
    """An evaluation run exited 0 and printed each game's return and the mean."""
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("eval_episode=") == num_games
    assert "eval: mean return" in result.stdout


def assert_tracked_evaluation_logs_under_the_models_env(
    script: str, model_path: str, model_env_id: str, other_env_id: str, folder, *args: str, env: dict | None = None
):
    """An evaluation of a saved model under --track, in a fresh folder, with another env id on the
    command line: it plays and prints its games, its run is named after the model's env (the game
    it played), and it reaches wandb (an offline run here)."""
    os.makedirs(folder)
    result = run_tracked(script, "--eval-checkpoint", model_path, "--env-id", other_env_id, *args, cwd=folder, env=env)
    assert result.stdout.count("eval_episode=") >= 1 and "eval: mean return" in result.stdout
    (run_dir,) = run_dirs(folder)
    assert os.path.basename(run_dir).startswith(f"{model_env_id.replace('/', '_')}__"), run_dir
    assert "eval/episodic_return" in read_scalars(run_dir)
    assert glob.glob(os.path.join(str(folder), "wandb", "offline-run-*")), "no wandb run under --track"
    return result


def assert_corrupt_checkpoint_rejected(script: str, tmp_path):
    """Evaluating a file that is no checkpoint is a one-line error, not a traceback."""
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    result = run_script(script, "--eval-checkpoint", "corrupt.cleanrl_model", cwd=tmp_path)
    assert_user_error(result, "not a readable")


def eval_returns(stdout: str) -> list[float]:
    """The returns an evaluation printed, one `eval_episode=i, episodic_return=R` line per episode."""
    return [float(x) for x in re.findall(r"eval_episode=\d+, episodic_return=(\S+)", stdout)]
