"""Dict and Tuple observations, MultiDiscrete and MultiBinary actions, and action masks: a chunk
keeps each observation leaf as its own field (pickled as one buffer, on the direct wire, in the
replay, leaf by leaf); the multi-input encoder and the action heads against direct computations;
masks in acting, losses and targets; PPO learning a Dict task and a MultiDiscrete one; the masked
pipeline on the embedded cluster; export; ``check_algorithm``; one-line refusals."""

from __future__ import annotations

import json
import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import spaces_envs  # noqa: F401 - registers MultiGuess-v0 and MaskedPick-v0
from tianji_dask.algos import make_algorithm
from tianji_dask.algos.heads import MASKED, ActionHeads, sample_categorical
from tianji_dask.algos.multi_input import DictObs
from tianji_dask.algos.replay_buffer import ReplayBuffer, nstep_transitions
from tianji_dask.chunk import obs_leaves, observations, validate_chunk
from tianji_dask.dataflow.direct.wire import decode, encode
from tianji_dask.envs.rollout import Rollout
from tianji_dask.run import Run
from tianji_dask.testing import check_algorithm

S = gym.spaces
PICK = "spaces_envs:MaskedPick-v0"
GUESS = "spaces_envs:MultiGuess-v0"
CARTPOLE_DICT = "tianji_dask.envs.dict_cartpole:CartPoleDict-v1"
NESTED = S.Dict({"pos": S.Dict({"x": S.Box(-1, 1, (2,), np.float32), "k": S.Discrete(3, start=1)}),
                 "pair": S.Tuple((S.MultiDiscrete([2, 3]), S.MultiBinary(2))),
                 "grid": S.Box(0, 1, (10, 10, 2), np.bool_)})


def _chunk(env_id=PICK, algo="ppo", steps=16, n=4, config=None):
    rollout = Rollout(env_id, n, seed=3)
    policy = make_algorithm(algo, rollout.env.single_observation_space, rollout.env.single_action_space, config or {})
    return rollout.run(policy, steps, policy.exploration(0, 0), policy_version=2, explorer_id=1), policy


# ---- the chunk layout ---------------------------------------------------------------------------

