"""The SampleChunk schema, on chunks a real gymnasium vector env produced."""

import numpy as np
import pytest

from tianji_dask.acting import Acting
from tianji_dask.chunk import validate_chunk
from tianji_dask.envs.rollout import Rollout


class RandomPolicy(Acting):
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def act(self, obs, explore):
        n = len(obs)
        return self.rng.integers(0, 2, n), {"logp": np.full(n, -0.69, np.float32)}


@pytest.fixture(scope="module")
def chunks():
    rollout = Rollout("CartPole-v1", num_envs=4, seed=3)
    policy = RandomPolicy()
    out = [rollout.run(policy, 100, {}, policy_version=v, explorer_id=7) for v in range(3)]
    rollout.close()
    return out


def test_chunk_schema(chunks):
    c = chunks[0]
    validate_chunk(c)
    assert c["obs"].shape == (101, 4, 4) and c["obs"].dtype == np.float32
    assert c["actions"].shape == (100, 4)
    assert c["extra_logp"].shape == (100, 4)
    assert c["explorer_id"] == 7 and c["policy_version"] == 0
    assert c["env_steps"] == int(c["valid"].sum())
    assert c["nbytes"] == sum(v.nbytes for v in c.values() if isinstance(v, np.ndarray))
    assert c["t_start"] <= c["t_end"]


def test_reset_steps_are_not_transitions_and_episodes_add_up(chunks):
    for c in chunks:
        done = c["terminated"] | c["truncated"]
        # the step after an episode ends is gymnasium's autoreset step: invalid, reward 0
        assert not c["valid"][1:][done[:-1]].any()
        assert (c["rewards"][~c["valid"]] == 0).all()
    # random CartPole episodes end fast: every finished episode's return equals its length
    episodes = np.concatenate([c["episodes"] for c in chunks])
    assert len(episodes) > 10
    np.testing.assert_array_equal(episodes[:, 1], episodes[:, 2])


def test_episodes_continue_across_chunks(chunks):
    # the next chunk starts from where the previous one stopped
    np.testing.assert_array_equal(chunks[0]["obs"][-1], chunks[1]["obs"][0])


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("obs", np.zeros((101, 4, 4), np.float64), "chunk.obs: dtype"),
        ("rewards", np.zeros((99, 4), np.float32), "chunk.rewards: must have leading shape"),
        ("valid", np.zeros((100, 4), np.uint8), "chunk.valid: dtype must be bool"),
        ("env_steps", 3, "chunk.env_steps"),
        ("policy_version", -1, "chunk.policy_version"),
        ("episodes", np.zeros((2, 2)), "chunk.episodes"),
    ],
)
def test_schema_violations_are_named(chunks, field, value, message):
    bad = dict(chunks[0])
    bad[field] = value
    with pytest.raises(ValueError, match=message):
        validate_chunk(bad)


def test_missing_field_is_named(chunks):
    bad = dict(chunks[0])
    del bad["t_end"]
    with pytest.raises(ValueError, match="missing field 't_end'"):
        validate_chunk(bad)


@pytest.mark.parametrize("scale", [1, 64])  # packed into one buffer / above PACK_LIMIT: one pickle, arrays out of band
def test_chunk_travels_through_dask_serialization_intact(scale):
    """What the learner gets from Dask's (de)serialization is the chunk the explorer made: same
    type, fields, dtypes, shapes and values, arrays writable; a small chunk goes as one buffer."""
    from distributed.protocol import dumps, loads
    from distributed.protocol.serialize import to_serialize

    from tianji_dask.chunk import PACK_LIMIT, SampleChunk, make_chunk, validate_chunk

    t, n = 16, 4
    rng = np.random.default_rng(scale)
    chunk = make_chunk(obs=rng.standard_normal((t + 1, n, 8 * scale * scale), dtype=np.float32),
                       actions=rng.integers(0, 3, (t, n)), rewards=rng.standard_normal((t, n), dtype=np.float32),
                       terminated=rng.random((t, n)) < 0.1, truncated=np.zeros((t, n), bool), valid=np.ones((t, n), bool),
                       extras={"logp": rng.standard_normal((t, n), dtype=np.float32)}, explorer_id=3, policy_version=7,
                       t_start=1.0, t_end=2.0, episodes=[(1.5, 10.0, 10)])
    assert (chunk["nbytes"] <= PACK_LIMIT) == (scale == 1)
    frames = dumps({"data": to_serialize(chunk)})
    back = loads(frames)["data"]
    assert type(back) is SampleChunk and list(back) == list(chunk)
    for k, v in chunk.items():
        if isinstance(v, np.ndarray):
            assert back[k].dtype == v.dtype and back[k].shape == v.shape and np.array_equal(back[k], v), k
            assert back[k].flags.writeable, k
        else:
            assert back[k] == v and type(back[k]) is type(v), k
    validate_chunk(back)
    if scale == 1:  # one message header, the chunk's sub-header, its pickle and one buffer
        assert len(frames) == 4


def test_lunarlander_steps_into_valid_chunks_with_its_episodes_counted():
    from tianji_dask.algos import make_algorithm
    from tianji_dask.envs.vector import env_spaces

    algo = make_algorithm("ppo", *env_spaces("LunarLander-v3"), {}, seed=0)
    rollout = Rollout("LunarLander-v3", num_envs=4, seed=0)
    chunks = [rollout.run(algo, 250, {}, policy_version=0, explorer_id=0) for _ in range(2)]
    rollout.close()
    for c in chunks:
        validate_chunk(c)
        assert c["obs"].shape == (251, 4, 8) and c["actions"].dtype.kind == "i"
    # a random lander crashes within a few hundred steps: episodes ended, each one's length and
    # return the sum of its valid steps
    episodes = np.concatenate([c["episodes"] for c in chunks])
    assert len(episodes) >= 4 and (episodes[:, 2] > 0).all()
    assert episodes[:, 2].sum() <= sum(c["env_steps"] for c in chunks)
