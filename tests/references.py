"""Reference implementations of the math (GAE, the PPO loss, the TD target, DQN's schedules), written
plainly, and the checks that a script's own functions match them."""

import dataclasses
import math

import numpy as np


def reference_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """Textbook GAE, one env and one step at a time: A_t = sum_k (gamma*lambda)^k delta_{t+k},
    where the sum stops after the step that ends the episode. Plain Python floats."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        for t in range(num_steps):
            total, weight = 0.0, 1.0
            for k in range(t, num_steps):
                following = next_value[env] if k == num_steps - 1 else values[k + 1][env]
                alive = 1.0 - dones[k][env]
                delta = rewards[k][env] + gamma * following * alive - values[k][env]
                total += weight * delta
                if dones[k][env]:
                    break
                weight *= gamma * gae_lambda
            advantages[t][env] = total
    return advantages


def assert_gae_matches_reference(compute_gae, convert, dtype=np.float64, tolerance: float = 1e-10):
    """A script's compute_gae(rewards, values, dones, next_value, gamma, lambda), fed through
    `convert` (torch.tensor, jnp.asarray), against reference_gae on random data with several
    episode ends in the rollout; returns must be advantages + values."""
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(2, 16, 3)).astype(dtype)
    dones = (rng.random((16, 3)) < 0.2).astype(dtype)
    assert dones.sum() >= 5
    next_value = rng.normal(size=3).astype(dtype)
    advantages, returns = compute_gae(*map(convert, (rewards, values, dones, next_value)), 0.99, 0.95)
    expected = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), next_value.tolist(), 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(advantages), expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(np.asarray(returns), np.array(expected) + values, rtol=tolerance, atol=tolerance)


def reference_ppo_loss(
    newlogprob,
    entropy,
    newvalue,
    logprobs,
    advantages,
    returns,
    values,
    clip: float,
    ent_coef: float,
    vf_coef: float,
    norm_adv: bool,
    clip_vloss: bool,
) -> tuple[float, dict]:
    """The PPO objective of Schulman et al. (2017) on one minibatch, one sample at a time in plain
    Python floats: minus the clipped surrogate min(r A, clip(r, 1-e, 1+e) A), plus vf_coef times half
    the squared value error (with value clipping: the larger of the clipped and unclipped errors),
    minus ent_coef times the entropy; advantages standardized over the minibatch (unbiased std)."""
    n = len(newlogprob)
    if norm_adv:
        mean = sum(advantages) / n
        std = (sum((a - mean) ** 2 for a in advantages) / (n - 1)) ** 0.5
        advantages = [(a - mean) / (std + 1e-8) for a in advantages]
    surrogate = value_error = 0.0
    stats = dict(old_approx_kl=0.0, approx_kl=0.0, clipfrac=0.0)
    for i in range(n):
        ratio = math.exp(newlogprob[i] - logprobs[i])
        surrogate += min(ratio * advantages[i], min(max(ratio, 1 - clip), 1 + clip) * advantages[i])
        error = (newvalue[i] - returns[i]) ** 2
        if clip_vloss:
            clipped_value = values[i] + min(max(newvalue[i] - values[i], -clip), clip)
            error = max(error, (clipped_value - returns[i]) ** 2)
        value_error += 0.5 * error
        stats["old_approx_kl"] += -math.log(ratio) / n
        stats["approx_kl"] += (ratio - 1 - math.log(ratio)) / n
        stats["clipfrac"] += float(abs(ratio - 1) > clip) / n
    stats.update(policy_loss=-surrogate / n, value_loss=value_error / n, entropy=sum(entropy) / n)
    return stats["policy_loss"] - ent_coef * stats["entropy"] + vf_coef * stats["value_loss"], stats


def assert_ppo_loss_matches_reference(ppo_loss, default_args):
    """A script's ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)
    against reference_ppo_loss, with and without advantage normalization and value clipping, on
    random float64 data whose probability ratios and value changes fall on both sides of the clip."""
    import torch

    rng = np.random.default_rng(0)
    n = 64
    logprobs, values, returns, advantages = rng.normal(size=(4, n))
    newlogprob = logprobs + rng.uniform(-0.4, 0.4, n)  # ratios from 0.67 to 1.49 around clip 0.1-0.2
    newvalue = values + rng.uniform(-0.5, 0.5, n)
    entropy = rng.uniform(0.5, 1.5, n)
    for norm_adv in (True, False):
        for clip_vloss in (True, False):
            args = dataclasses.replace(default_args, norm_adv=norm_adv, clip_vloss=clip_vloss)
            inputs = (newlogprob, entropy, newvalue, logprobs, advantages, returns, values)
            loss, stats = ppo_loss(*(torch.tensor(x) for x in inputs), args)
            expected, expected_stats = reference_ppo_loss(
                *(x.tolist() for x in inputs), args.clip_coef, args.ent_coef, args.vf_coef, norm_adv, clip_vloss
            )
            assert 0.1 < expected_stats["clipfrac"] < 0.9, "the data reaches both sides of the clip"
            np.testing.assert_allclose(float(loss), expected, rtol=1e-12, err_msg=f"{norm_adv=} {clip_vloss=}")
            for name, value in expected_stats.items():
                np.testing.assert_allclose(float(stats[name]), value, rtol=1e-12, atol=1e-14, err_msg=name)


def reference_td_target(reward, terminated, truncated, next_q, gamma):
    """One transition, plain Python: a termination has no future; a truncation (time limit) does,
    and the replay memory holds its real last observation, so it is bootstrapped like any step."""
    del truncated  # changes nothing here: it only decides which observation s' is
    return reward if terminated else reward + gamma * max(next_q)


def assert_td_target_matches_reference(td_target):
    """A DQN script's td_target(rewards, dones, next_q_values, gamma), fed the done flags its replay
    memory stores (terminations only), against reference_td_target on every mix of the two masks."""
    import torch

    rng = np.random.default_rng(0)
    rewards, next_q = rng.normal(size=64), rng.normal(size=(64, 3))
    terminated, truncated = rng.random(64) < 0.3, rng.random(64) < 0.3
    assert (terminated & truncated).any() and (truncated & ~terminated).any() and (~terminated & ~truncated).any()
    target = td_target(torch.tensor(rewards), torch.tensor(terminated, dtype=torch.float64), torch.tensor(next_q), 0.9)
    expected = [reference_td_target(*row, 0.9) for row in zip(rewards, terminated, truncated, next_q.tolist())]
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-12, atol=1e-12)


def assert_td_target_bootstraps_from_the_target_network(module, memory_class: str, args, monkeypatch):
    """In a DQN script's training run, the next-state values of every TD target are the target
    network's on the sampled next observations, not the Q-network's. `args` never updates the
    target, and learns fast enough that the two networks differ from the first update on."""
    import torch

    networks, batches, checked = [], [], []

    class RecordedQNetwork(module.QNetwork):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            networks.append(self)

    memory = getattr(module, memory_class)

    class RecordedMemory(memory):
        def sample(self, *args, **kwargs):
            batches.append(super().sample(*args, **kwargs))
            return batches[-1]

    td_target = module.td_target

    def checked_td_target(rewards, dones, next_q_values, gamma):
        # after the first update, the Q-network is the one whose parameters hold gradients
        stepped = [net for net in networks if next(net.parameters()).grad is not None]
        if stepped:
            (q_network,) = stepped
            (target_network,) = [net for net in networks if net is not q_network]
            next_obs = batches[-1]["next_obs"]
            torch.testing.assert_close(next_q_values, target_network(next_obs), rtol=0, atol=0)
            assert not torch.allclose(next_q_values, q_network(next_obs)), "the networks differ after an update"
            checked.append(len(batches))
        return td_target(rewards, dones, next_q_values, gamma)

    monkeypatch.setattr(module, "QNetwork", RecordedQNetwork)
    monkeypatch.setattr(module, memory_class, RecordedMemory)
    monkeypatch.setattr(module, "td_target", checked_td_target)
    module.main(args)
    assert len(networks) == 2 and len(checked) == len(batches) - 1 >= 5, (len(networks), len(checked), len(batches))


def assert_linear_epsilon_schedule(linear_schedule):
    """linear_schedule(start_e, end_e, duration, t): a straight line, then flat at end_e."""
    assert linear_schedule(1.0, 0.05, 100, 0) == 1.0
    assert abs(linear_schedule(1.0, 0.05, 100, 50) - 0.525) < 1e-12
    assert linear_schedule(1.0, 0.05, 100, 100) == 0.05
    assert linear_schedule(1.0, 0.05, 100, 10**6) == 0.05
    assert linear_schedule(1.0, 0.05, 0, 0) == 0.05, "no exploration phase"


def assert_target_update_copies_or_averages(update_target, make_network):
    """update_target(target, online, tau): Polyak averaging below 1, an exact copy at 1."""
    import torch

    torch.manual_seed(0)
    online, target = make_network(), make_network()
    before = [p.clone() for p in target.parameters()]
    update_target(target, online, 0.25)
    for new, old, param in zip(target.parameters(), before, online.parameters()):
        torch.testing.assert_close(new, 0.25 * param + 0.75 * old)
    update_target(target, online, 1.0)
    for new, param in zip(target.parameters(), online.parameters()):
        torch.testing.assert_close(new, param, rtol=0, atol=0)
