"""benchmark/critic_check.py, the look at a trained Atari agent's games and critic (issue 29): the returns
its critic is compared with, a whole run on an untrained model, its bad input."""

import json

import numpy as np
import pytest
from evaluation import save_fresh_model
from running import assert_user_error, run_tool

from benchmark.critic_check import discounted_returns, load_script


def test_returns_end_at_a_lost_life_and_bootstrap_a_time_limit():
    # Four steps, a life lost at step 1 (the game goes on), the game cut by the time limit after step 3
    # with V(last observation) = 2. With gamma 0.5: G3 = 1 + 0.5 * 2, G2 = 1 + 0.5 * G3, G1 = 0 (the
    # episode ends there), G0 = 1 + 0.5 * G1. Without the cut at the lost life G0 would be 1.5 and G1 1.
    returns = discounted_returns(np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0, 0.0]), 2.0, 0.5)
    np.testing.assert_allclose(returns, [1.0, 0.0, 2.0, 2.0])
    # A game that ended (the last step ends its episode) takes nothing from the bootstrap.
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 1.0]), np.array([0.0, 1.0]), 5.0, 0.5), [1.5, 1.0])


@pytest.fixture
def untrained_model(tmp_path) -> str:
    """A freshly initialized ppo_atari.py Breakout model, saved as --save-model saves one."""
    module = load_script()
    save_fresh_model(module, str(tmp_path / "model.pt"), module.Args(env_id="BreakoutNoFrameskip-v4"))
    return str(tmp_path / "model.pt")


def test_plays_an_untrained_model_and_reports_games_critic_waits_and_actions(tmp_path, untrained_model):
    result = run_tool(
        "critic_check.py",
        untrained_model,
        "--games",
        "2",
        "--max-episode-steps",
        "150",
        "--json",
        str(tmp_path / "critic.json"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    for block in ("games: 2,", "critic:", "waits:", "actions: NOOP"):
        assert block in result.stdout, result.stdout
    summary = json.loads((tmp_path / "critic.json").read_text())
    assert summary["games"]["count"] == 2
    assert summary["games"]["length_longest"] <= 150
    assert summary["games"]["at_time_limit"] == (summary["games"]["length_longest"] == 150) + (
        summary["games"]["length_median"] == 150
    )
    assert 0 < summary["critic"]["steps"] <= 300
    # Each game the limit cut is listed: its lives lost, and its steps since the last point (all 150 of
    # them in a game without a point).
    assert len(summary["cut"]) == summary["games"]["at_time_limit"]
    for game in summary["cut"]:
        assert 0 <= game["lives_lost"] <= 4 and 0 <= game["steps_since_point"] <= 150
        assert game["score"] > 0 or game["steps_since_point"] == 150
        assert f"score {game['score']:.0f}, {game['lives_lost']} lives lost" in result.stdout
    assert set(summary["actions"]) == {"NOOP", "FIRE", "RIGHT", "LEFT"}
    assert sum(summary["actions"].values()) == pytest.approx(1.0)


def test_a_game_cut_before_its_first_point_is_listed_with_every_step_since_its_last_point(tmp_path, untrained_model):
    # 20 agent steps hold the serve and the ball's first flight: no brick is hit, no life is lost.
    result = run_tool("critic_check.py", untrained_model, "--games", "1", "--max-episode-steps", "20", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "cut at the time limit: score 0, 0 lives lost before the cut, 20 steps since its last point" in result.stdout


def test_a_missing_or_foreign_checkpoint_is_a_one_line_error(tmp_path):
    assert_user_error(run_tool("critic_check.py", str(tmp_path / "none.pt"), cwd=tmp_path), "does not exist")
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    assert_user_error(run_tool("critic_check.py", str(tmp_path / "notes.pt"), cwd=tmp_path), "not a readable")
