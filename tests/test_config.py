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
    ("no stop condition", _with(stop={"mean_episodes": 100}), "stop: give target_return or one of"),
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


# ---- renamed fields: one word, one meaning (docs/design.md, "Words") ------------------------------
SAID_WINDOW = "stop.window is now stop.mean_episodes; the old name still works and will be removed"
SAID_REPLAY = "checkpoint.replay is now checkpoint.replay_buffer; the old name still works and will be removed"


@pytest.fixture
def said(monkeypatch):
    """The lines the renamed fields say, from a process that has said none yet."""
    from tianji_dask.config import renamed
    from tianji_dask.run import quiet

    lines: list[str] = []
    monkeypatch.setattr(renamed, "_said", set())
    monkeypatch.setattr(quiet, "say", lines.append)
    return lines


def test_every_renamed_field_is_a_field_by_its_new_name_only():
    from tianji_dask.config.pipeline import Pipeline
    from tianji_dask.config.renamed import RENAMED
    from tianji_dask.config.validation import _paths

    paths = set(_paths(Pipeline))
    assert all(new in paths and old not in paths for old, new in RENAMED.items())
    assert all(old.rpartition(".")[0] == new.rpartition(".")[0] for old, new in RENAMED.items())  # same section


def test_an_old_name_in_yaml_is_read_as_the_new_one_and_says_one_line_once(tmp_path, said):
    path = _write(tmp_path, _with(stop__window=7, checkpoint={"replay": True}))
    p = load_pipeline(path)
    assert p.stop.mean_episodes == 7 and p.checkpoint.replay_buffer is True
    assert sorted(said) == [SAID_REPLAY, SAID_WINDOW]  # one line each, in the file's order
    assert load_pipeline(path) == p and len(said) == 2  # each said once in a process
    assert "window" not in p.stop.model_dump() and "replay" not in p.checkpoint.model_dump()


@pytest.mark.parametrize("overrides", [{"stop.window": 5, "checkpoint.replay": True},
                                       {"stop": {"target_return": 475, "window": 5}, "checkpoint": {"replay": True}}])
def test_an_old_name_in_overrides_is_read_as_the_new_one(said, overrides):
    p = load_pipeline("cartpole_dqn", overrides=overrides)
    assert p.stop.mean_episodes == 5 and p.checkpoint.replay_buffer is True
    assert said == [SAID_WINDOW, SAID_REPLAY]


def test_an_old_name_set_on_the_command_line_says_one_line(capsys, monkeypatch):
    from tianji_dask.config import renamed

    monkeypatch.setattr(renamed, "_said", set())
    assert main(["show", "cartpole_ppo", "--set", "stop.window=5"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if "stop.window" in line]
    assert lines == [f"tianji-dask: {SAID_WINDOW}"], captured
    assert "  mean_episodes: 5\n" in captured.out


def test_an_old_name_given_alone_or_under_a_new_name_from_elsewhere(tmp_path, said):
    # the new name alone, in the file or set: it is the value
    assert load_pipeline(_write(tmp_path, _with(stop__mean_episodes=9))).stop.mean_episodes == 9
    assert load_pipeline(_write(tmp_path, _with(stop__window=9)), overrides={"stop.mean_episodes": 3}).stop.mean_episodes == 3
    # an old name set on top of a file with the new one: a setting replaces what the file has, as ever
    assert load_pipeline(_write(tmp_path, _with(stop__mean_episodes=9)), overrides={"stop.window": 4}).stop.mean_episodes == 4


@pytest.mark.parametrize("data,overrides,field", [
    (_with(stop__window=5, stop__mean_episodes=6), {}, "stop"),
    (GOOD, {"stop.window": 5, "stop.mean_episodes": 6}, "stop"),
    (GOOD, {"stop": {"target_return": 1, "window": 5, "mean_episodes": 6}}, "stop"),
    (_with(checkpoint={"replay": True, "replay_buffer": False}), {}, "checkpoint"),
], ids=["yaml", "set", "set-section", "checkpoint"])
def test_an_old_name_beside_its_new_one_is_one_line(tmp_path, said, data, overrides, field):
    from tianji_dask.config import parse_pipeline

    with pytest.raises(PipelineError) as err:
        parse_pipeline(data, overrides=overrides)
    old, new = {"stop": ("stop.window", "stop.mean_episodes"), "checkpoint": ("checkpoint.replay", "checkpoint.replay_buffer")}[field]
    assert str(err.value) == f"{new}: given both by this name and by its old name {old}; allowed: one of them, {new}"


def test_a_run_folder_pipeline_written_before_the_renames_loads_the_same(tmp_path, said):
    from tianji_dask.config import pipeline_yaml

    new = pipeline_yaml(load_pipeline("cartpole_dqn", overrides={"stop.mean_episodes": 20, "checkpoint.replay_buffer": True}))
    old = new.replace("  mean_episodes: 20\n", "  window: 20\n").replace("  replay_buffer: true\n", "  replay: true\n")
    assert old != new and "  window: 20\n" in old and "  replay: true\n" in old
    path = _write(tmp_path / "", old, name="pipeline.yaml")
    assert load_pipeline(path) == load_pipeline(_write(tmp_path, new, name="new.yaml"))
    assert pipeline_yaml(load_pipeline(path)) == new  # written back by the new names


def test_a_misspelt_renamed_field_is_pointed_to_its_new_name(tmp_path):
    with pytest.raises(PipelineError, match=r"stop\.windw: unknown key; allowed: .*mean_episodes.*; did you mean stop\.mean_episodes\?$"):
        load_pipeline(_write(tmp_path, _with(stop__windw=3)))
    with pytest.raises(PipelineError, match=r"; did you mean checkpoint\.replay_buffer\?$"):
        load_pipeline(_write(tmp_path, _with(checkpoint={"repaly": True})))