def test_a_dict_chunk_keeps_each_leaf_as_its_own_field_through_pickle_wire_and_replay():
    chunk, _ = _chunk()
    validate_chunk(chunk)
    assert "obs" not in chunk and {"obs.action_mask", "obs.values"} <= set(chunk)
    assert chunk["obs.values"].shape == (17, 4, 5) and chunk["obs.values"].dtype == np.float32
    assert chunk["obs.action_mask"].dtype == np.int8
    leaves = observations(chunk)

    buffers = []
    data = pickle.dumps(chunk, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1  # one buffer, whatever the leaves
    back = pickle.loads(data, buffers=buffers)
    description, parts = encode(chunk, key="k")
    wired = decode(description, np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy())
    for copy in (back, wired):
        validate_chunk(copy)
        for path, leaf in leaves.items():
            np.testing.assert_array_equal(observations(copy)[path], leaf)
            assert observations(copy)[path].dtype == leaf.dtype

    batch = nstep_transitions(chunk, 0.9, 3)
    t, e = np.nonzero(chunk["valid"])
    for path, leaf in leaves.items():
        np.testing.assert_array_equal(batch["obs"][path], leaf[t, e])
    replay = ReplayBuffer(1_000)
    replay.add(batch)
    got = replay.gather(np.arange(len(t)))
    assert set(got) == set(ReplayBuffer.FIELDS) and set(got["next_obs"]) == set(leaves)
    for path in leaves:
        np.testing.assert_array_equal(got["obs"][path], batch["obs"][path])
        np.testing.assert_array_equal(got["next_obs"][path], batch["next_obs"][path])
    restored = ReplayBuffer(1_000)
    restored.load_state_dict(replay.state_dict())
    np.testing.assert_array_equal(restored.gather(np.arange(5))["obs"]["values"], got["obs"]["values"][:5])


def test_validate_chunk_names_a_bad_leaf():
    chunk, _ = _chunk()
    bad = dict(chunk, **{"obs.values": chunk["obs.values"][:, :2]})
    with pytest.raises(ValueError, match=r"chunk.obs.values: must have leading shape \(T\+1, N\)"):
        validate_chunk(bad)
    with pytest.raises(ValueError, match="not both"):
        validate_chunk(dict(chunk, obs=chunk["obs.values"]))
    with pytest.raises(ValueError, match="dtype must be one of"):
        validate_chunk(dict(chunk, **{"obs.values": chunk["obs.values"].astype(np.float64)}))


def test_nested_dicts_and_tuples_flatten_to_dotted_paths_and_encode_as_declared():
    sample = NESTED.sample()
    assert list(obs_leaves(sample)) == ["grid", "pair.0", "pair.1", "pos.k", "pos.x"]
    spec = DictObs.of(NESTED, "test")
    kinds = {leaf.path: leaf.kind for leaf in spec.leaves}
    assert kinds == {"grid": "image", "pair.0": "categorical", "pair.1": "binary", "pos.k": "categorical", "pos.x": "vector"}
    enc, width = spec.build()
    assert width == enc.width == 128 + (2 + 3) + 2 + 3 + 2  # MinAtar's CNN for the 10x10 grid
    obs = {k: np.stack([obs_leaves(NESTED.sample())[k] for _ in range(6)]) for k in obs_leaves(sample)}
    with torch.no_grad():
        feats = enc({k: torch.from_numpy(v) for k, v in obs.items()}).numpy()
    k = obs["pos.k"]  # Discrete(3, start=1): one-hot of k - 1
    np.testing.assert_array_equal(feats[:, 128 + 5 + 2:128 + 5 + 2 + 3], np.eye(3)[k - 1])
    md = obs["pair.0"]
    np.testing.assert_array_equal(feats[:, 128:133], np.concatenate([np.eye(2)[md[:, 0]], np.eye(3)[md[:, 1]]], 1))
    np.testing.assert_allclose(feats[:, -2:], obs["pos.x"], rtol=0, atol=0)
    flat = DictObs.of(S.Dict({k: v for k, v in NESTED.spaces.items() if k != "grid"}), "test")
    enc, _ = flat.build()
    assert enc.numpy_ok
    with torch.no_grad():
        torch_feats = enc({k: torch.from_numpy(v) for k, v in obs.items()}).numpy()
    np.testing.assert_array_equal(enc.numpy_features(obs), torch_feats)


# ---- action heads and masks ---------------------------------------------------------------------

def test_multidiscrete_and_multibinary_heads_are_sums_of_independent_distributions():
    rng = np.random.default_rng(0)
    logits = torch.randn(64, 2 + 3 + 4)
    heads = ActionHeads.of(S.MultiDiscrete([2, 3, 4]), "test")
    actions, logp = heads.sample(logits.numpy().copy(), rng)
    parts = [torch.distributions.Categorical(logits=logits[:, a:b]) for a, b in ((0, 2), (2, 5), (5, 9))]
    acts = torch.from_numpy(actions)
    want = sum(d.log_prob(acts[:, i]) for i, d in enumerate(parts))
    got, entropy = heads.log_prob_entropy(logits, acts)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.from_numpy(logp), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in parts))

    bits = ActionHeads.of(S.MultiBinary(5), "test")
    logits = torch.randn(64, 5)
    actions, logp = bits.sample(logits.numpy().copy(), rng)
    bern = torch.distributions.Bernoulli(logits=logits)
    got, entropy = bits.log_prob_entropy(logits, torch.from_numpy(actions))
    torch.testing.assert_close(got, bern.log_prob(torch.from_numpy(actions).float()).sum(1))
    torch.testing.assert_close(torch.from_numpy(logp), got, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, bern.entropy().sum(1))


