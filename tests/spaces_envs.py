"""Test envs for the spaces beyond Box and Discrete: MultiDiscrete actions, and a small Dict
observation with an action mask that DQN and PPO act on (pure numpy, fast)."""

import gymnasium as gym
import numpy as np


class MultiGuess(gym.Env):
    """Each step shows two codes, one-hot (3 + 4 floats); the action MultiDiscrete([3, 4]) names
    both, each right one scoring 0.5. Ten steps an episode: a policy that has learnt it returns 10,
    a random one about 2.9."""

    NVEC = (3, 4)

    def __init__(self, steps: int = 10):
        self.steps = steps
        self.observation_space = gym.spaces.Box(0.0, 1.0, (sum(self.NVEC),), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(self.NVEC)

    def _draw(self):
        self.codes = [int(self.np_random.integers(n)) for n in self.NVEC]
        obs = np.zeros(sum(self.NVEC), np.float32)
        obs[self.codes[0]] = obs[self.NVEC[0] + self.codes[1]] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        reward = 0.5 * float(int(action[0]) == self.codes[0]) + 0.5 * float(int(action[1]) == self.codes[1])
        self.t += 1
        return self._draw(), reward, self.t >= self.steps, False, {}


class MaskedPick(gym.Env):
    """A Dict observation: ``values`` (5 floats) and ``action_mask`` (5 int8, two to four ones);
    the reward is the value of the cell picked, 0 and the episode's end for a masked one. Eight steps."""

    def __init__(self, steps: int = 8):
        self.steps = steps
        self.observation_space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(5),
                                                  "values": gym.spaces.Box(0.0, 1.0, (5,), np.float32)})
        self.action_space = gym.spaces.Discrete(5)

    def _draw(self):
        self.values = self.np_random.random(5).astype(np.float32)
        self.mask = np.zeros(5, np.int8)
        self.mask[self.np_random.choice(5, size=int(self.np_random.integers(2, 5)), replace=False)] = 1
        return {"action_mask": self.mask.copy(), "values": self.values.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        legal = bool(self.mask[int(action)])
        reward = float(self.values[int(action)]) if legal else 0.0
        self.t += 1
        return self._draw(), reward, self.t >= self.steps or not legal, False, {}


SEEN = []  # the leaf names each dict_encoder call was given


def dict_encoder(obs_space):
    """An own encoder for a Dict space: each leaf flattened, concatenated, one linear layer."""
    import torch
    from torch import nn

    SEEN.append(list(obs_space.spaces))
    width = sum(int(np.prod(s.shape)) for s in obs_space.spaces.values())

    class Concat(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(width, 16)

        def forward(self, obs):
            return torch.relu(self.fc(torch.cat([obs[k].flatten(1) for k in sorted(obs)], 1)))

    return Concat(), 16


for name, cls in (("MultiGuess-v0", MultiGuess), ("MaskedPick-v0", MaskedPick)):
    if name not in gym.registry:
        gym.register(name, entry_point=cls)
