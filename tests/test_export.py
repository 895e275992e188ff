"""Policies that leave the project: ``load_policy`` on a real run's checkpoint, and its policy
exported to TorchScript and ONNX, read back by ``torch.jit.load`` and onnxruntime, acting exactly
as ``load_policy(run).act`` does on observations the env gave; ``tianji-dask export`` and its
refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import tianji_dask
from tianji_dask.algos import AlgoConfig, Algorithm, make_algorithm
from tianji_dask.config import load_pipeline, pipeline_yaml
from tianji_dask.core import checkpoint
from tianji_dask.envs.vector import make_vec_env
from tianji_dask.errors import PipelineError
from tianji_dask.export import Policy, export_policy, load_policy
from tianji_dask.run import Run

ort = pytest.importorskip("onnxruntime", reason="the ONNX checks need onnxruntime (pip install 'tianji-dask[test]')")

OBSERVATIONS = 1_000
# (bundled pipeline, overrides): a few thousand env steps of single mode, a checkpoint at the end
CASES = {
    "dqn-cartpole": ("cartpole_dqn", {"env.num_envs": 4, "chunk_steps": 64, "stop.max_env_steps": 2_048}),
    # lr 10x the pipeline's: after 8 updates the greedy policy already tells grids apart
    "ppo-minatar": ("minatar_breakout_ppo", {"env.num_envs": 8, "chunk_steps": 64, "stop.max_env_steps": 3_000,
                                             "algo.config.lr": 0.005}),
    "sac-pendulum-normalized": ("pendulum_sac", {"algo.config.normalize_obs": True, "algo.config.learning_starts": 500,
                                                 "stop.max_env_steps": 1_000}),
    "impala-cartpole": ("cartpole_impala", {"stop.max_env_steps": 4_096}),
    "ppo-pendulum-normalized": ("pendulum_ppo", {"stop.max_env_steps": 4_096}),
}
SLOW = pytest.mark.slow  # the fast tier exports a flat and an image policy; the full suite all five
PARAMS = [pytest.param("dqn-cartpole"), pytest.param("ppo-minatar"), pytest.param("sac-pendulum-normalized", marks=SLOW),
          pytest.param("impala-cartpole", marks=SLOW), pytest.param("ppo-pendulum-normalized", marks=SLOW)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each case's run directory, trained on first use."""
    made = {}

    def run(case: str):
        if case not in made:
            name, overrides = CASES[case]
            if name.startswith("minatar"):
                pytest.importorskip("minatar", reason="MinAtar needs minatar (pip install 'tianji-dask[minatar]')")
            out = tmp_path_factory.mktemp("export") / case
            Run(name, out=out, overrides={"mode": "single", "stop.target_return": None, **overrides}).start().wait()
            made[case] = out
        return made[case]

    return run


def observations(run_dir, policy: Policy) -> np.ndarray:
    """OBSERVATIONS observations as the run's vector env gives them, along the policy's sampled actions."""
    p = load_pipeline(run_dir / "pipeline.yaml")
    env = make_vec_env(p.env.id, 8, seed=123, **dict(p.env.kwargs))
    obs, _ = env.reset(seed=123)
    seen = []
    try:
        while sum(len(o) for o in seen) < OBSERVATIONS:
            seen.append(obs)
            obs, *_ = env.step(policy.act(obs, deterministic=False))
    finally:
        env.close()
    return np.concatenate(seen)[:OBSERVATIONS]


