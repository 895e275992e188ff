"""Bad input: one line naming the field and what is allowed, exit 2, no traceback, nothing written."""

import sys

import pytest
import torch
import yaml
from conftest import EarlyProcess, started, starts_early

from tianji_dask.cli import main
from tianji_dask.config import PipelineError, bundled_pipelines_dir, load_pipeline

GOOD = {
    "name": "t",
    "env": {"id": "CartPole-v1", "num_envs": 4},
    "algo": {"name": "dqn", "config": {"lr": 0.001}},
    "explorers": 2,
    "chunk_steps": 16,
    "stop": {"target_return": 475, "max_seconds": 10},
}


def _write(tmp_path, data, name="p.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _with(**changes):
    import copy

    data = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        if value is ...:
            del node[leaf]
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize("name", sorted(p.stem for p in bundled_pipelines_dir().glob("*.yaml")))
def test_bundled_pipelines_load(name):
    pipeline = load_pipeline(name)
    assert pipeline.name == name
    pipeline.algo_config  # the algorithm's own hyperparameters validate too


CASES = [
    ("malformed yaml", "env: [CartPole\nalgo: {", "malformed YAML"),
    ("not a mapping", "- 1\n- 2\n", "must be a mapping"),
    ("unknown top-level key", _with(explorerz=3), "explorerz: unknown key"),
    ("unknown nested key", _with(stop__targte=3), "stop.targte: unknown key"),
    ("unknown algo hyperparameter", _with(algo__config__lrr=0.1), "algo.config.lrr: unknown key"),
    ("wrong type", _with(explorers="many"), "explorers: "),
    ("out of range", _with(explorers=0), "explorers: Input should be greater than or equal to 1"),
    ("negative direct-path threshold", _with(learner={"direct_chunks_min_mib": -1}),
     "learner.direct_chunks_min_mib: Input should be greater than or equal to 0"),
    ("algo out of range", _with(algo__config__lr=-1.0), "algo.config.lr: Input should be greater than 0"),
    ("unknown algorithm", _with(algo__name="a2c"), "algo.name: must be one of dqn, impala, maddpg, ppo, sac"),
    ("bad mode", _with(mode="fast"), "mode: Input should be 'relaxed', 'lockstep' or 'single'"),
    ("unknown env id", _with(env__id="CartPole-v9"), "env.id: unknown gymnasium id 'CartPole-v9' (did you mean"),
    ("missing field", _with(env=...), "env: required"),
    ("no stop condition", _with(stop={"window": 100}), "stop: give target_return or one of"),
    ("window bounds crossed", _with(controller={"window_min": 4, "window_max": 2}),
     "controller.window_min: must be <= window_max (got window_min 4, window_max 2)"),
    ("replay ratio upside down", _with(controller={"replay_ratio": [8, 2]}),
     "controller.replay_ratio: must be [min, max] with 0 <= min <= max and max > 0 (got [8, 2])"),
    ("negative staleness target", _with(controller={"staleness_target": -1}),
     "controller.staleness_target: Input should be greater than or equal to 0"),
    ("balance and chunk_steps", _with(balance={"chunk_steps_total": 64, "publish_every_total": 8}),
     "balance: derives chunk_steps and learner.publish_every"),
    ("explorer kwargs for a missing explorer", _with(env__explorer_kwargs={5: {"x": 1}}),
     "env.explorer_kwargs: explorer 5 does not exist; allowed 0..1"),
    ("address without address", _with(cluster={"kind": "address"}), "cluster: kind 'address' needs address"),
    ("unknown cluster kind", _with(cluster={"kind": "k8s"}), "cluster.kind: Input should be"),
    ("temporary TLS to a remote scheduler", _with(cluster={"kind": "address", "address": "tls://h:8786", "security": "temporary"}),
     "cluster: security 'temporary' only works for a cluster started here"),
    ("jobqueue maximum below minimum", _with(cluster={"kind": "slurm", "jobqueue": {"minimum_jobs": 4, "maximum_jobs": 2}}),
     "cluster.jobqueue: maximum_jobs (2) must be >= minimum_jobs"),
    ("checkpoint keep zero", _with(checkpoint={"keep": 0}), "checkpoint.keep: Input should be greater than or equal to 1"),
    ("updates per pass word", _with(learner={"updates_per_pass": "many"}), "learner.updates_per_pass"),
    ("unknown learner device", _with(learner={"device": "tpu"}), "learner.device: must be cpu, cuda or cuda:N (got 'tpu')"),
]


@pytest.mark.parametrize("label,data,message", CASES, ids=[c[0] for c in CASES])
def test_bad_pipeline_is_one_clear_line(tmp_path, capsys, label, data, message):
    path = _write(tmp_path, data)
    out = tmp_path / "out"
    with pytest.raises(PipelineError) as err:
        load_pipeline(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    code = main(["train", str(path), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1 and message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "cartpole_dqn", "--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
        (["train", "cartpole_dqn", "--explorers", "0"], "explorers: Input should be greater than or equal to 1 (got 0)"),
        (["train", "cartpole_dqn", "--explorers", "5000"], "explorers: Input should be less than or equal to 4096"),
        (["train", "cartpole_dqn", "--explorers", "two"], "--explorers must be a whole number, got 'two'"),
        (["train", "cartpole_dqn", "--groups", "0"], "groups: Input should be greater than or equal to 1 (got 0)"),
        (["train", "cartpole_dqn", "--groups", "2", "--mode", "single"], "groups: single mode runs one learner"),
        (["train", "cartpole_dqn", "--seed", "-3"], "seed: Input should be greater than or equal to 0 (got -3)"),
        (["train", "cartpole_dqn", "--max-seconds", "0"], "--max-seconds must be a number > 0"),
        (["train", "cartpole_dqn", "--max-seconds", "nan"], "--max-seconds must be a number > 0"),
        (["train", "cartpole_dqn", "--bogus"], "unrecognized arguments: --bogus"),
        (["train"], "train: no pipeline; allowed: PIPELINE (a YAML file or a bundled name"),
        (["train", "--env", "CartPole-v1"], "--algo: missing; --env ID and --algo NAME go together"),
        (["train", "cartpole_dqn", "--env", "CartPole-v1", "--algo", "ppo"], "--env/--algo: make a pipeline of their own"),
        (["train", "--env", "Pendulum-v1", "--algo", "impala"], "--env: Pendulum-v1 has no reward_threshold in its gymnasium spec, "
                                                                "so the run needs a budget; allowed: -n/--total-timesteps N"),
        (["train", "--env", "Acrobat-v1", "--algo", "ppo"], "did you mean Acrobot-v1?"),
        (["train", "cartpole_dqn", "-n", "0"], "--total-timesteps must be a whole number >= 1, got '0'"),
        (["train", "cartpole_dqn", "--seed", "1", "--seeds", "2"], "argument --seeds: not allowed with argument --seed"),
        (["train", "cartpole_dqn", "--seeds", "1", "1"], "--seeds: each seed once"),
        (["train", "cartpole_dqn", "--device", "tpu"], "learner.device: must be cpu, cuda or cuda:N"),
        (["train", "cartpole_ppp"], "did you mean cartpole_ppo"),
        (["train", "cartpole_dqn", "--set", "lr=3e-4"], "did you mean algo.config.lr?"),
        (["fly"], "invalid choice: 'fly'"),
        (["train", "no/such/file.yaml"], "pipeline: file 'no/such/file.yaml' does not exist"),
        (["train", "cartpole_xyz"], "is neither a file nor a bundled pipeline"),
        (["resume", "no/such/run"], "run_dir: 'no/such/run' is not a run directory (no pipeline.yaml)"),
        (["resume", "cartpole_dqn", "--max-seconds", "-1"], "--max-seconds must be a number > 0"),
        (["plot", "no/such/run"], "run_dir: 'no/such/run' is not a recorded run"),
        (["plot"], "the following arguments are required: RUN_DIR"),
    ],
)
def test_bad_cli_input_is_one_clear_line(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    try:
        code = main(argv + ["--out", str(out)] if argv[0] == "train" and len(argv) > 1 else argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1, captured.err
    assert message in captured.err
    assert not out.exists()


def test_algorithm_hyperparameter_error_names_its_field_first(tmp_path, capsys):
    path = _write(tmp_path, _with(algo__config__lrr=0.1))
    assert main(["train", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tianji-dask: error: algo.config.lrr: unknown key; allowed: ") and err.count("\n") == 1, err
    assert " lr," in err  # what is allowed: the algorithm's own hyperparameters


def test_existing_nonempty_out_dir_is_refused_and_left_alone(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["train", "cartpole_dqn", "--out", str(out)]) == 2
    assert "out: directory" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@starts_early("bad_env_process")
def _bad_env_process():
    # the real program on a pipeline its checks refuse: started as soon as the tests are known (conftest)
    return EarlyProcess(lambda d: [sys.executable, "-m", "tianji_dask", "train",
                                   str(_write(d, _with(env__id="NoSuchEnv-v0"))), "--out", str(d / "o")])


@pytest.fixture
def bad_env_process():
    return started("bad_env_process")


def test_cli_process_exits_2_without_traceback(bad_env_process):
    proc = bad_env_process.wait(timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "env.id: unknown gymnasium id" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (bad_env_process.dir / "o").exists()


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"env__id": "Pendulum-v1"}, "algo.name: DQN: action space Box(-2.0, 2.0, (1,), float32) is not supported; allowed: Discrete"),
        ({"algo__name": "sac", "algo__config": {}}, "algo.name: sac: only Box (continuous, one-dimensional) action spaces are supported"),
        ({"env__id": "CarRacing-v3", "algo__name": "sac", "algo__config": {}}, "algo.name: sac: continuous actions need flat Box observations"),
        ({"env__id": "sleepy_env:UnboundedPendulum-v0", "algo__name": "sac", "algo__config": {}},
         "algo.name: sac: only Box action spaces with finite bounds are supported"),
        ({"env__kwargs": {"no_such_option": 1}}, "env: cannot create CartPole-v1 with kwargs"),
    ],
)
def test_env_the_algorithm_cannot_use_is_refused_before_a_cluster(tmp_path, capsys, changes, message):
    path = _write(tmp_path, _with(**changes))
    assert main(["train", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the CUDA device the test asks for in vain")
@pytest.mark.parametrize("mode", ["single", "relaxed"])
def test_learner_device_this_machine_lacks_is_refused_before_a_cluster(tmp_path, capsys, mode):
    path = _write(tmp_path, _with(learner={"device": "cuda"}, mode=mode))
    assert main(["train", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "learner.device: cuda asked for, but torch on this machine" in err
    assert not (tmp_path / "o").exists()


def test_overrides_apply_and_validate():
    p = load_pipeline("cartpole_ppo", overrides={"mode": "single", "explorers": 3, "stop.max_seconds": 5.0})
    assert (p.mode, p.explorers, p.stop.max_seconds) == ("single", 3, 5.0)
    with pytest.raises(PipelineError, match="explorers"):
        load_pipeline("cartpole_ppo", overrides={"explorers": -1})
