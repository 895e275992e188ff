"""What a user of other command lines expects of this one: ``--version``, help for a bare command,
defaults and an example in every ``--help``, "did you mean", ``show`` refusing what ``train``
refuses, one line for a target that did not follow a changed env, a missing extra named with its
install command, and pipelines made from ``--env`` and ``--algo``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helpers import cli

from tianji_dask.cli.seeds import iqm, summary

COMMANDS = ["train", "resume", "attach", "sweep", "plot", "pipelines", "show", "eval", "export", "replay"]


_main = cli  # the CLI in this process


def test_version_is_the_package_version(capsys):
    import tianji_dask

    code, out, _ = _main(capsys, "--version")
    assert code == 0 and out == f"tianji-dask {tianji_dask.__version__}\n"


def test_a_bare_command_prints_the_help_and_exits_2():
    proc = subprocess.run([sys.executable, "-m", "tianji_dask"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("usage: tianji-dask") and "examples:" in proc.stderr
    assert all(command in proc.stderr for command in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_shows_an_example_of_its_command(capsys, command):
    code, out, _ = _main(capsys, command, "--help")
    assert code == 0
    examples = out[out.index("examples:"):].splitlines()[1:]
    assert examples and all(line.startswith(f"  tianji-dask {command}") for line in examples), out


def test_help_shows_defaults(capsys):
    _, out, _ = _main(capsys, "eval", "--help")
    assert "episodes to play (default: 10)" in " ".join(out.split())
    _, out, _ = _main(capsys, "train", "--help")
    assert "explorer streams (default: the pipeline's)" in " ".join(out.split())


@pytest.mark.parametrize("argv,line", [
    (["show", "cartpole_ppp"], "pipeline: 'cartpole_ppp' is neither a file nor a bundled pipeline; did you mean cartpole_ppo"),
    (["show", "cartpole_ppo", "--set", "lr=3e-4"], "lr: unknown key; allowed: algo, "),
    (["show", "cartpole_ppo", "--set", "algo.lr=3e-4"], "algo.lr: unknown key; allowed: config, name; did you mean algo.config.lr?"),
    (["show", "cartpole_ppo", "--set", "algo.config.max_seconds=5"], "; did you mean stop.max_seconds?"),
    (["show", "cartpole_ppo", "--set", "stop.windw=3"], "; did you mean stop.window?"),
    (["show", "cartpole_ppo", "--set", "explorer=3"], "; did you mean explorers?"),
])
def test_did_you_mean(capsys, argv, line):
    code, out, err = _main(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and line in err, err
    if argv[-1] == "lr=3e-4":
        assert err.rstrip().endswith("; did you mean algo.config.lr?"), err


@pytest.mark.parametrize("setting", ["env.kwargs={foo: 1}", "learner.compile=on", "controller.window_max=0"])
def test_show_refuses_what_a_run_refuses(capsys, setting):
    from tianji_dask import PipelineError, Run

    with pytest.raises(PipelineError) as refused:
        Run("cartpole_ppo", overrides=dict([_kv(setting)]))
    code, out, err = _main(capsys, "show", "cartpole_ppo", "--set", setting)
    assert code == 2 and out == "" and err == f"tianji-dask: error: {refused.value}\n"


def _kv(setting: str):
    key, _, value = setting.partition("=")
    return key, yaml.safe_load(value)


def test_a_changed_env_says_which_target_applies(capsys):
    code, out, err = _main(capsys, "show", "cartpole_ppo", "--set", "env.id=Acrobot-v1")
    assert code == 0 and yaml.safe_load(out)["stop"]["target_return"] == 475
    assert err == ("tianji-dask: stop.target_return 475 comes from cartpole_ppo; Acrobot-v1's reward_threshold is -100: "
                   "set stop.target_return\n")
    code, out, err = _main(capsys, "show", "cartpole_ppo", "--set", "env.id=Acrobot-v1", "--set", "stop.target_return=-100")
    assert code == 0 and err == ""


def test_env_and_algo_make_a_pipeline_from_the_algorithms_defaults(capsys):
    from tianji_dask.algos.ppo import PPOConfig

    code, out, err = _main(capsys, "show", "--env", "Acrobot-v1", "--algo", "ppo", "-n", "5e4")
    assert code == 0 and err == "", err
    shown = yaml.safe_load(out)
    assert shown["name"] == "acrobot_v1_ppo" and shown["env"]["id"] == "Acrobot-v1"
    assert shown["stop"]["target_return"] == -100 and shown["stop"]["max_env_steps"] == 50_000
    assert shown["algo"]["config"] == PPOConfig().model_dump(mode="json")  # every hyperparameter, its default


@pytest.mark.parametrize("module,argv,hint", [
    ("ale_py", ["show", "pong_dqn"], "env: ale_py:ALE/Pong-v5 needs ale-py, which is not installed; allowed: pip install 'tianji-dask[atari]'"),
    ("mujoco", ["show", "hopper_ppo"], "pip install 'tianji-dask[mujoco]'"),
    ("minatar", ["show", "minatar_breakout_dqn"], "pip install 'tianji-dask[minatar]'"),
    ("popgym", ["show", "popgym_repeat_previous_ppo_lstm"], "pip install 'tianji-dask[popgym]'"),
    ("mpe2", ["show", "mpe_spread_maddpg"], "pip install 'tianji-dask[marl]'"),
    ("mlflow", ["show", "cartpole_ppo", "--set", "callbacks=[tianji_dask.callbacks.mlflow:MLflowLogger]"],
     "pip install 'tianji-dask[mlflow]'"),
    ("wandb", ["show", "cartpole_ppo", "--set", "callbacks=[tianji_dask.callbacks.wandb:WandbLogger]"],
     "pip install 'tianji-dask[wandb]'"),
    ("tensorboard", ["show", "cartpole_ppo", "--set", "logging.tensorboard=true"], "pip install tensorboard"),
    ("optuna", ["sweep", "cartpole_ppo", "--param", "algo.config.lr=loguniform:1e-4:1e-2", "--out", "{tmp}/sweep"],
     "pip install 'tianji-dask[sweep]'"),
    ("onnx", ["export", "{tmp}", "--format", "onnx", "--out", "{tmp}/policy.onnx"], "pip install 'tianji-dask[export]'"),
    ("imageio", ["eval", "{tmp}/run", "--video", "{tmp}/videos"], "pip install 'tianji-dask[video]'"),
])
def test_a_missing_extra_is_named_with_its_install_command(capsys, monkeypatch, tmp_path, module, argv, hint):
    from tianji_dask.config import load_pipeline, pipeline_yaml

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pipeline.yaml").write_text(pipeline_yaml(load_pipeline("cartpole_ppo")))  # a run with no checkpoint yet
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed: importing it fails
    code, out, err = _main(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 2 and out == "" and err.count("\n") == 1 and hint in err, err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "policy.onnx").exists() and not (tmp_path / "videos").exists()


def test_a_missing_checkpoint_file_is_not_found(tmp_path, capsys):
    from tianji_dask.config import load_pipeline, pipeline_yaml

    (tmp_path / "pipeline.yaml").write_text(pipeline_yaml(load_pipeline("cartpole_ppo")))
    code, _, err = _main(capsys, "eval", str(tmp_path), "--checkpoint", str(tmp_path / "nosuch.pt"))
    assert code == 2 and err == f"tianji-dask: error: checkpoint: {str(tmp_path / 'nosuch.pt')!r} not found (no such file)\n"


def test_plot_of_a_run_without_episodes_is_one_line(tmp_path, capsys):
    # one chunk of one vector step: the run ends before any episode does
    out = tmp_path / "run"
    code, _, _ = _main(capsys, "train", "cartpole_ppo", "--mode", "single", "--set", "chunk_steps=1", "-n", "1",
                       "--set", "stop.target_return=null", "--quiet", "--out", str(out))
    assert code == 0 and json.loads((out / "results.json").read_text())["episodes"] == 0
    code, stdout, err = _main(capsys, "plot", str(out))
    assert code == 2 and stdout == "" and err == (f"tianji-dask: error: run_dir: {str(out)!r} has no episodes to plot (the run "
                                                  "stopped before any training episode ended); allowed: a run with at least one episode\n")
    assert not (out / "plots").exists()


def test_iqm_cuts_a_quarter_from_each_end():
    assert iqm([5.0]) == 5.0 and iqm([1.0, 2.0, 3.0]) == 2.0
    assert iqm([100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -50.0]) == 3.5  # 8 values: the lowest two and highest two cut
    rows = [{"seed": s, "out": f"o{s}", "solved": s != 2, "stop_reason": "solved" if s != 2 else "max_env_steps",
             "time_to_solve_s": float(s + 1) if s != 2 else None, "wall_s": 10.0, "env_steps": 1000, "final_mean_return": 1.0,
             "error": None} for s in range(4)]
    lines, record = summary(rows)
    assert record["time_to_solve_iqm_s"] == 3.0 and record["solved"] == 3 and record["iqm_is_lower_bound"]
    assert lines[-1] == "time-to-solve IQM 3.00 s over 4 seeds, 3 solved, at least: 1 unsolved counted at the time they stopped"


def test_seeds_run_one_after_another_and_end_with_a_summary(tmp_path, capsys):
    # single mode, a target random play reaches within a few episodes: each seed's run is short
    out = tmp_path / "seeds"
    code, stdout, err = _main(capsys, "train", "cartpole_ppo", "--mode", "single", "--seeds", "3", "1", "--set", "stop.window=5",
                              "--set", "stop.target_return=15", "-n", "20000", "--quiet", "--out", str(out))
    assert code == 0, err
    record = json.loads((out / "seeds.json").read_text())
    assert [r["seed"] for r in record["seeds"]] == [3, 1]
    for r in record["seeds"]:
        results = json.loads((out / f"seed-{r['seed']}" / "results.json").read_text())
        assert results["seed"] == r["seed"] and results["provenance"]["seeds"]["run"] == r["seed"]
        assert r["solved"] == results["solved"] and r["env_steps"] == results["env_steps"]
    times = [r["time_to_solve_s"] if r["solved"] else r["wall_s"] for r in record["seeds"]]
    assert record["time_to_solve_iqm_s"] == pytest.approx(iqm(times))
    lines = [line for line in stdout.splitlines() if line.startswith("tianji-dask: seed ")]
    assert [line.split(":")[1].split()[1] for line in lines] == ["3", "1", "3", "1"]  # announced in order, then summed up
    assert f"time-to-solve IQM {record['time_to_solve_iqm_s']:.2f} s over 2 seeds" in stdout


@pytest.mark.slow  # trains on its own LocalCluster
def test_env_and_algo_train_to_their_budget(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tianji_dask", "train", "--env", "Acrobot-v1", "--algo", "ppo", "-n", "50000",
                           "--quiet", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.startswith("tianji-dask: training acrobot_v1_ppo (Acrobot-v1, ppo, relaxed, 2 explorers)"), proc.stdout
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["pipeline_config"]["stop"]["max_env_steps"] == 50_000 and results["target_return"] == -100
    # the budget, or the env spec's target first (PPO's defaults can solve Acrobot within it)
    assert (results["stop_reason"], results["solved"]) in {("max_env_steps", False), ("solved", True)}, results["stop_reason"]
    assert results["stop_reason"] == "solved" or results["env_steps"] >= 50_000
    assert results["error"] is None and results["updates"] > 0