def same_actions(got: np.ndarray, expected: np.ndarray, discrete: bool) -> None:
    assert got.shape == expected.shape
    if discrete:
        assert got.dtype == np.int64 and np.array_equal(got, expected)
    else:
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", PARAMS)
def test_exported_policies_act_as_load_policy_does(runs, case, tmp_path):
    run_dir = runs(case)
    policy = load_policy(run_dir)
    p = load_pipeline(run_dir / "pipeline.yaml")
    fresh = make_algorithm(p.algo.name, policy.observation_space, policy.action_space, p.algo_config.model_dump(), p.seed)
    trained = policy.algorithm.get_weights()
    assert policy.version > 0 and any(not np.array_equal(w, trained[k]) for k, w in fresh.get_weights().items())

    obs = observations(run_dir, policy)
    expected = policy.act(obs, deterministic=True)
    discrete = hasattr(policy.action_space, "n")
    assert len(np.unique(expected, axis=0)) > 1  # the policy tells observations apart: the comparison means something
    same_actions(policy.act(obs[3])[None], expected[3:4], discrete)  # one observation: as in a batch
    batch = torch.from_numpy(obs.astype(np.float32))

    ts_file = export_policy(run_dir, "torchscript", tmp_path / "policy.pt")
    extra = {"tianji.json": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load's notice of torch.export
        scripted = torch.jit.load(str(ts_file), _extra_files=extra)
    with torch.no_grad():
        same_actions(scripted(batch).numpy(), expected, discrete)
        same_actions(scripted(batch[:1]).numpy(), expected[:1], discrete)
    meta = json.loads(extra["tianji.json"])
    assert meta["version"] == policy.version and meta["observation_shape"] == list(policy.observation_space.shape)

    onnx_file = export_policy(run_dir, "onnx", tmp_path / "policy.onnx")
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["obs"] and [o.name for o in session.get_outputs()] == ["action"]
    same_actions(session.run(None, {"obs": batch.numpy()})[0], expected, discrete)
    same_actions(session.run(None, {"obs": batch.numpy()[:7]})[0], expected[:7], discrete)  # the batch dimension is free
    assert json.loads(session.get_modelmeta().custom_metadata_map["tianji.json"]) == meta

    # the module is a copy: acting on through the algorithm, or training it further, leaves it as exported
    module = policy.module()
    with torch.no_grad():
        same_actions(module(batch).numpy(), expected, discrete)
        for param in policy.algorithm.policy_module().parameters():
            assert not param.requires_grad
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy.onnx", "policy.pt"]  # no temporary file left


def test_load_policy_takes_a_run_a_checkpoint_folder_or_file(runs):
    run_dir = runs("dqn-cartpole")
    newest = checkpoint.latest(run_dir / "checkpoints")
    policies = [load_policy(run_dir), load_policy(run_dir / "checkpoints"), load_policy(newest),
                load_policy(run_dir, checkpoint_path=newest), tianji_dask.load_policy(run_dir)]
    assert {(p.checkpoint, p.version) for p in policies} == {(str(newest), int(checkpoint.load(newest)["version"]))}
    obs = np.zeros((3, 4), np.float32)
    assert all(np.array_equal(p.act(obs), policies[0].act(obs)) for p in policies)
    with pytest.raises(ValueError, match=r"^obs: shape \(3, 5\); allowed: \(4,\) \(one observation\)"):
        policies[0].act(np.zeros((3, 5)))


class RandomAlgorithm(Algorithm):
    """A researcher's algorithm that acts through ``act`` alone: no ``policy_module``."""

    Config = AlgoConfig

    def act(self, obs, explore):
        return np.zeros(len(obs), np.int64), {}

    def get_weights(self):
        return {}

    def set_weights(self, weights):
        pass

    def ingest(self, chunk, staleness):
        return int(chunk["env_steps"])

    def ready(self):
        return False

    def learn(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _run_dir(tmp_path, name: str, overrides: dict | None = None, with_checkpoint: bool = True):
    """A run directory as a run leaves it: its resolved pipeline and, from the algorithm it names, a checkpoint."""
    p = load_pipeline(name, overrides=overrides)
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "pipeline.yaml").write_text(pipeline_yaml(p))
    if with_checkpoint:
        env = make_vec_env(p.env.id, 1)
        algo = make_algorithm(p.algo.name, env.single_observation_space, env.single_action_space, p.algo_config, p.seed)
        env.close()
        checkpoint.save(run_dir / "checkpoints", {"version": 1, "algo": algo.state_dict()})
    return run_dir


def _main(capsys, *args) -> tuple[int, str, str]:
    """The CLI in this process, as the program runs it: (exit status, stdout, stderr)."""
    from tianji_dask.cli import main

    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("bad,says", [
    ("not-a-run", "tianji-dask: error: run_dir: "),
    ("format", "tianji-dask export: error: argument --format: invalid choice: 'tflite'"),
    ("maddpg", "tianji-dask: error: load_policy: multi-agent pipelines (mpe2:simple_spread_v3) "),
    ("no-policy-module", "tianji-dask: error: export: RandomAlgorithm has no exportable policy network; load_policy"),
    ("no-onnx", "tianji-dask: error: --format onnx: needs onnx (pip install 'tianji-dask[export]')"),
    ("out-is-a-folder", "tianji-dask: error: --out: "),
], ids=lambda value: value if " " not in value else "")
def test_bad_export_input_is_one_line_exit_2_and_nothing_written(runs, tmp_path, capsys, monkeypatch, bad, says):
    run_dir, fmt = runs("dqn-cartpole"), "onnx"
    out = tmp_path / "new" / "policy.onnx"
    if bad == "not-a-run":
        run_dir = tmp_path
    elif bad == "format":
        fmt = "tflite"
    elif bad == "maddpg":
        pytest.importorskip("mpe2")
        run_dir = _run_dir(tmp_path, "mpe_spread_maddpg", with_checkpoint=False)
    elif bad == "no-policy-module":
        run_dir = _run_dir(tmp_path, "cartpole_dqn", {"algo.name": f"{__name__}:RandomAlgorithm", "algo.config": {}})
    elif bad == "no-onnx":
        monkeypatch.setitem(sys.modules, "onnx", None)  # what an installation without it imports
    else:
        out = tmp_path
    before = sorted(tmp_path.rglob("*"))
    code, stdout, stderr = _main(capsys, "export", str(run_dir), "--format", fmt, "--out", str(out))
    assert code == 2 and stderr.startswith(says) and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stdout == "" and sorted(tmp_path.rglob("*")) == before


def test_the_default_policy_module_says_load_policy_still_acts(tmp_path):
    import gymnasium as gym

    algo = RandomAlgorithm(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), AlgoConfig())
    policy = Policy(algo, algo.obs_space, algo.action_space, 0, "in memory")
    assert np.array_equal(policy.act(np.ones((2, 2), np.float32)), [0, 0])
    with pytest.raises(PipelineError, match=r"^export: RandomAlgorithm has no exportable policy network; load_policy still"):
        export_policy(policy, "torchscript", tmp_path / "policy.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a real program: the fast tier runs the CLI in process
def test_the_export_program_writes_an_onnx_file_in_silence(runs, tmp_path):
    # the real process: its exit status, its one line, no warning from the exporters on its streams
    run_dir = runs("dqn-cartpole")
    out = tmp_path / "policies" / "cartpole.onnx"
    proc = subprocess.run([sys.executable, "-m", "tianji_dask", "export", str(run_dir), "--format", "onnx", "--out", str(out)],
                          check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    policy = load_policy(run_dir)
    assert proc.stdout == (f"tianji-dask: wrote {out} (onnx): deterministic policy of {policy.checkpoint} "
                           f"(version {policy.version})\n")
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert np.array_equal(session.run(None, {"obs": obs})[0], policy.act(obs))
