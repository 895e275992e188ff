"""A CleanRL-style single-file PPO (after CleanRL's ``ppo.py``, discrete actions), as a peer for
benchmarks/suite.py. Imported by run_peer.py only.

What CleanRL's loop does, kept: a gymnasium SyncVectorEnv, GAE, epochs of shuffled minibatches,
clipped surrogate (0.2) and (optionally clipped) value loss, entropy and value coefficients, Adam
(eps 1e-5), optionally annealed linearly, gradient norm 0.5, advantage normalization, orthogonal
initialization, 64-64 tanh actor and critic. Episode returns come from RecordEpisodeStatistics, as
CleanRL logs them.

Settings by env (``CONFIGS``):

- CartPole-v1: CleanRL's ``ppo.py`` defaults, its classic-control settings (4 envs x 128 steps,
  GAE 0.99/0.95, 4 epochs of 4 minibatches, entropy 0.01, value 0.5, value clipping, lr 2.5e-4
  annealed over 500k steps).
- LunarLander-v3: CleanRL publishes no LunarLander settings (its PPO benchmarks are CartPole,
  Acrobot and MountainCar with ``ppo.py``'s defaults), so the settings of our
  ``pipelines/lunarlander_ppo.yaml`` (RL-Zoo's LunarLander PPO, one update a 4,096-step batch):
  16 envs x 256 steps, GAE 0.999/0.98, 4 epochs of 64 minibatches (of 64), lr 3e-4 not annealed,
  entropy 0.01, value 0.5, no value clipping (our pipeline's clip_vloss is off).
"""

from __future__ import annotations

import time

import numpy as np

CONFIG = {"num_envs": 4, "num_steps": 128, "learning_rate": 2.5e-4, "anneal_lr": True, "total_timesteps": 500_000,
          "gamma": 0.99, "gae_lambda": 0.95, "num_minibatches": 4, "update_epochs": 4, "norm_adv": True,
          "clip_coef": 0.2, "clip_vloss": True, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5}
CONFIGS = {
    "CartPole-v1": CONFIG,
    "LunarLander-v3": {**CONFIG, "num_envs": 16, "num_steps": 256, "learning_rate": 3e-4, "anneal_lr": False,
                       "gamma": 0.999, "gae_lambda": 0.98, "num_minibatches": 64, "update_epochs": 4,
                       "clip_vloss": False, "source": "pipelines/lunarlander_ppo.yaml (CleanRL has none)"},
}


def run(env_id: str, seed: int, record: dict, stop) -> None:
    """Train until ``stop(episodes)`` names a reason (tasks.stop_rule); episodes go to
    ``record["episodes"]`` as (end time, return, length)."""
    import gymnasium as gym
    import torch
    from torch import nn
    from torch.distributions import Categorical

    c = CONFIGS[env_id]
    torch.manual_seed(seed)
    np.random.seed(seed)

    def make(i):
        def thunk():
            return gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        return thunk

    envs = gym.vector.SyncVectorEnv([make(i) for i in range(c["num_envs"])],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def layer(i, o, std=np.sqrt(2)):
        lin = nn.Linear(i, o)
        nn.init.orthogonal_(lin.weight, std)
        nn.init.constant_(lin.bias, 0.0)
        return lin

    obs_dim, n_act = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
    actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_act, 0.01))
    params = list(critic.parameters()) + list(actor.parameters())
    opt = torch.optim.Adam(params, lr=c["learning_rate"], eps=1e-5)
    record.update(t_built=time.time(), config=dict(c))
    episodes = record["episodes"]

    n, T = c["num_envs"], c["num_steps"]
    batch = n * T
    minibatch = batch // c["num_minibatches"]
    num_updates = c["total_timesteps"] // batch
    obs_b = torch.zeros((T, n, obs_dim))
    act_b = torch.zeros((T, n), dtype=torch.long)
    logp_b, rew_b, done_b, val_b = (torch.zeros((T, n)) for _ in range(4))
    next_obs = torch.as_tensor(envs.reset(seed=seed)[0], dtype=torch.float32)
    next_done = torch.zeros(n)
    env_steps = 0
    update = 0
    while True:
        update += 1
        if c["anneal_lr"]:
            opt.param_groups[0]["lr"] = max(0.0, 1.0 - (update - 1.0) / num_updates) * c["learning_rate"]
        for t in range(T):
            obs_b[t], done_b[t] = next_obs, next_done
            with torch.no_grad():
                dist = Categorical(logits=actor(next_obs))
                action = dist.sample()
                val_b[t] = critic(next_obs).flatten()
            act_b[t], logp_b[t] = action, dist.log_prob(action)
            o, r, term, trunc, infos = envs.step(action.numpy())
            env_steps += n
            rew_b[t] = torch.as_tensor(r, dtype=torch.float32)
            next_obs = torch.as_tensor(o, dtype=torch.float32)
            next_done = torch.as_tensor(np.logical_or(term, trunc), dtype=torch.float32)
            # same-step autoreset: the finished episodes' statistics are in the final infos
            final = infos.get("final_info", infos)
            if "episode" in final:
                now = time.time()
                for i in np.flatnonzero(final["_episode"]):
                    episodes.append((now, float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
        record["stop_reason"] = stop(episodes)
        if record["stop_reason"] is not None:
            break
        with torch.no_grad():
            next_value = critic(next_obs).flatten()
            adv = torch.zeros_like(rew_b)
            last = 0
            for t in reversed(range(T)):
                nonterminal = 1.0 - (next_done if t == T - 1 else done_b[t + 1])
                nextv = next_value if t == T - 1 else val_b[t + 1]
                delta = rew_b[t] + c["gamma"] * nextv * nonterminal - val_b[t]
                adv[t] = last = delta + c["gamma"] * c["gae_lambda"] * nonterminal * last
            ret = adv + val_b
        b_obs, b_act, b_logp = obs_b.reshape(batch, obs_dim), act_b.reshape(-1), logp_b.reshape(-1)
        b_adv, b_ret, b_val = adv.reshape(-1), ret.reshape(-1), val_b.reshape(-1)
        idx = np.arange(batch)
        for _ in range(c["update_epochs"]):
            np.random.shuffle(idx)
            for start in range(0, batch, minibatch):
                mb = idx[start:start + minibatch]
                dist = Categorical(logits=actor(b_obs[mb]))
                ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                a = b_adv[mb]
                if c["norm_adv"]:
                    a = (a - a.mean()) / (a.std() + 1e-8)
                pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - c["clip_coef"], 1 + c["clip_coef"])).mean()
                v = critic(b_obs[mb]).flatten()
                if c["clip_vloss"]:
                    v_clipped = b_val[mb] + torch.clamp(v - b_val[mb], -c["clip_coef"], c["clip_coef"])
                    v_loss = 0.5 * torch.max((v - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((v - b_ret[mb]) ** 2).mean()
                loss = pg - c["ent_coef"] * dist.entropy().mean() + c["vf_coef"] * v_loss
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, c["max_grad_norm"])
                opt.step()
    record["env_steps"] = env_steps
    envs.close()
