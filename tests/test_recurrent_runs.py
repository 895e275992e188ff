"""A recurrent PPO run on a real LocalCluster, and everything that comes after it: evaluations
during training, checkpoints and resume, exact replay, ``eval`` with video, ``export`` and
``load_policy``, each carrying the hidden state."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask.cli import main
from tianji_dask.run import Run

# burn-in on: its chunk fields travel through the cluster, the replay log and a resume too
SHORT = {"stop.target_return": None, "stop.on_solve": False, "checkpoint.every_versions": 20,
         "eval": {"every_versions": 30, "episodes": 2}, "algo.config.recurrent.burn_in": 8}


@pytest.fixture(scope="module")
def recurrent_run(tianji_client, tmp_path_factory):
    out = tmp_path_factory.mktemp("recurrent") / "run"
    results = Run("cartpole_novel_ppo_lstm", tianji_client, out=out,
                  overrides={**SHORT, "stop.max_env_steps": 60_000}).start().wait(timeout=240)
    return out, results


@pytest.mark.slow
def test_a_recurrent_run_trains_evaluates_checkpoints_and_replays_exactly(recurrent_run, capsys):
    out, results = recurrent_run
    assert results["error"] is None and results["checkpoint"]
    assert "burn_in: 8" in (out / "pipeline.yaml").read_text()
    assert results["final_version"] > 60 and results["env_steps"] >= 60_000
    # it learns: a random policy scores ~20 on CartPoleNoVel, this short run well above
    assert results["final_mean_return"] > 40, results["final_mean_return"]
    assert results["eval"] and all(len(r["returns"]) == 2 for r in results["eval"])
    assert results["replay"]["replayable"] and results["replay"]["rows"] == results["chunks"]
    assert main(["replay", str(out)]) == 0
    assert "the same as the run recorded" in capsys.readouterr().out


@pytest.mark.slow
def test_a_recurrent_run_resumes_eval_plays_it_and_its_export_acts_as_load_policy(recurrent_run, tianji_client, tmp_path,
                                                                                 capsys):
    pytest.importorskip("imageio_ffmpeg")
    import gymnasium as gym
    import torch

    from tianji_dask import load_policy
    from tianji_dask.envs import masked  # noqa: F401 - registers CartPoleNoVel-v1

    out, first = recurrent_run
    second = Run.resume(out, tianji_client, overrides={"stop.max_env_steps": 75_000}).start().wait(timeout=240)
    assert second["error"] is None and second["final_version"] > first["final_version"]

    videos = tmp_path / "videos"
    assert main(["eval", str(out), "--episodes", "2", "--video", str(videos)]) == 0
    assert "2 episodes, deterministic policy of" in capsys.readouterr().out
    assert sorted(f.name for f in videos.glob("*.mp4")) == ["episode-000.mp4", "episode-001.mp4"]

    path = tmp_path / "policy.pt"
    assert main(["export", str(out), "--format", "torchscript", "--out", str(path)]) == 0
    module = torch.jit.load(str(path))
    policy = load_policy(out)
    assert policy.recurrent
    env = gym.make("CartPoleNoVel-v1")
    obs, _ = env.reset(seed=3)
    state = policy.initial_state()
    exported_state = torch.as_tensor(state[None])
    for _ in range(300):
        action, state = policy.act(obs, state=state)
        with torch.no_grad():
            exported, exported_state = module(torch.as_tensor(obs[None]), exported_state)
        assert int(exported[0]) == int(action)
        np.testing.assert_allclose(exported_state[0].numpy(), state, atol=1e-5)
        obs, _, terminated, truncated, _ = env.step(int(action))
        if terminated or truncated:
            obs, _ = env.reset()
            state = policy.initial_state()
            exported_state = torch.as_tensor(state[None])
