"""One PPO update as the PPO scripts run it, on the data it is given: the network work that
benchmark/throughput.py (the Atari scripts) and benchmark/serial_bound.py (ppo_continuous_action.py)
time against the scripts' own runs."""

import contextlib

import torch


def ppo_update(module, agent, optimizer, args, batch: tuple, autocast=contextlib.nullcontext):
    """An iteration's update: args.update_epochs epochs over `batch` (obs, actions, logprobs, advantages,
    returns, values), each in shuffled minibatches (args.num_minibatches of them): the agent's forward
    (under autocast()), the script's ppo_loss, backward, the gradients clipped at args.max_grad_norm, a step
    of the optimizer."""
    obs, actions, logprobs, advantages, returns, values = batch
    batch_size = len(obs)
    minibatch_size = batch_size // args.num_minibatches
    for _ in range(args.update_epochs):
        inds = torch.randperm(batch_size)
        for start in range(0, batch_size, minibatch_size):
            mb = inds[start : start + minibatch_size]
            with autocast():
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs[mb], actions[mb])
            loss, _ = module.ppo_loss(
                newlogprob, entropy, newvalue, logprobs[mb], advantages[mb], returns[mb], values[mb], args
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
