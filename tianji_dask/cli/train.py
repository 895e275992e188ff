"""The training commands, ``tianji-dask train``, ``resume`` and ``attach``: starting (or
reconnecting to) the run, its live progress, Ctrl-C and SIGTERM, and the lines printed when it
ends."""

from __future__ import annotations

import sys
import time

from tianji_dask.cli.output import unsolved
from tianji_dask.cli.parser import overrides, source
from tianji_dask.cli.signals import EXIT_TERMINATED, Invocation
from tianji_dask.errors import PipelineError
from tianji_dask.run import legs  # light: the resume is checked before the workers start


def _fmt(value, spec=".1f", none="-"):
    return none if value is None else format(value, spec)


def start_workers_early(settings: dict, verbose: bool = False) -> float:
    """Start the process an embedded cluster's workers fork from now, so that it imports torch
    and gymnasium while this one imports them and checks the pipeline (see forkserver.py); a
    pipeline file that names single mode or another cluster leaves it idle. Returns when the CLI
    was ready: its own imports done, its arguments parsed."""
    t_ready = time.time()
    if settings.get("mode") != "single" and settings.get("cluster.kind", "local") == "local":
        from tianji_dask.launch import forkserver  # nothing heavy: tianji_dask.run would import torch

        forkserver.quiet_resource_tracker(verbose)  # the tracker starts with the forkserver
        forkserver.start()
    return t_ready


def cmd_train(args, invocation: Invocation) -> int:
    t_ready = start_workers_early(overrides(args), args.verbose)  # before --env/--algo import gymnasium and torch
    pipeline, settings = source(args)
    run = new_run(pipeline, settings, args, out=args.out, imported_at=t_ready)
    return train_run(run, invocation, args.verbose)


def new_run(pipeline, settings: dict, args, *, out, imported_at: float):
    """The run ``train`` trains, checked (nothing started or written yet), its first line printed."""
    from tianji_dask.run import Run

    run = Run(pipeline, out=out, overrides=settings, imported_at=imported_at, progress=not args.quiet, verbose=args.verbose)
    p = run.pipeline
    explorers = f"{p.explorers} explorer{'s' if p.explorers > 1 else ''}"
    groups = f"{p.groups} groups of {explorers}" if p.groups > 1 else explorers
    if p.learner.replicas > 1:
        groups += f", {p.learner.replicas} learner replicas"
    print(f"tianji-dask: training {p.name} ({p.env.id}, {p.algo.label}, {p.mode}, {groups})", flush=True)
    if p.simulated():
        print(f"tianji-dask: simulated: each env step also costs {p.step_cost_for(0).describe()} "
              f"(env.step_cost_ms; dynamics and learning are real)", flush=True)
    if p.learner.simulated_step_ms:
        print(f"tianji-dask: simulated: each gradient step also costs {p.learner.simulated_step_ms:g} ms of sleep "
              "(learner.simulated_step_ms; the updates are real)", flush=True)
    return run


def cmd_resume(args, invocation: Invocation) -> int:
    settings = overrides(args)
    fixed = [k for k in settings if k in ("env", "env.id", "algo", "algo.name", "groups")]
    if fixed:  # the checkpoint holds this env's, this algorithm's, these groups' learners
        raise PipelineError(f"{fixed[0]}: a resumed run keeps the one its checkpoint was written with; "
                            "allowed: budgets (stop.*), explorers, the controller, the cluster, algo.config.*")
    try:  # before anything starts: a rule still in force ends the resume here, the run's files untouched
        legs.check(args.run_dir, settings)
    except legs.NothingToResume as done:
        if not done.solved:
            raise  # a budget used up: the usage error's line and exit
        print(f"tianji-dask: {done}", flush=True)
        return 0
    t_ready = start_workers_early(settings, args.verbose)
    from tianji_dask.run import Run

    run = Run.resume(args.run_dir, overrides=settings, imported_at=t_ready, progress=not args.quiet, verbose=args.verbose)
    for line in run.skipped_checkpoints:
        print(f"tianji-dask: skipped {line}", file=sys.stderr, flush=True)
    print(f"tianji-dask: resuming {run.pipeline.name} from {', '.join(run.resume_from)}", flush=True)
    return train_run(run, invocation, args.verbose)


