"""What a user of other command lines expects of this one: ``--version``, help for a bare command,
defaults and an example in every ``--help``, "did you mean", ``show`` refusing what ``train``
refuses, one line for a target that did not follow a changed env, a missing extra named with its
install command, pipelines made from ``--env`` and ``--algo`` (a bundled pipeline's settings, RL
Zoo's or the algorithm's defaults), and Stable-Baselines3's names pointed to ours."""

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
    (["show", "cartpole_ppo", "--set", "stop.windw=3"], "; did you mean stop.mean_episodes?"),
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
    # neither a bundled pipeline nor RL Zoo trains Acrobot with IMPALA
    from tianji_dask.algos.impala import IMPALAConfig

    code, out, err = _main(capsys, "show", "--env", "Acrobot-v1", "--algo", "impala", "-n", "5e4")
    assert code == 0 and err == ("tianji-dask: --env Acrobot-v1 --algo impala: using impala's defaults (no bundled "
                                 "pipeline or RL Zoo entry for Acrobot-v1 with impala)\n"), err
    shown = yaml.safe_load(out)
    assert shown["name"] == "acrobot_v1_impala" and shown["env"]["id"] == "Acrobot-v1"
    assert shown["stop"]["target_return"] == -100 and shown["stop"]["max_env_steps"] == 50_000
    assert shown["algo"]["config"] == IMPALAConfig().model_dump(mode="json")  # every hyperparameter, its default


def test_env_and_algo_of_a_bundled_pipeline_train_its_settings(capsys):
    from tianji_dask.config import bundled_pipelines_dir
    from tianji_dask.config.from_env import pipeline_source

    data, line = pipeline_source("Pendulum-v1", "sac")
    assert data == yaml.safe_load((bundled_pipelines_dir() / "pendulum_sac.yaml").read_text())  # its settings, its target
    assert line == "--env Pendulum-v1 --algo sac: using the bundled pipeline pendulum_sac's settings"
    assert pipeline_source("CartPole-v1", "dqn")[1].endswith("the bundled pipeline cartpole_dqn's settings")  # not _per
    code, out, err = _main(capsys, "show", "--env", "Pendulum-v1", "--algo", "sac", "--set", "stop.max_seconds=60")
    assert code == 0 and err == f"tianji-dask: {line}\n", err
    _, bundled, _ = _main(capsys, "show", "pendulum_sac", "--set", "stop.max_seconds=60")
    assert out == bundled


def test_env_and_algo_without_a_bundled_pipeline_take_rl_zoos_hyperparameters(capsys):
    from tianji_dask.config import parse_pipeline
    from tianji_dask.config.from_env import pipeline_source
    from tianji_dask.config.zoo_hyperparams import ZOO, ZOO_ENTRY_OF

    data, line = pipeline_source("Acrobot-v1", "ppo")  # ppo.yml: n_envs 16, n_steps 256, gae_lambda 0.94, n_epochs 4, normalize
    assert line == ("--env Acrobot-v1 --algo ppo: using RL Zoo's hyperparameters for Acrobot-v1 "
                    "(rl-baselines3-zoo hyperparams/ppo.yml), translated to this project's fields")
    p = parse_pipeline(data)
    assert (p.name, p.env.num_envs, p.chunk_steps, p.stop.target_return, p.stop.max_env_steps) == ("acrobot_v1_ppo", 16, 256, -100, 1_000_000)
    c = p.algo_config
    assert (c.lr, c.gae_lambda, c.gamma, c.update_epochs, c.ent_coef, c.clip_coef) == (3e-4, 0.94, 0.99, 4, 0.0, 0.2)
    assert c.num_minibatches == 256 * 16 // 64 and c.normalize_obs and c.normalize_reward and c.activation == "tanh"
    # dqn.yml's MountainCar-v0: train_freq 16, gradient_steps 8, a target copy every 600 env steps, 20% of 120k exploring
    data, line = pipeline_source("MountainCar-v0", "dqn")
    c = parse_pipeline(data).algo_config
    assert "RL Zoo's hyperparameters for MountainCar-v0 (rl-baselines3-zoo hyperparams/dqn.yml)" in line
    assert (c.lr, c.updates_per_env_step, c.target_update_interval, c.eps_decay_steps, c.eps_final) == (4e-3, 0.5, 300, 24_000, 0.07)
    assert (c.hidden, c.n_step, c.double_q, c.batch_size, c.buffer_size, c.gamma) == ((256, 256), 1, False, 128, 10_000, 0.98)
    # sac.yml's Hopper-v4 entry for gymnasium's Hopper-v5: SB3's defaults but 10k random steps first
    data, line = pipeline_source("Hopper-v5", "sac")
    c = parse_pipeline(data).algo_config
    assert "RL Zoo's hyperparameters for Hopper-v4 (rl-baselines3-zoo hyperparams/sac.yml)" in line
    assert (c.learning_starts, c.actor_lr, c.critic_lr, c.policy_frequency, c.autotune) == (10_000, 3e-4, 3e-4, 1, True)
    # the flags (applied by the run as by parse_pipeline) win over the zoo's settings
    p = parse_pipeline(pipeline_source("Acrobot-v1", "PPO")[0], overrides={"algo.config.lr": 1e-3, "stop.max_env_steps": 5})
    assert (p.algo.name, p.algo_config.lr, p.stop.max_env_steps) == ("ppo", 1e-3, 5)
    for algo, entries in ZOO.items():  # every entry of the table is a valid pipeline
        for env_id in [*entries, *(v5 for v5, v4 in ZOO_ENTRY_OF.items() if v4 in entries)]:
            data, line = pipeline_source(env_id, algo)
            assert parse_pipeline(data).stop.max_env_steps, (env_id, algo)


