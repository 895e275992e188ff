"""Atari: uint8 frames through the whole pipeline (real ale-py, real cluster, real torch).

Convergence on Pong takes millions of env steps and is not for the test suite; these check the
data format and that both Pong pipelines run end to end for a few chunks.
"""

import numpy as np
import pytest

pytest.importorskip("ale_py", reason="Atari needs ale-py (pip install 'tianji-dask[atari]')")

from tianji_dask import Run  # noqa: E402
from tianji_dask.algos import make_algorithm  # noqa: E402
from tianji_dask.core.metrics import CHUNK_FIELDS  # noqa: E402
from tianji_dask.envs.rollout import Rollout  # noqa: E402
from tianji_dask.envs.vector import env_spaces  # noqa: E402

PONG = "ale_py:ALE/Pong-v5"


def test_pong_chunk_carries_each_uint8_frame_stack_once(record_property):
    obs_space, act_space = env_spaces(PONG, num_threads=1)
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
    algo = make_algorithm("dqn", obs_space, act_space, {"hidden": []})
    rollout = Rollout(PONG, 2, seed=0, env_kwargs={"num_threads": 1})
    T = 40
    chunk = rollout.run(algo, T, {"epsilon": 1.0}, policy_version=0, explorer_id=0)
    rollout.close()

    obs = chunk["obs"]
    assert obs.dtype == np.uint8 and obs.shape == (T + 1, 2, 4, 84, 84)
    assert not any("next" in k for k in chunk), "next observations are frame t+1, never a second copy"
    # frame t+1 really is the next observation of step t: its stack is step t's shifted by one
    # frame, except across episode ends
    shifted = (obs[1:, :, :3] == obs[:-1, :, 1:]).all(axis=(2, 3, 4))
    continuing = chunk["valid"] & ~chunk["terminated"] & ~chunk["truncated"]
    assert shifted[continuing].all()
    assert obs[1:].any(), "frames hold pixels"

    bytes_per_transition = chunk["nbytes"] / chunk["env_steps"]
    frame_stack = 4 * 84 * 84
    # one uint8 stack per step (plus the chunk's last next-frame and small per-step arrays), where
    # float32 obs and next_obs would be 8 stacks' worth
    assert frame_stack <= bytes_per_transition < 1.1 * frame_stack
    record_property("bytes_per_transition", bytes_per_transition)
    print(f"Pong chunk: {bytes_per_transition:,.0f} bytes per transition; float32 obs + next_obs "
          f"would be {8 * frame_stack:,} ({8 * frame_stack / bytes_per_transition:.1f}x)")


@pytest.mark.slow
@pytest.mark.parametrize("pipeline,algo_overrides", [
    ("pong_dqn", {"algo.config.learning_starts": 128, "algo.config.buffer_size": 4096,
                  "algo.config.updates_per_env_step": 0.05}),
    ("pong_ppo", {"algo.config.update_epochs": 1}),
])
def test_pong_pipeline_runs_end_to_end(tianji_client, tmp_path, pipeline, algo_overrides):
    run = Run(pipeline, tianji_client, out=tmp_path / pipeline, overrides={
        "env.num_envs": 2, "chunk_steps": 16, "stop.max_env_steps": 320, "stop.max_seconds": 120,
        # these 0.9 MiB chunks take the direct path, as the bundled pipelines' 29 MiB ones do
        "learner.direct_chunks_min_mib": 0.5, **algo_overrides})
    results = run.start().wait()
    assert results["error"] is None
    assert results["chunks"] >= 5
    assert results["updates"] >= 1
    assert results["env_steps"] >= 320
    assert results["direct_chunks"]["chunks"] >= results["chunks"] and not results["direct_chunks"]["errors"]
    # a CNN's weights are too large to go inside every task: they are scattered once per version
    assert results["weights_published"]["scattered"] >= 1 and results["weights_published"]["inline"] == 0
    # what crossed the network: uint8 frame stacks, once per step
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    per_step = chunks[:, CHUNK_FIELDS.index("nbytes")] / chunks[:, CHUNK_FIELDS.index("env_steps")]
    assert (per_step < 1.2 * 4 * 84 * 84).all()
