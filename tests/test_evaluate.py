"""`tianji-dask eval`: a run's checkpoint played with the deterministic policy, and its videos."""

from __future__ import annotations

import pytest

from tianji_dask.cli import main
from tianji_dask.run import Run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    Run("cartpole_dqn", out=out, overrides={"mode": "single", "stop.max_seconds": 3, "stop.on_solve": False}).start().wait()
    return out


def test_eval_plays_the_newest_checkpoint_and_writes_a_playable_mp4_per_episode(trained, tmp_path, capsys):
    imageio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    videos = tmp_path / "videos"
    assert main(["eval", str(trained), "--episodes", "2", "--video", str(videos)]) == 0
    out = capsys.readouterr().out
    assert "2 episodes, deterministic policy of" in out and "ckpt-" in out
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == ["episode-000.mp4", "episode-001.mp4"]
    returns = [float(x) for x in out.split("tianji-dask: returns ")[1].splitlines()[0].split(", ")]
    for f, ret in zip(files, returns):
        assert f.stat().st_size > 1000
        frames = imageio.get_reader(f).count_frames()
        assert frames == int(ret)  # CartPole pays 1 a step: one frame per step, the reset's included, the last not


def test_the_deterministic_policy_gives_the_same_returns_for_the_same_seed(trained, capsys):
    assert main(["eval", str(trained), "--episodes", "3", "--seed", "5"]) == 0
    first = capsys.readouterr().out.split("returns ")[1]
    assert main(["eval", str(trained), "--episodes", "3", "--seed", "5"]) == 0
    assert capsys.readouterr().out.split("returns ")[1] == first


@pytest.mark.parametrize("args,starts", [
    (["eval", "/no/such/run"], "tianji-dask: error: run_dir:"),
    (["eval", "RUN", "--episodes", "0"], "tianji-dask eval: error: argument --episodes"),
    (["eval", "RUN", "--checkpoint", "/no/such.pt"], "tianji-dask: error: checkpoint:"),
])
def test_bad_eval_arguments_are_one_line_and_exit_2(trained, capsys, args, starts):
    args = [str(trained) if a == "RUN" else a for a in args]
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own checks
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and starts in err and "Traceback" not in err, err