def cmd_attach(args, invocation: Invocation) -> int:
    from tianji_dask.run import Run

    run = Run.attach(args.run_dir, progress=not args.quiet, verbose=args.verbose)
    p = run.pipeline
    print(f"tianji-dask: attaching to run {run.run_id} of {p.name} ({p.env.id}, {p.algo.label}, {p.mode}) "
          f"on {p.cluster.address}", flush=True)
    return train_run(run, invocation, args.verbose)


def train_run(run, invocation: Invocation, verbose: bool = False) -> int:
    """Start ``run``, show its progress, stop it cleanly on Ctrl-C or SIGTERM, and print how it
    ended; the exit status."""
    invocation.run_out = str(run.out)
    sigterm = invocation.sigterm
    try:
        run.start()  # a dashboard port taken is one line (the run's note)
    except KeyboardInterrupt:  # before the run began: nothing to keep but the cluster to close
        run.close()
        raise
    except Exception:
        if not sigterm.received:
            raise
        run.close()  # a batch system's SIGTERM reaches the starting workers too: the start failed because of it
        raise KeyboardInterrupt from None
    if run.dashboard_link:
        tianji_page = run.dashboard_link.rsplit("/", 1)[0] + f"/tianji?run={run.run_key}"
        print(f"tianji-dask: dashboard {run.dashboard_link} (this run: {tianji_page})", flush=True)
    run.wait_for_picture = False  # learning_curve.png is drawn as the lines below are printed
    try:
        results = run.wait(on_status=sigterm.checked(lambda status: None))
    except KeyboardInterrupt:
        if sigterm.received:
            print("tianji-dask: SIGTERM: stopping the run; writing its results and a checkpoint", file=sys.stderr, flush=True)
        run.stop()
        results = run.wait()
    if results.get("error"):
        where = f" (traceback: {run.out / results['error_file']})" if results.get("error_file") else ""
        print(f"tianji-dask: the run failed: {results['error']}{where}", file=sys.stderr)
    if results["solved"]:
        stop = run.pipeline.stop
        rule = (f"evaluation mean over {run.pipeline.eval.episodes} episodes" if stop.on == "eval"
                else f"{stop.mean_episodes}-episode mean")
        print(
            f"tianji-dask: solved {run.pipeline.env.id} ({rule} >= {results['target_return']:g}) in "
            f"{results['time_to_solve_s']:.2f} s from run start ({results['time_to_solve_from_process_start_s']:.2f} s "
            f"from process start), {results['env_steps']:,} env steps"
        )
    else:
        print(f"tianji-dask: {unsolved(results, 'SIGTERM' if sigterm.received else 'Ctrl-C')}")
    print(f"tianji-dask: results {run.results_path}")
    run.picture_written()
    if verbose:
        _print_timings(run)
    if sigterm.received:
        print(f"tianji-dask: stopped by SIGTERM; `tianji-dask resume {run.out}` continues it", flush=True)
        return EXIT_TERMINATED
    return 1 if results.get("error") else 0


STARTUP_STEPS = {"import_s": "imports done", "checked_s": "pipeline checked", "cluster_s": "cluster up",
                 "learner_built_s": "learner built", "first_chunk_s": "first chunk consumed"}


def _print_timings(run) -> None:
    """--verbose: when each step of the start was reached, and how long the shutdown took."""
    startup = (run.results or {}).get("startup") or {}
    for key, step in STARTUP_STEPS.items():
        print(f"tianji-dask: startup: {step:<21} {_fmt(startup.get(key), '6.2f', '     -')} s after process start")
    if run.shutdown:
        print(f"tianji-dask: shutdown: results written {run.shutdown['results_written_s']:.2f} s, cluster closed "
              f"{run.shutdown['closed_s']:.2f} s after the learner stopped")