def test_a_masked_action_is_never_drawn_and_log_probs_stay_finite():
    rng = np.random.default_rng(1)
    mask = np.zeros((20_000, 4), np.int8)
    mask[:, 1] = 1  # the first action masked: a draw of exactly 0 must not take it
    mask[::2, 3] = 1
    logits = np.where(mask > 0, rng.standard_normal(mask.shape), MASKED).astype(np.float32)
    actions, logp = sample_categorical(logits.copy(), rng, masked=True)
    assert mask[np.arange(len(mask)), actions].all() and np.isfinite(logp).all()
    algo = make_algorithm("ppo", *_spaces(PICK), {})
    mask5 = np.concatenate([mask[:8], np.ones((8, 1), np.int8)], 1)
    obs = {"action_mask": torch.from_numpy(mask5), "values": torch.rand(8, 5)}
    logp, entropy, _ = algo.net.evaluate(obs, torch.zeros(8, dtype=torch.long))  # action 0: masked everywhere
    assert torch.isfinite(logp).all() and (logp < -1e6).all() and torch.isfinite(entropy).all()


def test_dqn_acts_explores_and_bootstraps_over_valid_actions_only():
    algo = make_algorithm("dqn", *_spaces(PICK), {"learning_starts": 16})
    mask = np.zeros((256, 5), np.int8)
    mask[:, 2] = mask[::3, 4] = 1
    obs = {"action_mask": mask, "values": np.random.default_rng(0).random((256, 5), dtype=np.float32)}
    for epsilon in (0.0, 1.0):
        actions, _ = algo.act(obs, {"epsilon": epsilon})
        assert mask[np.arange(256), actions].all()
    next_obs = {k: torch.from_numpy(v[:8]) for k, v in obs.items()}
    rewards, discounts = torch.ones(8), torch.full((8,), 0.5)
    with torch.no_grad():
        q_next = algo.target(next_obs)
        q = algo.target.head(algo.target.trunk(next_obs["values"]))  # unmasked Q-values
        target = algo.td_targets(rewards, next_obs, discounts)
    valid = torch.from_numpy(mask[:8] > 0)
    best = torch.where(valid, q, torch.full_like(q, -torch.inf)).argmax(1)  # the online net is the target's copy
    torch.testing.assert_close(target, 1 + 0.5 * q.gather(1, best[:, None]).squeeze(1))
    assert (q_next[~valid] == MASKED).all()


@pytest.mark.parametrize("name,space,action,says", [
    ("ppo", NESTED, S.Discrete(2), None),
    ("ppo", S.Dict({"a": S.Box(-1, 1, (3,))}), S.Discrete(2),
     "normalize_obs is for flat Box observations, not Dict or Tuple observations"),
    ("sac", S.Dict({"a": S.Box(-1, 1, (3,))}), S.Box(-1, 1, (2,)),
     "normalize_obs is for flat Box observations, not Dict or Tuple observations"),
    ("ppo", S.Dict({"a": S.Box(-1, 1, (3,))}), S.Discrete(2), "recurrent with Dict"),
    ("dqn", S.Box(-1, 1, (3,)), S.MultiDiscrete([2, 2]), r"allowed: Discrete$"),
    ("ppo", S.Dict({"a": S.Box(-1, 1, (3,)), "action_mask": S.MultiBinary(2)}), S.Box(-1, 1, (2,)),
     "action_mask masks Discrete or MultiDiscrete actions"),
    ("ppo", S.Dict({"a": S.Box(-1, 1, (3,)), "action_mask": S.MultiBinary(4)}), S.MultiDiscrete([2, 3]),
     r"action_mask has 4 entries; allowed: one per action choice \(5: 2 \+ 3\)"),
    ("impala", S.Dict({"a": S.Box(-1, 1, (3,)), "action_mask": S.MultiBinary(3)}), S.MultiBinary(3),
     "action_mask masks Discrete or MultiDiscrete actions; allowed with MultiBinary actions"),
    ("dqn", S.Dict({"a": S.Text(5)}), S.Discrete(2), "observation leaf 'a' is Text"),
])
def test_spaces_not_supported_are_one_line_naming_what_is_allowed(name, space, action, says):
    config = {}
    if says and "normalize_obs" in says:
        config = {"normalize_obs": True}
    if says and "recurrent" in says:
        config = {"recurrent": {"kind": "gru", "hidden": 8}}
    if says is None:
        make_algorithm(name, space, action, config)  # nested Dicts and Tuples of every leaf kind are taken
        return
    with pytest.raises(ValueError, match=says) as err:
        make_algorithm(name, space, action, config)
    assert "\n" not in str(err.value)


