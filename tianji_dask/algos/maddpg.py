"""MADDPG (Lowe et al. 2017) for cooperative multi-agent envs with Discrete actions.

Decentralised actors: agent i acts on its own observation. Centralised critics: Q_i sees every
agent's observation and one-hot action. Actions are discrete, so the actor's gradient goes
through a straight-through Gumbel-softmax sample of its logits, as in the paper's discrete
experiments. Exploration samples actions from each actor's softmax.

Observations are (n_agents, obs_dim) per env, actions one int per agent (a MultiDiscrete space
with the same number of actions for every agent). Each critic learns its own agent's reward,
read from the chunk's ``agent_rewards`` extra, or the team reward (``reward: team``).

One ``learn()`` updates every agent's critic and actor once on one minibatch, then moves the
target networks by ``tau``. The replay ratio is DQN's: once the replay holds ``learning_starts``
transitions, every env step ingested allows ``updates_per_env_step`` more updates.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from tianji_dask.algos.base import AlgoConfig, Algorithm
from tianji_dask.algos.models import PerAgentMLP
from tianji_dask.algos.optim import Adam
from tianji_dask.algos.weights import load_weights, seeded_init, snapshot, weights_of
from tianji_dask.algos.replay_buffer import ReplayBuffer, ReplayPacing, nstep_transitions


class MADDPGConfig(AlgoConfig):
    """Defaults follow the MADDPG paper's particle-env settings (gamma 0.95, tau 0.01, gradient
    clip 0.5, a small penalty on the actor's logits, two 64-unit layers) but with a learning rate
    of 1e-3 instead of 1e-2, minibatches of 256 instead of 1024 and an update every 4 env steps
    instead of every 100, so that simple_spread improves within a short run on a small CPU."""

    hidden: tuple[int, ...] = (64, 64)
    activation: Literal["relu", "tanh"] = "relu"
    gamma: float = Field(0.95, ge=0.0, le=1.0)
    n_step: int = Field(1, ge=1)
    actor_lr: float = Field(1e-3, gt=0.0)
    critic_lr: float = Field(1e-3, gt=0.0)
    batch_size: int = Field(256, ge=1)
    buffer_size: int = Field(100_000, ge=1)
    #: replay size (transitions) before the first update
    learning_starts: int = Field(1_000, ge=1)
    #: updates (each agent's critic and actor once) per env step ingested, past the warm-up
    updates_per_env_step: float = Field(0.25, gt=0.0)
    #: target networks move this fraction of the way to the online ones after every update
    tau: float = Field(0.01, gt=0.0, le=1.0)
    max_grad_norm: float | None = Field(0.5, gt=0.0)
    #: weight of the mean squared logits in the actor loss (keeps the softmax from saturating)
    logits_penalty: float = Field(1e-3, ge=0.0)
    gumbel_temperature: float = Field(1.0, gt=0.0)
    #: what each critic learns: its own agent's reward (the paper), or the team's, shared by all
    reward: Literal["agent", "team"] = "agent"
    #: include the replay contents in state_dict() (large; off: a resumed run refills it)
    checkpoint_replay: bool = False


def check_multiagent_spaces(obs_space, action_space) -> tuple[int, int, int]:
    """(n_agents, obs_dim, n_actions) of the spaces a multi-agent vector env reports."""
    import gymnasium as gym

    if not isinstance(action_space, gym.spaces.MultiDiscrete) or action_space.nvec.ndim != 1 \
            or len(set(action_space.nvec.tolist())) != 1:
        raise ValueError(f"MADDPG: needs one Discrete action per agent, all of one size (a multi-agent env "
                         f"such as mpe2:simple_spread_v3), got {action_space}")
    if not isinstance(obs_space, gym.spaces.Box) or obs_space.shape[:1] != action_space.shape or len(obs_space.shape) != 2:
        raise ValueError(f"MADDPG: needs observations (n_agents, obs_dim), got {obs_space}")
    return int(obs_space.shape[0]), int(obs_space.shape[1]), int(action_space.nvec[0])


class MADDPG(ReplayPacing, Algorithm):
    Config = MADDPGConfig
    on_policy = False

    def __init__(self, obs_space, action_space, config: MADDPGConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        c = config
        self.n_agents, obs_dim, self.n_actions = check_multiagent_spaces(obs_space, action_space)
        joint_dim = self.n_agents * (obs_dim + self.n_actions)

        def build():
            actor = PerAgentMLP(self.n_agents, obs_dim, c.hidden, self.n_actions, c.activation, out_gain=0.1)
            critic = PerAgentMLP(self.n_agents, joint_dim, c.hidden, 1, c.activation)
            target_actor = PerAgentMLP(self.n_agents, obs_dim, c.hidden, self.n_actions, c.activation)
            target_critic = PerAgentMLP(self.n_agents, joint_dim, c.hidden, 1, c.activation)
            target_actor.load_state_dict(actor.state_dict())
            target_critic.load_state_dict(critic.state_dict())
            return actor, critic, target_actor, target_critic

        self.actor, self.critic, self.target_actor, self.target_critic = seeded_init(seed, build)
        self.target_actor.requires_grad_(False)
        self.target_critic.requires_grad_(False)
        self.actor_optimizer = self.critic_optimizer = None  # learner side only: made on first learn()
        self.replay = ReplayBuffer(c.buffer_size, seed=seed + 1)  # allocates on first ingest
        self.rng = np.random.default_rng(seed)  # exploration on the explorer side
        self.gumbel = torch.Generator().manual_seed(seed + 2)  # the actor update's Gumbel noise
        self._init_pacing()  # env_steps, updates, update_credit: the replay ratio's books

    # ---- explorer side -------------------------------------------------------------------
    def exploration(self, env_steps: int, updates: int) -> dict:
        return {"sample": True}

    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions (N, n_agents): sampled from each actor's softmax when ``explore["sample"]``
        (what ``exploration()`` asks for), else each actor's most likely action."""
        # (N, n_agents, obs_dim) -> per-agent batches (n_agents, N, obs_dim) -> logits (n_agents, N, A)
        logits = self.actor.numpy_forward(np.ascontiguousarray(np.swapaxes(np.asarray(obs, np.float32), 0, 1)))
        if explore.get("sample", False):  # Gumbel-max: a sample from each actor's softmax
            logits = logits - np.log(-np.log(self.rng.random(logits.shape)))
        return logits.argmax(axis=2).T.copy(), {}

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.actor)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_weights(self.actor, weights)

    # ---- learner side --------------------------------------------------------------------
    def ingest(self, chunk: dict, staleness: int) -> int:
        c = self.config
        if c.reward == "agent":
            if "extra_agent_rewards" not in chunk:
                raise ValueError("MADDPG: reward 'agent' needs the chunk's agent_rewards extra (a multi-agent env); "
                                 "use reward: team otherwise")
            chunk = {**chunk, "rewards": chunk["extra_agent_rewards"]}
        else:  # every agent learns the team reward
            chunk = {**chunk, "rewards": np.repeat(chunk["rewards"][:, :, None], self.n_agents, axis=2)}
        batch = nstep_transitions(chunk, c.gamma, c.n_step)
        return self.store(batch)  # earns updates_per_env_step updates per env step past the warm-up

    def _make_optimizers(self) -> None:
        self.actor_optimizer = Adam(self.actor.parameters(), self.config.actor_lr)
        self.critic_optimizer = Adam(self.critic.parameters(), self.config.critic_lr)

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.actor_optimizer is None:
            self._make_optimizers()
        n, A = self.n_agents, self.n_actions
        idx = self.replay.sample_indices(c.batch_size)
        batch = {k: torch.from_numpy(v) for k, v in self.replay.gather(idx).items()}
        obs = batch["obs"].float()  # (B, n, obs_dim)
        next_obs = batch["next_obs"].float()
        actions = F.one_hot(batch["actions"].long(), A).float()  # (B, n, A)
        rewards = batch["rewards"].T  # (n, B): agent i's n-step return
        discounts = batch["discounts"]  # (B,): gamma**k, 0 after a terminal step
        # networks take (n, B, ...), row i for agent i; every critic sees all observations and actions
        seen_obs = obs.flatten(1).expand(n, -1, -1)  # (n, B, n * obs_dim)
        seen_next_obs = next_obs.flatten(1).expand(n, -1, -1)

        # critic: y_i = r_i + gamma^k * Q'_i(o', a'), a'_j sampled from target actor j (one-hot)
        with torch.no_grad():
            next_logits = self.target_actor(next_obs.transpose(0, 1))  # (n, B, A)
            next_actions = F.one_hot((next_logits + self.gumbel_noise(next_logits)).argmax(dim=2), A).float()
            seen_next_actions = next_actions.transpose(0, 1).flatten(1).expand(n, -1, -1)  # (n, B, n * A)
            q_next = self.target_critic(torch.cat([seen_next_obs, seen_next_actions], dim=2)).squeeze(2)
            y = rewards + discounts * q_next
        q = self.critic(torch.cat([seen_obs, actions.flatten(1).expand(n, -1, -1)], dim=2)).squeeze(2)  # (n, B)
        critic_loss = F.mse_loss(q, y, reduction="none").mean(dim=1).sum()  # each critic its own mean
        self.critic_optimizer.minimize(critic_loss, c.max_grad_norm)

        # actor i: maximise Q_i with its own action a straight-through Gumbel-softmax sample of its
        # logits and the other agents' actions as replayed
        logits = self.actor(obs.transpose(0, 1))  # (n, B, A)
        own = F.softmax((logits + self.gumbel_noise(logits)) / c.gumbel_temperature, dim=2)
        own = own + (F.one_hot(own.argmax(dim=2), A).float() - own).detach()  # hard forward, soft gradient
        own_slot = torch.eye(n, dtype=torch.bool)[:, None, :, None]  # agent i's slot in critic i's input
        mixed = torch.where(own_slot, own.unsqueeze(2), actions.unsqueeze(0)).flatten(2)  # (n, B, n * A)
        self.critic.requires_grad_(False)  # the actor loss trains the actors only: skip critic gradients
        q_pi = self.critic(torch.cat([seen_obs, mixed], dim=2)).squeeze(2)
        self.critic.requires_grad_(True)
        actor_loss = -q_pi.mean(dim=1).sum() + c.logits_penalty * logits.pow(2).mean(dim=(1, 2)).sum()
        self.actor_optimizer.minimize(actor_loss, c.max_grad_norm)

        self.update_targets()
        self.updates += 1
        self.update_credit -= 1.0
        return {"critic_loss": critic_loss.item() / n, "actor_loss": actor_loss.item() / n,
                "q_mean": q.detach().mean().item(), "samples": float(c.batch_size),
                "batch_policy_version": self.replay.mean_version(idx)}

    def gumbel_noise(self, like: torch.Tensor) -> torch.Tensor:
        """Standard Gumbel noise shaped like ``like``, from the algorithm's own generator."""
        return -torch.empty_like(like).exponential_(generator=self.gumbel).log()

    def update_targets(self) -> None:
        with torch.no_grad():
            for target, online in ((self.target_actor, self.actor), (self.target_critic, self.critic)):
                torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), self.config.tau)

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.actor_optimizer is None:
            self._make_optimizers()
        return {
            "actor": snapshot(self.actor),
            "critic": snapshot(self.critic),
            "target_actor": snapshot(self.target_actor),
            "target_critic": snapshot(self.target_critic),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "env_steps": self.env_steps,
            "updates": self.updates,
            "update_credit": self.update_credit,
            "env_steps_past_warmup": self.env_steps_past_warmup,
            "rng": self.rng.bit_generator.state,
            "gumbel": self.gumbel.get_state(),
            "replay": self.replay.state_dict(include_data=self.config.checkpoint_replay or self.include_replay),
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_actor.load_state_dict(state["target_actor"])
        self.target_critic.load_state_dict(state["target_critic"])
        self._make_optimizers()
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.update_credit = float(state["update_credit"])
        self.env_steps_past_warmup = int(state["env_steps_past_warmup"])
        self.rng.bit_generator.state = state["rng"]
        self.gumbel.set_state(state["gumbel"])
        self.replay.load_state_dict(state["replay"], missing_version=self.updates)  # as DQN's
