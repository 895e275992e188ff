"""A researcher's own algorithm, written against the public interface only: a clipped policy
gradient with a learned value baseline (GAE) for Discrete actions and flat observations. The
tests train it as ``labalgos.clipped_pg:ClippedPG`` (importable) and as a class defined in a
``__main__`` (not importable by the workers); docs/extending.md walks through the same code."""

import numpy as np
import torch
from torch import nn

from tianji_dask import AlgoConfig, Algorithm


class ClippedPGConfig(AlgoConfig):
    hidden: int = 64
    lr: float = 5e-3
    gamma: float = 0.99
    lam: float = 0.95
    epochs: int = 2
    minibatches: int = 8
    clip: float = 0.2
    ent_coef: float = 0.01
    max_lag: int = 1  # chunks from a policy more versions old than this are dropped


def mlp(n_in: int, hidden: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out))


class ClippedPG(Algorithm):
    Config = ClippedPGConfig
    on_policy = True

    def __init__(self, obs_space, action_space, config: ClippedPGConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        n_obs = int(np.prod(obs_space.shape))
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.policy = mlp(n_obs, config.hidden, int(action_space.n))
            self.value = mlp(n_obs, config.hidden, 1)
        self.optimizer = torch.optim.Adam([*self.policy.parameters(), *self.value.parameters()], lr=config.lr)
        self.rng = np.random.default_rng(seed)  # the base class's seed_acting reseeds it
        self.batch: list[dict] = []

    # ---- explorer side ------------------------------------------------------------------
    def act(self, obs, explore):
        with torch.no_grad():
            logp = torch.log_softmax(self.policy(torch.as_tensor(obs, dtype=torch.float32).flatten(1)), -1).numpy()
        if explore.get("greedy"):
            actions = logp.argmax(1)
        else:  # a sample from the policy: argmax of log-probabilities plus Gumbel noise
            actions = (logp + self.rng.gumbel(size=logp.shape)).argmax(1)
        return actions, {"logprob": logp[np.arange(len(actions)), actions].astype(np.float32)}

    def get_weights(self):
        return {k: v.detach().cpu().numpy().copy() for k, v in self.policy.state_dict().items()}

    def set_weights(self, weights):
        self.policy.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})

    # ---- learner side -------------------------------------------------------------------
    def accepts(self, staleness):
        return staleness <= self.config.max_lag

    def ingest(self, chunk, staleness):
        if not self.accepts(staleness):
            return 0
        self.batch.append(chunk)
        return int(chunk["env_steps"])

    def ready(self):
        return len(self.batch) >= 1

    def _advantages(self, chunk):
        """GAE over one chunk: obs holds T+1 frames; a truncated step bootstraps from its final
        observation, a terminated one does not; invalid (autoreset) steps get none."""
        c = self.config
        T, N = chunk["rewards"].shape
        obs = torch.as_tensor(chunk["obs"], dtype=torch.float32).reshape(T + 1, N, -1)
        with torch.no_grad():
            values = self.value(obs).squeeze(-1).numpy()
        term, ends = chunk["terminated"].astype(np.float32), (chunk["terminated"] | chunk["truncated"]).astype(np.float32)
        adv, running = np.zeros((T, N), np.float32), np.zeros(N, np.float32)
        for t in reversed(range(T)):
            delta = chunk["rewards"][t] + c.gamma * values[t + 1] * (1 - term[t]) - values[t]
            running = np.where(chunk["valid"][t], delta + c.gamma * c.lam * (1 - ends[t]) * running, 0.0)
            adv[t] = running
        valid = chunk["valid"]
        return obs[:T][valid], chunk["actions"][valid], chunk["extra_logprob"][valid], adv[valid], (adv + values[:T])[valid]

    def learn(self):
        c = self.config
        parts = [self._advantages(chunk) for chunk in self.batch]
        self.batch = []
        obs = torch.cat([p[0] for p in parts])
        actions, old_logp, adv, ret = (torch.as_tensor(np.concatenate([p[i] for p in parts])) for i in range(1, 5))
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        n = len(obs)
        for _ in range(c.epochs):
            for idx in torch.randperm(n).chunk(c.minibatches):
                logits = self.policy(obs[idx])
                logp_all = torch.log_softmax(logits, -1)
                logp = logp_all.gather(1, actions[idx].long()[:, None]).squeeze(1)
                ratio = torch.exp(logp - old_logp[idx])
                pg = -torch.min(ratio * adv[idx], ratio.clamp(1 - c.clip, 1 + c.clip) * adv[idx]).mean()
                v_loss = 0.5 * ((self.value(obs[idx]).squeeze(-1) - ret[idx]) ** 2).mean()
                entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
                loss = pg + 0.5 * v_loss - c.ent_coef * entropy
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_([*self.policy.parameters(), *self.value.parameters()], 0.5)
                self.optimizer.step()
        return {"samples": float(n), "policy_loss": pg.item(), "value_loss": v_loss.item(), "entropy": entropy.item()}

    def state_dict(self):
        return {"policy": self.policy.state_dict(), "value": self.value.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state):
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.optimizer.load_state_dict(state["optimizer"])
