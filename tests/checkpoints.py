"""Checkpoints and resume, through a script's public seams: `main(Args)`, its files, its output and
`lock_run`. Shared by the tests of the scripts that checkpoint."""

import dataclasses
import os
import re
import shutil
import threading
import time

import numpy as np
import torch
from running import assert_main_fails_with, read_scalars, run_dirs


def assert_run_resumes_where_its_checkpoint_left_it(
    module,
    tmp_path,
    monkeypatch,
    capsys,
    args: dict,
    extension: str = "pt",
    final_state_check=None,
    changed: tuple[str, object] = ("clip_coef", 0.2),
    loss_tag: str = "losses/value_loss",
) -> str:
    """A PPO script's run of 4 iterations with a checkpoint every 2 loses its last checkpoint (the machine
    went away after iteration 4 was logged, before its checkpoint was written). A second process cannot
    take the run over while the first holds it, nor a command with other hyperparameters; `--resume
    auto` goes on from iteration 2 in the run's own directory: every iteration logged once, the learning
    rate annealed over the whole run, no game twice, Adam's moments carried on, the same numbers when the
    same checkpoint is resumed again, and the weights of a
    checkpoint restored bit for bit (`final_state_check(checkpoint_path, model_path)`: the torch scripts'
    check by default; `extension`: the checkpoint files'). `changed`: a hyperparameter and another value of
    it, which the resume must refuse; `loss_tag`: a loss logged every iteration. Returns the resumed run's output."""
    monkeypatch.chdir(tmp_path)
    batch = args["num_envs"] * args["num_steps"]
    run = dict(args, total_timesteps=4 * batch, checkpoint_every=2)
    module.main(module.Args(**run))
    (run_dir,) = run_dirs(tmp_path)
    checkpoints = os.path.join(run_dir, "checkpoints")
    kept = [f"iteration-000000{i}.{extension}" for i in (2, 4)] + ["lock"]
    assert sorted(os.listdir(checkpoints)) == kept
    os.remove(os.path.join(checkpoints, f"iteration-0000004.{extension}"))
    capsys.readouterr()

    lock = module.lock_run(checkpoints)  # a process still running the run
    assert_main_fails_with(module.main, module.Args(**run, resume="auto"), "checkpoints is in use")
    lock.close()
    name, other_value = changed
    assert_main_fails_with(
        module.main,
        module.Args(**dict(run, **{name: other_value}), resume="auto"),
        f"the checkpoint's run has {name}={getattr(module.Args(**run), name)!r}",
    )
    missing = os.path.join(checkpoints, "iteration-0000009.pt")
    assert_main_fails_with(module.main, module.Args(**run, resume=missing), "no such checkpoint file")
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    assert_main_fails_with(module.main, module.Args(**run, resume="corrupt.pt"), "not a readable")

    module.main(module.Args(**run, resume="auto"))
    output = capsys.readouterr().out
    saved_at = re.escape(os.path.join(os.path.relpath(checkpoints, tmp_path), f"iteration-0000002.{extension}"))
    assert re.search(rf"resuming \S+ at step {2 * batch:,} from {saved_at}", output), output
    assert "has changed since the checkpoint" not in output
    assert f"finished 4 iterations, {4 * batch} steps" in output
    assert run_dirs(tmp_path) == [run_dir], "the resumed run goes on in its own directory"
    scalars = read_scalars(run_dir)
    iteration_steps = [batch * i for i in range(1, 5)]
    for tag in (loss_tag, "charts/learning_rate", "charts/SPS"):
        assert [step for step, _ in scalars[tag]] == iteration_steps, tag
    learning_rate = module.Args().learning_rate
    np.testing.assert_allclose(
        [value for _, value in scalars["charts/learning_rate"]],
        [learning_rate * (1 - i / 4) for i in range(4)],
        rtol=1e-6,
    )
    game_steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert game_steps, "the run finished games: their steps are checked"
    assert game_steps == sorted(set(game_steps)), "every game once, none of the first attempt's past iteration 2"
    assert sorted(os.listdir(checkpoints)) == kept

    # Resuming is deterministic: the same checkpoint resumed again logs the same games, losses and learning
    # rates, bit for bit (a run split over machines learns as one that never stopped would, given its resumes).
    # This time it checkpoints every iteration (how a run is saved may change): the checkpoint it resumed from
    # is removed at iteration 4, and the run, which copied everything out of it, holds none of it mapped.
    resumed_from = os.path.join(checkpoints, f"iteration-0000002.{extension}")
    shutil.copy2(resumed_from, tmp_path / "kept_checkpoint")
    mapped, watcher = mappings_once_removed(resumed_from)
    module.main(module.Args(**dict(run, checkpoint_every=1), resume=resumed_from))
    watcher.join(timeout=10)
    assert not watcher.is_alive() and mapped == [], "the removed checkpoint's disk space is held by the run"
    shutil.copy2(tmp_path / "kept_checkpoint", resumed_from)  # with its time: iteration 4's stays the newest
    output_again = capsys.readouterr().out
    assert re.search(rf"resuming \S+ at step {2 * batch:,} from \S+{saved_at}", output_again), output_again
    assert f"finished 4 iterations, {4 * batch} steps" in output_again
    again = read_scalars(run_dir)
    assert again.keys() == scalars.keys()
    for tag in scalars.keys() - {"charts/SPS"}:
        assert again[tag] == scalars[tag], tag

    # Resuming the finished run has nothing left to learn: the model it saves is the checkpoint's, bit for bit.
    module.main(module.Args(**run, resume="auto", save_model=True, eval_episodes=1))
    (model_path,) = [os.path.join(run_dir, f) for f in os.listdir(run_dir) if f.endswith(".cleanrl_model")]
    last = os.path.join(checkpoints, f"iteration-0000004.{extension}")
    (final_state_check or assert_torch_model_is_the_checkpoints)(last, model_path)
    return output


