"""PettingZoo's tic-tac-toe as a single-agent gymnasium env with an action mask.

``TicTacToe-v0``: the agent plays X (PettingZoo's ``player_1``, who moves first) of
``pettingzoo.classic.tictactoe_v3`` against O, which completes a line of its own when it can,
else blocks one of X's, else plays a uniformly random legal move (``opponent: blocking``, the
default; ``opponent: random`` plays random legal moves only, a task too easy to tell policies
apart: most games are won in three moves).
The observation is PettingZoo's own Dict: ``observation`` (3, 3, 2) int8, the agent's and the
opponent's marks, and ``action_mask`` (9,) int8, the empty cells (PettingZoo's and Gymnasium's
mask convention, which the bundled algorithms read). Reward +1 for a win, -1 for a loss, 0 for
a draw; an illegal move (a taken cell) ends the game at -1, as PettingZoo's own wrapper rules.
A masked policy never plays one; an unmasked one must learn the rules from -1s first:
``env.kwargs: {action_mask: false}`` leaves the mask out of the observation (the board alone, from
which the legal moves can be learnt but are not given).

``optimal_return()`` is the best mean return any policy reaches against this opponent (expectimax
over the whole game tree): where the pipeline's target comes from. Importing this module registers
the id (``tianji_dask.envs.tictactoe:TicTacToe-v0``); it needs pettingzoo (``tianji-dask[marl]``).
Only gymnasium, numpy and pettingzoo are imported (the peers' benchmarks load this very file)."""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np

AGENT, OPPONENT = "player_1", "player_2"
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))


class TicTacToe(gym.Env):
    """X against a uniformly random O (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, action_mask: bool = True, opponent: str = "blocking"):
        if opponent not in OPPONENTS:
            raise ValueError(f"TicTacToe-v0: opponent {opponent!r}; allowed: {', '.join(OPPONENTS)}")
        self.opponent = opponent
        try:
            from pettingzoo.classic import tictactoe_v3
            from pettingzoo.utils.env_logger import EnvLogger
        except ImportError:
            raise ValueError("TicTacToe-v0: needs pettingzoo (pip install 'tianji-dask[marl]')") from None
        EnvLogger.suppress_output()  # an illegal move is the agent's to learn from, not a warning per game
        self.game = tictactoe_v3.env()
        self.with_mask = bool(action_mask)
        space = self.game.observation_space(AGENT)
        self.observation_space = space if self.with_mask else gym.spaces.Dict({"observation": space["observation"]})
        self.action_space = gym.spaces.Discrete(9)

    def _observe(self) -> dict:
        obs = {k: np.asarray(v, np.int8) for k, v in self.game.observe(AGENT).items()}
        self._mask = obs["action_mask"]
        return obs if self.with_mask else {"observation": obs["observation"]}

    def action_masks(self) -> np.ndarray:
        """The legal moves now, as bools (what sb3-contrib's MaskablePPO asks an env for)."""
        return self._mask.astype(bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.game.reset(seed=int(self.np_random.integers(2**31)))
        return self._observe(), {}

    def step(self, action):
        self.game.step(int(action))
        if not self.game.terminations[AGENT]:  # the opponent's reply
            seen = self.game.observe(OPPONENT)
            board = tuple(int(2 * o + x) for o, x in seen["observation"].reshape(9, 2))  # 1: X, 2: O
            self.game.step(int(self.np_random.choice(replies(board, self.opponent))))
        done = bool(self.game.terminations[AGENT] or self.game.truncations[AGENT])
        reward = float(self.game.rewards[AGENT])
        return self._observe(), reward, done, False, {}


OPPONENTS = ("blocking", "random")


def winner(board: tuple) -> int:
    """1 when X has a line, 2 when O has, else 0 (``board``: 9 cells, 0 empty, 1 X, 2 O)."""
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return 0


def replies(board: tuple, opponent: str) -> list[int]:
    """The moves O chooses among, uniformly: ``blocking`` those that win, else those that stop X
    winning next, else all legal ones; ``random`` all legal ones."""
    empty = [i for i in range(9) if not board[i]]
    if opponent == "blocking":
        for mark in (2, 1):
            hits = [i for i in empty if winner(board[:i] + (mark,) + board[i + 1:]) == mark]
            if hits:
                return hits
    return empty


def optimal_return(opponent: str = "blocking") -> float:
    """The best expected return of X against ``opponent``, from the empty board (expectimax)."""
    @functools.lru_cache(maxsize=None)
    def x_to_move(board: tuple) -> float:
        best = -1.0
        for cell in (i for i in range(9) if not board[i]):
            after = board[:cell] + (1,) + board[cell + 1:]
            if winner(after):
                return 1.0
            value = 0.0
            if not all(after):
                moves = replies(after, opponent)
                for reply in moves:
                    then = after[:reply] + (2,) + after[reply + 1:]
                    value += (-1.0 if winner(then) else 0.0 if all(then) else x_to_move(then)) / len(moves)
            best = max(best, value)
        return best

    return x_to_move((0,) * 9)


if "TicTacToe-v0" not in gym.registry:
    gym.register("TicTacToe-v0", entry_point=TicTacToe)
