"""The tasks and the systems benchmarks/suite.py runs, in the order its tables list them.

Tasks (``TASKS``: env id, algorithm, target; the task's name is also tianji_dask's bundled
pipeline's) are peers/tasks.py's, the file every peer's venv reads too. Systems:

- ``tianji`` (relaxed), ``tianji-lockstep``, ``tianji-single``: ``tianji-dask train TASK --mode ...``
  with the bundled pipeline;
- ``rllib``, ``sb3`` (``sb3-same``: with our pipeline's settings), ``cleanrl``, ``tianshou``:
  ``benchmarks/peers/run_peer.py`` in the peers' own virtual environment (``benchmarks/peers/setup``
  creates ``.peers-venv``). ``cleanrl`` runs the PPO tasks on CartPole and LunarLander, ``tianshou``
  those and the DQN ones; RLlib and SB3 every task, MinAtar Breakout included.
- ``sf`` (Sample Factory), ``pufferlib``, ``torchrl``: ``run_peer.py`` too, each in its own venv,
  ``.peers/<name>`` (``benchmarks/peers/setup sf|pufferlib|torchrl``), on the PPO tasks
  cartpole_ppo, lunarlander_ppo and hopper_ppo. Sample Factory and PufferLib pin gymnasium<1.0: they
  run LunarLander-v2 and Hopper-v4, and a run's ``env_id`` says so.
- ``tianji-v4``: tianji_dask (relaxed) with the task's pipeline on the gymnasium<1.0 env id those two
  run where tianji_dask's gymnasium still has it (``OURS_ON_OLDER_ENVS``: Hopper-v4 for hopper_ppo),
  a row beside theirs.
"""

from __future__ import annotations

from peers.tasks import TASKS  # the runner's tasks are the peers'

OURS = {"tianji": "relaxed", "tianji-lockstep": "lockstep", "tianji-single": "single"}
PEERS = ("rllib", "sb3", "sb3-same", "cleanrl", "tianshou")
#: peers each in their own venv, ``--peers-dir`` / <name>
OWN_VENV_PEERS = ("sf", "pufferlib", "torchrl")
#: tianji_dask on the env id of gymnasium<1.0 (Sample Factory's and PufferLib's): system -> (mode, task -> env id)
OURS_ON_OLDER_ENVS = {"tianji-v4": ("relaxed", {"hopper_ppo": "Hopper-v4"})}
SYSTEMS = (*OURS, *PEERS, *OWN_VENV_PEERS, *OURS_ON_OLDER_ENVS)
#: the system every other is compared with
REFERENCE = "tianji"


def system_rank(system: str) -> tuple:
    """tianji_dask first, then ``SYSTEMS``' order, then any other system by name."""
    return (SYSTEMS.index(system), "") if system in SYSTEMS else (len(SYSTEMS), system)


def task_rank(task: str) -> tuple:
    """``TASKS``' order, then any other task by name."""
    known = list(TASKS)
    return (known.index(task), "") if task in known else (len(known), task)