def assert_torch_model_is_the_checkpoints(checkpoint_path: str, model_path: str):
    """Adam went on counting from the checkpoint's updates, not from zero; the saved model is the
    checkpoint's weights, bit for bit."""
    last = torch.load(checkpoint_path, weights_only=True)
    updates = 4 * last["args"]["update_epochs"] * last["args"]["num_minibatches"]
    assert all(int(state["step"]) == updates for state in last["optimizer"]["state"].values())
    saved = torch.load(model_path, weights_only=True)["model"]
    for name, value in last["model"].items():
        assert torch.equal(saved[name], value), name


def assert_the_random_stream_goes_on_after_a_resume(module, folder, monkeypatch):
    """An on-policy Atari script draws as many numbers from torch's stream every iteration whatever the games
    (sampled actions or exploration coins, shuffled minibatches): a run resumed from its iteration-2
    checkpoint ends iteration 4 with the stream where the run that never stopped left it, not where a fresh
    start would."""
    monkeypatch.chdir(folder)
    args = dict(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1, cuda=False)
    run = module.Args(**args, total_timesteps=4 * 64, checkpoint_every=2)
    module.main(run)
    (run_dir,) = run_dirs(folder)
    last = os.path.join(run_dir, "checkpoints", "iteration-0000004.pt")
    uninterrupted = torch.load(last, weights_only=True)["rng_state"]["torch"]
    os.remove(last)
    module.main(dataclasses.replace(run, resume="auto"))
    assert torch.equal(torch.load(last, weights_only=True)["rng_state"]["torch"], uninterrupted)


def assert_the_newest_checkpoints_are_kept_by_their_number(module, folder, prefix: str, digits: int, extension="pt"):
    """save_checkpoint keeps the newest two checkpoints by the number in their names, also once the number
    outgrows the digits the names are padded to (as text, step-1000000000 sorts before step-999999999)."""
    numbers = [10**digits - 2, 10**digits - 1, 10**digits, 10**digits + 1]
    for number in numbers:
        module.save_checkpoint(
            str(folder), f"{prefix}-{number:0{digits}d}.{extension}", {"step": number}, module.Args(), "run"
        )
    assert sorted(os.listdir(folder)) == sorted(f"{prefix}-{number}.{extension}" for number in numbers[-2:])


def mappings_once_removed(path: str) -> tuple[list, threading.Thread]:
    """Watches from a thread for `path` to be removed, then lists this process's mappings of it (a
    memory-mapped file that is still mapped keeps its disk space)."""
    found = []

    def watch():
        while os.path.exists(path):
            time.sleep(0.005)
        with open("/proc/self/maps") as maps:
            found.extend(line for line in maps if os.path.basename(path) in line)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return found, thread