def test_an_own_encoder_factory_receives_the_dict_space_less_its_mask():
    algo = make_algorithm("ppo", *_spaces(PICK), {"encoder": "spaces_envs:dict_encoder"})
    assert spaces_envs.SEEN[-1] == ["values"]  # the Dict it was given: the mask masks, it is not encoded
    chunk, _ = _chunk()
    algo.ingest(chunk, 0)
    assert np.isfinite(algo.learn()["pg_loss"])
    actions, _ = algo.act(obs_leaves(Rollout(PICK, 4, seed=0).obs), {})
    assert actions.shape == (4,)


def test_sac_learns_from_dict_observations_replayed_leaf_by_leaf():
    from tianji_dask.chunk import make_chunk

    space = S.Dict({"pos": S.Box(-1, 1, (3,), np.float32), "mode": S.Discrete(3)})
    algo = make_algorithm("sac", space, S.Box(-2, 2, (2,), np.float32),
                          {"learning_starts": 32, "batch_size": 16, "hidden": [16, 16]})
    rng = np.random.default_rng(0)
    T, N = 16, 4
    obs = {"pos": rng.uniform(-1, 1, (T + 1, N, 3)).astype(np.float32), "mode": rng.integers(0, 3, (T + 1, N))}
    actions, _ = algo.act({k: v[0] for k, v in obs.items()}, {})
    assert actions.shape == (N, 2) and np.abs(actions).max() <= 1
    chunk = make_chunk(obs=obs, actions=rng.uniform(-1, 1, (T, N, 2)).astype(np.float32),
                       rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=np.zeros((T, N), bool),
                       truncated=np.zeros((T, N), bool), valid=np.ones((T, N), bool), extras={}, explorer_id=0,
                       policy_version=0, t_start=0.0, t_end=1.0, episodes=[])
    validate_chunk(chunk)
    algo.ingest(chunk, 0)
    assert algo.ready() and np.isfinite(algo.learn()["critic_loss"])


def _spaces(env_id):
    from tianji_dask.envs.vector import env_spaces

    return env_spaces(env_id)


# ---- learning, the embedded cluster, export, the contract ---------------------------------------

@pytest.mark.slow  # a whole training run to a solve
def test_ppo_solves_a_multidiscrete_action_task(tmp_path):
    pipeline = {"name": "guess", "env": {"id": GUESS, "num_envs": 8}, "mode": "single", "explorers": 1,
                "chunk_steps": 32, "algo": {"name": "ppo", "config": {"lr": 0.003, "update_epochs": 4}},
                "stop": {"target_return": 9.5, "mean_episodes": 100, "max_seconds": 60}}
    results = Run(pipeline, out=tmp_path / "run").start().wait()
    assert results["solved"], results["final_mean_return"]  # a random policy returns about 2.9


@pytest.mark.slow  # about 25 s: MiniGrid steps in Python, 30k of them
def test_ppo_solves_minigrid_doorkey_from_its_dict_observation(tmp_path):
    pytest.importorskip("minigrid", reason="MiniGrid needs minigrid (pip install 'tianji-dask[minigrid]')")
    results = Run("minigrid_doorkey_ppo", out=tmp_path / "run",
                  overrides={"mode": "single", "stop.max_seconds": 150}).start().wait()
    assert results["solved"], results["final_mean_return"]


def test_the_masked_pipeline_takes_no_masked_action_on_the_embedded_cluster(tianji_client, tmp_path):
    pytest.importorskip("pettingzoo", reason="tic-tac-toe needs pettingzoo (pip install 'tianji-dask[marl]')")
    results = Run("tictactoe_masked_ppo", tianji_client, out=tmp_path / "run",
                  overrides={"stop.target_return": None, "stop.max_env_steps": 20_000}).start().wait(timeout=240)
    assert results["error"] is None and results["env_steps"] >= 20_000
    assert results["algo_counters"]["masked_actions_taken"] == 0
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["algo_counters"]["masked_actions_taken"] == 0


