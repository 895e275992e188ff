"""Evaluate a run's checkpoint: play whole episodes with the deterministic policy, one env, in
this process (no Dask), and optionally write each episode as an MP4.

The policy acts as explorers act (the same algorithm object, the same vector-env preprocessing),
with exploration off: the most likely action (``greedy``) and no epsilon. Videos are the env's own
``rgb_array`` frames, encoded by imageio with its ffmpeg plugin (the ``video`` extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tianji_dask.envs.play import DETERMINISTIC, play_episodes
from tianji_dask.errors import PipelineError



@dataclass
class Evaluation:
    checkpoint: str
    version: int
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


def _video_writer():
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401 - the encoder imageio writes MP4 with
    except ImportError:
        raise PipelineError("--video: needs imageio and imageio-ffmpeg (pip install 'tianji-dask[video]')") from None
    return imageio


def evaluate(run_dir: str | os.PathLike, *, checkpoint_path: str | os.PathLike | None = None, episodes: int = 10,
             seed: int = 0, video_dir: str | os.PathLike | None = None) -> Evaluation:
    """Play ``episodes`` episodes (env seeds ``seed``, ``seed + 1``, ...) with the policy of the
    newest checkpoint of ``run_dir`` (or ``checkpoint_path``); with ``video_dir``, one MP4 each."""
    from tianji_dask.algos import make_algorithm
    from tianji_dask.config import load_pipeline
    from tianji_dask.core import checkpoint
    from tianji_dask.envs.marl import is_parallel_env_id
    from tianji_dask.envs.vector import make_vec_env
    from tianji_dask.run.specs import checkpoint_dirs

    run_dir = Path(run_dir)
    if not (run_dir / "pipeline.yaml").is_file():
        raise PipelineError(f"run_dir: {str(run_dir)!r} is not a run directory (no pipeline.yaml)")
    if episodes < 1:
        raise PipelineError(f"--episodes: must be >= 1 (got {episodes})")
    p = load_pipeline(run_dir / "pipeline.yaml")
    if is_parallel_env_id(p.env.id):
        raise PipelineError(f"eval: multi-agent pipelines ({p.env.id}) are not evaluated yet; allowed: single-agent envs")
    imageio = _video_writer() if video_dir is not None else None  # a missing extra before the checkpoint is read
    path = Path(checkpoint_path) if checkpoint_path is not None else checkpoint.latest(checkpoint_dirs(run_dir, p.groups)[0])
    state = checkpoint.load(path)
    env_kwargs = dict(p.env.kwargs)
    if video_dir is not None:
        env_kwargs["render_mode"] = "rgb_array"
        # pygame's envs draw off screen; without a display SDL would complain on stderr
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_vec_env(p.env.id, 1, seed=seed, **env_kwargs)
    algo = make_algorithm(p.algo.name, env.single_observation_space, env.single_action_space,
                          p.algo_config.model_dump(), p.seed)
    algo.load_state_dict(state["algo"])
    out = Evaluation(str(path), int(state["version"]))
    if video_dir is not None:
        Path(video_dir).mkdir(parents=True, exist_ok=True)
    fps = int(env.metadata.get("render_fps") or 30)

    def write_video(episode: int, frames: list) -> None:
        video = Path(video_dir) / f"episode-{episode:03d}.mp4"
        imageio.mimwrite(video, frames, fps=fps, macro_block_size=1)
        out.videos.append(str(video))

    try:
        out.returns, out.lengths = play_episodes(algo, env, episodes, seed, DETERMINISTIC,
                                                 on_episode_frames=write_video if video_dir is not None else None)
    finally:
        env.close()
    return out
