"""Environments: gymnasium vector envs and their checks (``vector``), PettingZoo parallel envs as
one vector env (``marl``), stepping a vector env into chunks (``rollout``), whole episodes played
for an evaluation (``play``), and the simulated per-step cost of a slower env (``simulate``)."""
