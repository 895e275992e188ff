"""`tianji-dask eval`: a run's checkpoint played with the deterministic policy, and its videos."""

from __future__ import annotations

import pytest

from tianji_dask.cli import main
from tianji_dask.run import Run
from tianji_dask.core import summary


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "run"
    # a short run (some hundred updates): its policy's episodes differ from seed to seed and are
    # short, so their videos are quick to write
    Run("cartpole_dqn", out=out, overrides={"mode": "single", "env.num_envs": 4, "chunk_steps": 64,
                                            "stop.max_env_steps": 2_048, "stop.target_return": None}).start().wait()
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


# ---- evaluation during training ---------------------------------------------------------------
@pytest.mark.slow  # the fast tier sees evaluations in test_observe's live run
def test_evaluations_run_beside_training_and_are_never_trained_on(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "run", overrides={
        "eval": {"every_s": 1, "episodes": 3}, "stop.on_solve": False, "stop.max_seconds": 6})
    results = run.start().wait(timeout=120)
    rows = results["eval"]
    assert len(rows) >= 3 and all(r["episodes"] == 3 and len(r["returns"]) == 3 for r in rows)
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows) and rows[-1]["version"] > rows[0]["version"]
    # never trained on, never credited: the controller's books hold the training chunks alone
    ctrl = results["controller"]
    assert ctrl["chunks_consumed"] == results["chunks"] and ctrl["credits_granted"] == results["chunks"] + results["chunks_lost"]
    lines = (tmp_path / "run" / "eval.csv").read_text().splitlines()
    assert lines[0] == "t,version,mean,std,episodes" and len(lines) == len(rows) + 1


def test_a_run_can_solve_on_its_evaluations():
    from tianji_dask.core.ledger import Ledger
    from tianji_dask.core.stop import StopRules

    rules = StopRules(target_return=100, on_eval=True)
    ledger = Ledger(rules, t_run_start=0.0, t_process_start=0.0)
    ledger.record_eval(1.0, 10, [50, 60])
    assert ledger.check_stop(now=1.5) is None
    ledger.record_eval(2.0, 20, [100, 120])
    assert ledger.check_stop(now=2.5) == "solved"
    ledger.t_end = 3.0
    results = summary.results(ledger, 20)
    assert results["solved"] and results["time_to_solve_s"] == 2.0 and [r["mean"] for r in results["eval"]] == [55, 110]
    # training returns do not solve such a run
    assert not StopRules(target_return=100, on_eval=True).running_mean_solves([200] * 100)


@pytest.mark.parametrize("overrides,starts", [
    ({"stop.on": "eval"}, "stop.on: 'eval' solves on evaluations"),
    ({"eval": {"episodes": 3}}, "eval: give every_s or every_versions"),
    ({"eval": {"every_s": 1}, "mode": "single"}, "eval: runs on explorer workers"),
])
def test_eval_settings_are_checked(overrides, starts):
    from tianji_dask.config import PipelineError

    with pytest.raises(PipelineError, match="^" + starts.replace("(", r"\(")):
        Run("cartpole_dqn", overrides=overrides)
