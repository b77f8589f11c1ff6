"""What a trained ppo_atari.py agent does in fresh games, and whether its critic predicts what it gets.

Issue 29 asks, for a run that ends below CleanRL's published figure, to check life loss and truncation
on long games and the value targets. This tool plays new games with the policy of a checkpoint
(sampled actions, as in training, on seeds training never used) and prints four blocks:
  games   - whole games (all lives, unclipped score): mean and median score, median and longest
            length in agent steps, and how many hit the time limit (--max-episode-steps, 27,000 by
            default: cut there and bootstrapped in training, not a loss)
  critic  - V(s) against the discounted clipped return G the training loop's targets estimate: rewards
            clipped to their sign, the episode ended by a lost life (the game goes on) or the game's
            end, a time limit bootstrapped with gamma * V(last observation). Bias (mean V - mean G),
            correlation and explained variance 1 - Var(G - V) / Var(G) over every step played
  waits   - after a lost life the ball is served only when the agent presses FIRE: how many steps
            it waits (median, 95th percentile, longest). A policy that never fires again stalls until
            the time limit
  actions - how often the agent chose each action, by the game's names for them
  cut     - each game the time limit cut: its score, the lives it lost before the cut, and the steps
            since its last point (a long scoreless tail with lives left is a ball the agent keeps in
            play without hitting anything; a tail that starts at a lost life is a serve it never makes)

It uses the script's own `make_envs` and `Agent` (imported from its file) with the emulator settings of
the checkpoint's run. A checkpoint is a training checkpoint (runs/*/checkpoints/*.pt) or a model saved
with --save-model.

    python benchmark/critic_check.py runs/RUN/checkpoints/iteration-0009750.pt --games 16
    python benchmark/critic_check.py MODEL.pt --games 4 --json critic.json
"""

import argparse
import importlib
import json
import os
import sys

import ale_py
import gymnasium as gym
import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.run import fail  # noqa: E402  (the tools' one-line user error)


def load_script():
    """cleanrl/ppo_atari.py as a module, as benchmark/throughput.py loads the scripts."""
    return importlib.import_module("cleanrl.ppo_atari")