EXPORTS = {  # (env, algorithm, config): a Dict with a mask, a Dict with an image and a Discrete, MultiDiscrete actions
    "ppo-masked-dict": (PICK, "ppo", {"lr": 0.01}),
    "dqn-masked-dict": (PICK, "dqn", {"learning_starts": 200}),
    "ppo-multidiscrete": (GUESS, "ppo", {"lr": 0.01}),
    "ppo-image-dict": ("tianji_dask.envs.minigrid:MiniGridDict-v0", "ppo", {}),
}


@pytest.mark.parametrize("case", list(EXPORTS))
def test_exported_dict_and_multidiscrete_policies_act_as_load_policy_does(case, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from tianji_dask.envs.vector import make_vec_env
    from tianji_dask.export import export_policy, load_policy

    env_id, algo, config = EXPORTS[case]
    if "minigrid" in env_id:
        pytest.importorskip("minigrid")
    pipeline = {"name": case, "env": {"id": env_id, "num_envs": 8}, "mode": "single", "explorers": 1,
                "chunk_steps": 32, "algo": {"name": algo, "config": config}, "stop": {"max_env_steps": 2_560}}
    Run(pipeline, out=tmp_path / "run").start().wait()
    policy = load_policy(tmp_path / "run")
    env = make_vec_env(env_id, 16, seed=5)
    obs, _ = env.reset(seed=5)
    batches = []
    for _ in range(8):
        batches.append(obs_leaves(obs) if isinstance(obs, dict) else obs)
        obs, *_ = env.step(policy.act(obs, deterministic=False))
    env.close()
    if "image" in case:  # a short run's greedy policy walks every 7x7 view alike: views drawn from the space too
        batches.append({k: np.stack([obs_leaves(policy.observation_space.sample())[k] for _ in range(64)])
                        for k in batches[0]})
    leaves = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]} if isinstance(batches[0], dict) else None
    batch = leaves if leaves is not None else np.concatenate(batches)
    expected = policy.act(batch)
    assert len(np.unique(expected.reshape(len(expected), -1), axis=0)) > 1
    single = {k: v[3] for k, v in batch.items()} if leaves is not None else batch[3]
    np.testing.assert_array_equal(policy.act(single), expected[3])
    if leaves is not None and "action_mask" in leaves:
        assert leaves["action_mask"][np.arange(len(expected)), expected].all()
    names = [f"obs.{k}" for k in leaves] if leaves is not None else ["obs"]
    inputs = [torch.from_numpy(np.asarray(v, np.float32)) for v in (leaves.values() if leaves is not None else [batch])]

    scripted_file = export_policy(tmp_path / "run", "torchscript", tmp_path / "policy.pt")
    extra = {"tianji.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.load(str(scripted_file), _extra_files=extra)
    with torch.no_grad():
        np.testing.assert_array_equal(scripted(*inputs).numpy(), expected)
    meta = json.loads(extra["tianji.json"])
    if leaves is not None:
        assert list(meta["observation_leaves"]) == list(leaves)
    session = ort.InferenceSession(str(export_policy(tmp_path / "run", "onnx", tmp_path / "policy.onnx")),
                                   providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == names
    got = session.run(None, {n: x.numpy()[:9] for n, x in zip(names, inputs)})[0]
    np.testing.assert_array_equal(got, expected[:9])


@pytest.mark.parametrize("algo,env_id,config", [
    ("ppo", PICK, {}), ("impala", CARTPOLE_DICT, {}), ("dqn", PICK, {"learning_starts": 64}),
    ("ppo", GUESS, {}), ("impala", GUESS, {"minibatch_size": 32}),
])
def test_check_algorithm_passes_on_dict_observations_and_multidiscrete_actions(algo, env_id, config):
    assert check_algorithm(algo, env_id, config=config) == []