@pytest.mark.parametrize("typed", ["PPO", "Ppo"])
def test_algo_names_are_read_in_any_case(capsys, typed):
    code, out, err = _main(capsys, "show", "--env", "Acrobot-v1", "--algo", typed)
    assert code == 0 and yaml.safe_load(out)["algo"]["name"] == "ppo", err
    assert err.startswith("tianji-dask: --env Acrobot-v1 --algo ppo: using RL Zoo's"), err


def test_a_misspelt_algo_is_one_line_with_the_closest_name(capsys):
    code, out, err = _main(capsys, "train", "--env", "Acrobot-v1", "--algo", "ppoo")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("tianji-dask: error: --algo: unknown algorithm 'ppoo'; did you mean ppo? (allowed: dqn, impala, "), err


@pytest.mark.parametrize("where,hint", [
    ("algo: {name: ppo, config: {learning_rate: 3.0e-4}}", "algo.config.learning_rate: unknown key; allowed: activation, "),
    ("algo: {name: ppo}\nlearning_rate: 3.0e-4", "learning_rate: unknown key; allowed: algo, "),
])
def test_an_sb3_name_in_a_pipeline_file_names_ours(tmp_path, capsys, where, hint):
    path = tmp_path / "mine.yaml"
    path.write_text(f"env: {{id: CartPole-v1}}\n{where}\nstop: {{target_return: 475}}\n")
    code, out, err = _main(capsys, "show", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and hint in err, err
    assert err.rstrip().endswith("; did you mean algo.config.lr?"), err


@pytest.mark.parametrize("pipeline,setting,hint", [
    ("pendulum_sac", "learning_rate=1e-3", "; did you mean algo.config.actor_lr and algo.config.critic_lr?"),
    ("cartpole_ppo", "algo.config.n_epochs=4", "; did you mean algo.config.update_epochs?"),
    ("cartpole_ppo", "algo.config.clip_range=0.1", "; did you mean algo.config.clip_coef?"),
    ("cartpole_ppo", "n_steps=128", "; did you mean chunk_steps? (vector steps per chunk)"),
    ("cartpole_ppo", "batch_size=64", "; did you mean algo.config.num_minibatches? (a count: n_steps x n_envs / batch_size)"),
    ("cartpole_ppo", "total_timesteps=1e5", "; did you mean stop.max_env_steps?"),
    ("cartpole_dqn", "batch_size=64", "; did you mean algo.config.batch_size?"),
    ("cartpole_dqn", "algo.config.exploration_final_eps=0.05", "; did you mean algo.config.eps_final?"),
    ("cartpole_dqn", "algo.config.train_freq=4", "; did you mean algo.config.updates_per_env_step? (gradient_steps / train_freq)"),
    ("pendulum_sac", "algo.config.ent_coef=0.1", "; did you mean algo.config.alpha? ('auto': algo.config.autotune)"),
])
def test_an_sb3_name_in_a_setting_names_ours(capsys, pipeline, setting, hint):
    code, out, err = _main(capsys, "show", pipeline, "--set", setting)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.rstrip().endswith(hint), err


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
    code, stdout, err = _main(capsys, "train", "cartpole_ppo", "--mode", "single", "--seeds", "3", "1", "--set", "stop.mean_episodes=5",
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
    assert proc.stdout.startswith("tianji-dask: --env Acrobot-v1 --algo ppo: using RL Zoo's hyperparameters for Acrobot-v1 "
                                  "(rl-baselines3-zoo hyperparams/ppo.yml), translated to this project's fields\n"
                                  "tianji-dask: training acrobot_v1_ppo (Acrobot-v1, ppo, relaxed, 2 explorers)"), proc.stdout
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["pipeline_config"]["stop"]["max_env_steps"] == 50_000 and results["target_return"] == -100
    # the budget, or the env spec's target first (PPO's defaults can solve Acrobot within it)
    assert (results["stop_reason"], results["solved"]) in {("max_env_steps", False), ("solved", True)}, results["stop_reason"]
    assert results["stop_reason"] == "solved" or results["env_steps"] >= 50_000
    assert results["error"] is None and results["updates"] > 0