def discounted_returns(rewards: np.ndarray, ends: np.ndarray, bootstrap: float, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1} over one game's steps, where an episode that ends at step t (a lost
    life or the game's end) gives G_t = r_t. `bootstrap` is what follows the last step: V(last
    observation) when a time limit cut the game, as the training loop bootstraps it, else unused."""
    returns = np.zeros(len(rewards), dtype=np.float64)
    following = bootstrap
    for t in reversed(range(len(rewards))):
        following = rewards[t] + gamma * following * (1.0 - ends[t])
        returns[t] = following
    return returns


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    variance = np.var(returns)
    return float("nan") if variance == 0 else float(1.0 - np.var(returns - values) / variance)


def play(module, agent, env_id: str, games: int, saved_args: dict, seed: int, names: list[str], device) -> dict:
    """Plays `games` whole games, a fixed quota per env (keeping the first games to finish would favour
    short ones); returns, per game: score, length, truncated, the values, the returns, the waits, the lives
    lost before the game ended and the steps since its last point."""
    num_envs = min(8, games)
    quota = [games // num_envs + (i < games % num_envs) for i in range(num_envs)]
    max_steps = saved_args.get("max_episode_steps", 27_000)
    envs = module.make_envs(env_id, num_envs, saved_args.get("repeat_action_probability", 0.0), max_steps)
    gamma = saved_args.get("gamma", 0.99)
    fire = names.index("FIRE") if "FIRE" in names else None  # a game without FIRE has no waits

    # One record per env for the game it is playing.
    def new_record():
        return {
            "values": [],
            "rewards": [],
            "ends": [],
            "score": 0.0,
            "waits": [],
            "lost_at": None,
            "lives_lost": 0,
            "last_point": -1,
        }

    records = [new_record() for _ in range(num_envs)]
    finished = [[] for _ in range(num_envs)]
    action_counts = np.zeros(int(envs.single_action_space.n), dtype=np.int64)

    obs, info = envs.reset(seed=seed)
    lives = info["lives"].copy()
    while any(len(f) < q for f, q in zip(finished, quota)):
        with torch.inference_mode():
            action, _, _, value = agent.get_action_and_value(torch.from_numpy(obs).to(device))
        action, value = action.cpu().numpy(), value.flatten().cpu().numpy()
        obs, reward, terminated, truncated, info = envs.step(action)
        life_lost = info["lives"] < lives
        lives = info["lives"].copy()
        game_over = terminated | truncated
        for i in range(num_envs):
            if len(finished[i]) >= quota[i]:
                continue  # this env has played its games; what it plays now is not counted
            record = records[i]
            action_counts[action[i]] += 1
            step = len(record["values"])
            if record["lost_at"] is not None and action[i] == fire:
                record["waits"].append(step - record["lost_at"])
                record["lost_at"] = None
            record["values"].append(value[i])
            record["rewards"].append(np.sign(reward[i]))
            record["ends"].append(bool(terminated[i] or life_lost[i]))
            record["score"] += float(reward[i])
            if reward[i] != 0:
                record["last_point"] = step
            if life_lost[i] and not game_over[i]:
                record["lives_lost"] += 1
                record["lost_at"] = step + 1  # the first step the agent can serve again
            if game_over[i]:
                bootstrap = 0.0
                if truncated[i] and not terminated[i]:
                    with torch.inference_mode():
                        final = torch.from_numpy(info["final_obs"][i : i + 1]).to(device)
                        bootstrap = float(agent.get_value(final).item())
                rewards, ends = np.array(record["rewards"]), np.array(record["ends"], dtype=np.float64)
                finished[i].append(
                    {
                        "score": record["score"],
                        "length": len(rewards),
                        "truncated": bool(truncated[i] and not terminated[i]),
                        "values": np.array(record["values"], dtype=np.float64),
                        "returns": discounted_returns(rewards, ends, bootstrap, gamma),
                        "waits": record["waits"],
                        "lives_lost": record["lives_lost"],
                        "steps_since_point": len(rewards) - 1 - record["last_point"],
                    }
                )
                records[i] = new_record()
    envs.close()
    return {"games": [g for env_games in finished for g in env_games], "action_counts": action_counts}


def action_names(env_id: str) -> list[str]:
    gym.register_envs(ale_py)
    env = gym.make(env_id)
    try:
        return list(env.unwrapped.get_action_meanings())
    finally:
        env.close()


def summarize(played: dict, names: list[str], max_steps: int) -> dict:
    games = played["games"]
    scores = np.array([g["score"] for g in games])
    lengths = np.array([g["length"] for g in games])
    values = np.concatenate([g["values"] for g in games])
    returns = np.concatenate([g["returns"] for g in games])
    waits = np.array([w for g in games for w in g["waits"]])
    counts = played["action_counts"]
    return {
        "games": {
            "count": len(games),
            "score_mean": float(scores.mean()),
            "score_median": float(np.median(scores)),
            "length_median": float(np.median(lengths)),
            "length_longest": int(lengths.max()),
            "at_time_limit": sum(g["truncated"] for g in games),
            "time_limit": max_steps,
        },
        "critic": {
            "steps": len(values),
            "mean_value": float(values.mean()),
            "mean_return": float(returns.mean()),
            "bias": float(values.mean() - returns.mean()),
            "correlation": float(np.corrcoef(values, returns)[0, 1]) if len(values) > 1 else float("nan"),
            "explained_variance": explained_variance(values, returns),
        },
        "waits": {
            "lost_lives_served": len(waits),
            "median": float(np.median(waits)) if len(waits) else None,
            "p95": float(np.percentile(waits, 95)) if len(waits) else None,
            "longest": int(waits.max()) if len(waits) else None,
        },
        "actions": {name: float(n / counts.sum()) for name, n in zip(names, counts)},
        "cut": [
            {"score": g["score"], "lives_lost": g["lives_lost"], "steps_since_point": g["steps_since_point"]}
            for g in games
            if g["truncated"]
        ],
    }


def report(summary: dict, checkpoint: str, step) -> str:
    g, c, w = summary["games"], summary["critic"], summary["waits"]
    at = f" ({step:,} steps)" if step is not None else ""
    lines = [
        f"checkpoint {checkpoint}{at}",
        f"games: {g['count']}, score mean {g['score_mean']:.1f}, median {g['score_median']:.1f}; length median "
        f"{g['length_median']:.0f}, longest {g['length_longest']:,}; {g['at_time_limit']} at the "
        f"{g['time_limit']:,}-step time limit",
        f"critic: {c['steps']:,} steps, mean V {c['mean_value']:.3f}, mean G {c['mean_return']:.3f}, bias "
        f"{c['bias']:+.3f}, correlation {c['correlation']:.3f}, explained variance {c['explained_variance']:.3f}",
    ]
    if w["lost_lives_served"]:
        lines.append(
            f"waits: {w['lost_lives_served']} lost lives served again, FIRE after median {w['median']:.0f} steps "
            f"(95th percentile {w['p95']:.0f}, longest {w['longest']})"
        )
    else:
        lines.append("waits: no lost life was served again within the games")
    lines.append("actions: " + ", ".join(f"{name} {share:.1%}" for name, share in summary["actions"].items()))
    for game in summary["cut"]:
        lines.append(
            f"cut at the time limit: score {game['score']:.0f}, {game['lives_lost']} lives lost before the cut, "
            f"{game['steps_since_point']:,} steps since its last point"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a ppo_atari.py training checkpoint or a model saved with --save-model")
    parser.add_argument("--games", type=int, default=16, help="whole games to play (8 at a time)")
    parser.add_argument("--seed", type=int, default=10_000, help="the first env's seed (training's are seed + k)")
    parser.add_argument("--max-episode-steps", type=int, default=None, help="time limit (default: the run's)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    options = parser.parse_args()
    if options.games < 1:
        fail(f"--games must be at least 1, got {options.games}")
    if not os.path.isfile(options.checkpoint):
        fail(f"checkpoint {options.checkpoint!r} does not exist")
    try:
        payload = torch.load(options.checkpoint, map_location="cpu", weights_only=True)
        state, saved_args = payload["model"], dict(payload["args"])
    except Exception as e:  # an unreadable or foreign file is the same user error
        fail(f"{options.checkpoint!r} is not a readable ppo_atari.py checkpoint or model ({type(e).__name__})")

    torch.set_num_threads(1)
    torch.manual_seed(options.seed)  # the sampled actions: the same games every time
    module = load_script()
    device = torch.device("cpu")
    agent = module.Agent(int(state["actor.weight"].shape[0])).to(memory_format=torch.channels_last)
    agent.load_state_dict(state)
    if options.max_episode_steps is not None:
        saved_args["max_episode_steps"] = options.max_episode_steps
    env_id = saved_args["env_id"]
    names = action_names(env_id)
    played = play(module, agent, env_id, options.games, saved_args, options.seed, names, device)
    summary = summarize(played, names, saved_args.get("max_episode_steps", 27_000))
    print(report(summary, options.checkpoint, payload.get("global_step")), flush=True)
    if options.json:
        with open(options.json, "w") as f:
            json.dump(
                {"checkpoint": options.checkpoint, "global_step": payload.get("global_step"), **summary}, f, indent=2
            )


if __name__ == "__main__":
    main()
