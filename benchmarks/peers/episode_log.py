"""How a peer whose trainer keeps no per-episode record gives one: a gymnasium wrapper that
notes each episode's end time, return and length, and the reading back of episodes that env
processes appended to a shared file."""

from __future__ import annotations

import time


def recording(gym_module, on_end):
    """A wrapper class (of ``gym_module``'s ``Wrapper``: each peer's venv has its own gymnasium)
    calling ``on_end(return, length)`` as each episode ends."""

    class EpisodeLog(gym_module.Wrapper):
        def reset(self, **kwargs):
            self._ret, self._len = 0.0, 0
            return self.env.reset(**kwargs)

        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            self._ret += float(reward)
            self._len += 1
            if terminated or truncated:
                on_end(self._ret, self._len)
            return obs, reward, terminated, truncated, info

    return EpisodeLog


def append(path: str, ret: float, length: int) -> None:
    """One episode's line, appended (one short write: safe across processes)."""
    with open(path, "a") as fh:
        fh.write(f"{time.time():.6f} {ret} {length}\n")


def read_new(path: str, offset: int, episodes: list) -> int:
    """Append to ``episodes`` the (end time, return, length) of the whole lines written to ``path``
    since ``offset``; the offset to read on from."""
    with open(path) as fh:
        fh.seek(offset)
        text = fh.read()
    complete = text[: text.rfind("\n") + 1]
    for line in complete.splitlines():
        t, r, length = line.split()
        episodes.append((float(t), float(r), int(length)))
    return offset + len(complete)
