"""EnvPool as the explorers' backend (``env.backend: envpool``): its chunks against gymnasium's,
field by field, from states made equal; what cannot combine with it, one line at load; a short
training run. Skipped where envpool is not installed (but for the line that says how to install it)."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest
import yaml

from tianji_dask import Run
from tianji_dask.acting import Acting
from tianji_dask.config import parse_pipeline
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import EnvId, env_spaces
from tianji_dask.errors import PipelineError

needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="envpool is not installed")
N, T, CHUNKS, LIMIT = 8, 50, 3, 20  # a time limit of 20 steps: random CartPole episodes end both ways


class Replayed(Acting):
    """Acts a fixed sequence of actions, one (N,) row a step across chunks. Given the gymnasium
    rollout's env and EnvPool's frames, it first puts the envs whose observation is a reset one
    into the state EnvPool reset them to: each backend draws its reset states from its own seeds."""

    def __init__(self, actions, env=None, frames=None, reset_frames=None):
        self.actions, self.env, self.frames, self.reset_frames, self.t = actions, env, frames, reset_frames, 0

    def act(self, obs, explore):
        t, self.t = self.t, self.t + 1
        if self.env is not None and self.reset_frames[t].any():
            fresh = self.reset_frames[t]
            self.env.unwrapped.state[:, fresh] = self.frames[t][fresh].T.astype(np.float64)
        return self.actions[t], {}


def _reset_frames(chunks) -> np.ndarray:
    """(steps + 1, N): which frame of the whole stream is a reset observation: the one a reset
    step returned (frame t + 1 where valid[t] is False)."""
    valid = np.concatenate([c["valid"] for c in chunks])
    return np.concatenate([np.zeros((1, valid.shape[1]), bool), ~valid])


def _frames(chunks) -> np.ndarray:
    return np.concatenate([chunks[0]["obs"][:1], *[c["obs"][1:] for c in chunks]])


@needs_envpool
def test_envpool_chunks_match_gymnasiums_field_by_field_from_equal_states():
    kwargs = {"max_episode_steps": LIMIT}
    actions = np.random.default_rng(0).integers(0, 2, (CHUNKS * T, N))
    pool = Rollout(EnvId("CartPole-v1", backend="envpool"), N, seed=5, env_kwargs=kwargs)
    gym_ = Rollout("CartPole-v1", N, seed=5, env_kwargs=kwargs)
    ours = [pool.run(Replayed(actions[c * T:(c + 1) * T]), T, {}, policy_version=0, explorer_id=0) for c in range(CHUNKS)]
    frames, fresh = _frames(ours), _reset_frames(ours)
    gym_.env.unwrapped.state = ours[0]["obs"][0].T.astype(np.float64)  # start from EnvPool's first states
    gym_.obs = ours[0]["obs"][0].copy()
    policy = Replayed(actions, gym_.env, frames, fresh)
    theirs = [gym_.run(policy, T, {}, policy_version=0, explorer_id=0) for _ in range(CHUNKS)]

    assert set(ours[0]) == set(theirs[0])
    both_ways = 0
    for c, (a, b) in enumerate(zip(ours, theirs)):
        assert a["obs"].dtype == b["obs"].dtype == np.float32 and a["obs"].shape == b["obs"].shape == (T + 1, N, 4)
        # every frame but the reset observations (each backend's own seeds) is the same state, up to float rounding;
        # a truncated step's next frame is the true final observation in both
        same = ~fresh[c * T:(c + 1) * T + 1]
        np.testing.assert_allclose(a["obs"][same], b["obs"][same], atol=1e-5)
        for field in ("actions", "rewards", "valid"):
            np.testing.assert_array_equal(a[field], b[field], err_msg=field)
        # an episode that fails on its time limit's last step: gymnasium says terminated and truncated, EnvPool
        # only truncated (its gymnasium API reports terminated = done and not truncated)
        differ = (a["terminated"] != b["terminated"]) | (a["truncated"] != b["truncated"])
        assert (b["terminated"][differ] & b["truncated"][differ] & a["truncated"][differ] & ~a["terminated"][differ]).all()
        both_ways += int(differ.sum())
        np.testing.assert_array_equal(a["episodes"][:, 1:], b["episodes"][:, 1:])  # returns and lengths; not the times
        for stamp in ("env_steps", "explorer_id", "policy_version", "env_seed", "stream_serial", "nbytes"):
            assert a[stamp] == b[stamp], stamp
    ended = np.concatenate([c["terminated"] for c in theirs]), np.concatenate([c["truncated"] for c in theirs])
    assert ended[0].sum() > 10 and ended[1].sum() > 10 and fresh.sum() > 20  # both ways of ending, many resets
    assert both_ways <= 0.2 * ended[1].sum()
    pool.close()
    gym_.close()


@needs_envpool
def test_the_adapter_has_gymnasiums_spaces_seeding_and_autoreset():
    import gymnasium as gym

    from tianji_dask.envs.envpool_backend import EnvPoolVectorEnv

    env = EnvPoolVectorEnv("CartPole-v1", 4, seed=2**40)  # any int: EnvPool itself takes only int32 seeds
    assert env.metadata["autoreset_mode"] is gym.vector.AutoresetMode.NEXT_STEP
    assert env.observation_space.shape == (4, 4) and env.single_observation_space.shape == (4,)
    assert env.action_space.shape == (4,) and env.single_action_space == gym.spaces.Discrete(2)
    first = env.reset(seed=2**40)[0]
    np.testing.assert_array_equal(env.reset(seed=2**40)[0], first)  # a seeded reset is reproducible
    assert not np.allclose(env.reset(seed=3)[0], first) and not np.allclose(env.reset()[0], first)
    assert len({tuple(row) for row in first}) == 4  # each env its own seed
    env.close()
    assert env_spaces(EnvId("CartPole-v1", backend="envpool")) == env_spaces("CartPole-v1")


def _pipeline(env: dict) -> dict:
    return {"env": {"id": "CartPole-v1", "backend": "envpool", **env}, "algo": {"name": "ppo"},
            "stop": {"max_env_steps": 1000}}


REFUSED = [
    ({"id": "NoSuchGame-v0"}, "env.backend: envpool has no env 'NoSuchGame-v0'; allowed: one of its"),
    ({"id": "LunarLander-v9"}, "env.backend: envpool has no env 'LunarLander-v9' (did you mean LunarLander-v3"),
    ({"id": "tianji_dask.envs.dict_cartpole:cartpole_dict"}, "env.backend: envpool has no env"),
    ({"id": "Go9x9-v1"}, "env.backend: envpool's Go9x9-v1 is a game of 2 players; allowed with env.backend envpool: "
     "single-agent envs"),
    ({"id": "MiniGrid-DoorKey-5x5-v0"}, "env.backend: envpool's MiniGrid-DoorKey-5x5-v0 has a Dict observation space"),
    ({"wrappers": ["FlattenObservation"]}, "env.wrappers: EnvPool steps its own vector env, which has no single envs"),
    ({"register": "minatar.gym:register_envs"}, "env.register: EnvPool's ids need no registering"),
    ({"kwargs": {"sutton_barto_reward": True}}, "env.kwargs: envpool's CartPole-v1 takes no 'sutton_barto_reward'; "
     "allowed: num_threads, thread_affinity_offset, max_episode_steps, reward_threshold"),
    ({"kwargs": {"seed": 1}}, "env.kwargs: envpool's CartPole-v1 takes no 'seed'"),
    ({"explorer_kwargs": {1: {"step_cost_ms": 1, "num_envs": 2}}}, "env.kwargs: envpool's CartPole-v1 takes no 'num_envs'"),
    ({"kwargs": {"max_episode_steps": "long"}}, "env.kwargs.max_episode_steps: must be of type int for envpool's "
     "CartPole-v1 (default 500); got 'long'"),
    ({"backend": "gym"}, "env.backend: Input should be 'gymnasium' or 'envpool'"),
]


@needs_envpool
@pytest.mark.parametrize("env,message", REFUSED, ids=[m.partition(":")[2][:40] for _, m in REFUSED])
def test_what_cannot_combine_with_envpool_is_one_line_at_load(env, message):
    data = _pipeline(env)
    data["explorers"] = 2
    with pytest.raises(PipelineError) as err:
        parse_pipeline(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


@needs_envpool
def test_a_class_is_refused_and_the_cli_exits_2_without_a_traceback(tmp_path, capsys):
    from tianji_dask.cli import main
    from tianji_dask.envs.dict_cartpole import cartpole_dict

    with pytest.raises(PipelineError, match=r"^env.backend: envpool makes only its own ids, not a class or factory"):
        parse_pipeline(_pipeline({"id": cartpole_dict}))
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_pipeline({"id": "CartPole-v7"})))
    assert main(["train", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "env.backend: envpool has no env 'CartPole-v7'" in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_envpool_the_line_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool raises ImportError
    with pytest.raises(PipelineError) as err:
        parse_pipeline(_pipeline({}))
    assert str(err.value) == "env.backend: envpool is not installed; allowed: pip install 'tianji-dask[envpool]'"


@needs_envpool
def test_a_valid_pipeline_carries_the_backend_to_every_process():
    import cloudpickle

    p = parse_pipeline(_pipeline({"kwargs": {"max_episode_steps": 100}}))
    assert p.env.id == "CartPole-v1" and p.env.id.backend == "envpool"
    assert cloudpickle.loads(cloudpickle.dumps(p.env.id)).backend == "envpool"
    assert p.env.model_dump(mode="json")["backend"] == "envpool"


@needs_envpool
@pytest.mark.slow  # trains on the shared cluster
@pytest.mark.timeout(240)
def test_ppo_trains_on_envpool_on_the_cluster_and_replays_exactly(tianji_client, tmp_path):
    from tianji_dask.playback.exact_replay import replay

    results = Run("cartpole_ppo", tianji_client, out=tmp_path / "run", overrides={
        "env.backend": "envpool", "env.kwargs": {"num_threads": 1},  # an EnvPool key: gymnasium's CartPole would raise
        "stop.target_return": None, "stop.max_env_steps": 16_384, "stop.max_seconds": None}).start().wait()
    assert results["error"] is None and results["stop_reason"] == "max_env_steps", results
    assert results["env_errors"]["count"] == 0, results["env_errors"]
    assert results["updates"] >= 2 and results["episodes"] > 50 and results["env_steps"] >= 16_384
    assert results["provenance"]["versions"].get("envpool")
    assert replay(tmp_path / "run").same  # each stream's envs made again from their seeds: the same chunks
