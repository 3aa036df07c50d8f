"""One way from a config to a running trainer, whoever starts the run.

The command line (tdmpc.train), Python (tdmpc.fit), Slurm (its scripts run the command line) and
data-parallel ranks (torchrun starts the command line once per rank) all go through here:

    RunRequest --prepare()--> RunSetup --build()--> Trainer --run()--> exit code

prepare() decides everything and writes nothing: the device, the task's spec, the config filled in
for the task, the run directory and the memory plan (with --fit-memory's changes). build() makes the
parts and hands them to the loop, as the reference's train.py hands its trainer cfg, env, agent,
buffer and logger: it locks the run directory, builds the envs (or opens the dataset), the agent, the
replay buffer and the episode recorder, loads --init-from weights and a resumed run's state.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from tdmpc import memory
from tdmpc.agent import Agent
from tdmpc.buffer import ReplayBuffer
from tdmpc.config import Config, from_dict, validate
from tdmpc.envs import EnvSource, EnvSpec, check_observations, make_env, make_envs
from tdmpc.envs.host import HostVectorEnv, LockstepEnv
from tdmpc.envs.make import importing_main_in_a_worker
from tdmpc.envs.tensor import is_tensor_task, make_tensor_vector_env, tensor_task_spec
from tdmpc.errors import (EXIT_BAD_INPUT, EXIT_OK, EXIT_REQUEUE, BadInput, CheckpointError, ConfigError, DeviceError,
                          RunFailed)
from tdmpc.model.checkpoint import check_dims_match, load_file
from tdmpc.offline.data import offline_spec, open_offline
from tdmpc.planners.make import planner_factory
from tdmpc.offline.writer import DatasetWriter, EpisodeRecorder, task_action_start
from tdmpc.runtime import distributed
from tdmpc.runtime.args import named
from tdmpc.runtime.device import cap_cuda_memory, resolve_device, set_threads, threads_error
from tdmpc.runtime.files import available_host_memory
from tdmpc.model.world_model import ModelDims
from tdmpc.multitask import TaskSetup, task_setup
from tdmpc.tasks.sets import expand
from tdmpc.training import speed
from tdmpc.training.flags import TrainArgs, base_config, base_note
from tdmpc.training.init_from import architecture_from_checkpoint, init_weights, read_init
from tdmpc.training.offline import OfflineTrainer
from tdmpc.training.online import OnlineTrainer
from tdmpc.training.notes import cuda_only_notes, run_notes, unused_setting_notes
from tdmpc.training.resume import resume_changes
from tdmpc.training.run_dir import (RunDirLock, check_fresh, default_run_dir, remove_stale_temp_files, resume_checkpoint,
                                    saved_config, saved_step, say_once, set_aside_unfinished)
from tdmpc.training.trainer import Callback, RunSetup, Trainer


@dataclass
class RunRequest:
    """A run as asked for, by flags or keywords."""

    cfg: Config  # as given (prepare() checks it); task-dependent fields may still be None
    resume: Path | None = None  # the run directory to continue
    resumed_by: str = "--resume"  # the flag that asked for it (--auto-resume), named where a resume refuses a flag
    no_buffer: bool = False  # resume without the saved replay buffer (it refills by acting)
    init_from: str | None = None  # start from these weights
    given: frozenset[str] = frozenset()  # Config fields set explicitly: --init-from takes the others from the checkpoint
    base: Config | None = None  # with resume: the run's saved config (what changes is said)
    env: EnvSource | None = None  # a user's env object or factory (None: cfg.task); evaluated on copies of it
    gpu_mem: str | None = None  # plan memory for a card of this size (and, on CUDA, cap the allocator at it)
    fit_memory: bool = False  # lower settings until the estimate fits
    dry_run: bool = False  # print the memory estimate and stop
    notes: tuple[str | None, ...] = ()  # lines to print once the input is known good
    on_log: Callback | None = None
    on_eval: Callback | None = None
    from_python: bool = False  # tdmpc.fit's: messages name its keywords and its resume, not the command line's


def prepare(req: RunRequest) -> RunSetup | None:
    """Resolve the run; None after a dry run (which prints the memory estimate) or for a resumed run that already
    reached its steps (which is said, and nothing in its directory changes). Bad input is a one-line error before
    anything heavy is built: what a resume may not change first (a refusal says more than a setting that only fits
    the change would), then the config's own checks."""
    # Data files as absolute paths, so that the saved config resumes from any directory
    req = dataclasses.replace(req, cfg=_absolute_paths(req.cfg), base=req.base and _absolute_paths(req.base))
    changes = (resume_changes(req.base, req.cfg, req.resume, req.from_python, req.resumed_by)
               if req.resume and req.base else {})
    cfg, init_from, init_note = validate(req.cfg, req.from_python), req.init_from, ""
    planner_factory(cfg.planner)  # a planner name the registry lacks: one line, even for a run that never plans
    def name(field: str) -> str:
        return named(field, None, req.from_python)

    if cfg.dataset and "num_envs" in req.given:
        raise BadInput(f"{name('num_envs')} sets the envs an online run steps; an offline run ({name('dataset')}) "
                       f"steps none")
    if "dataset" in req.given and not cfg.dataset:
        raise BadInput(f"{name('dataset')} names no file: give one or more dataset files, or leave "
                       f"{name('dataset')} out to train online")
    shard = distributed.from_environment(cfg.device)  # torchrun / srun ranks, or a single process
    if shard.world > 1 and not cfg.dataset:
        raise ConfigError(f"data-parallel training (torchrun, slurm/train_multi.sh) is offline only: pass "
                          f"{name('dataset')}")
    checkpoint: Path | None = None
    resuming: list[str] = []  # the resume's lines: said once the run directory is locked (build)
    if req.resume is not None:
        state = _resume_state(req, cfg, changes, shard)
        if state is None:
            return None
        (checkpoint, resuming), init_from = state, None
    init_task_set = cfg.task_set if "task_set" in req.given else ()
    if init_from:
        cfg, init_note = architecture_from_checkpoint(cfg, init_from, set(req.given), req.from_python)
    try:
        device: torch.device | None = resolve_device(distributed.device_for(shard, cfg.device), req.from_python)
    except DeviceError:
        if not req.dry_run:
            raise
        device = None  # a dry run still estimates (for --gpu-mem, or to say there is no GPU)
    source: EnvSource = cfg.task if req.env is None else req.env
    tensor_spec = None if cfg.dataset else tensor_task_spec(source, cfg.num_envs, seed=cfg.seed,
                                                            action_repeat=cfg.action_repeat)
    tensor = tensor_spec is not None
    if tensor:
        _check_tensor_run(cfg)
    elif not cfg.dataset and isinstance(source, str):
        _check_no_tensor_task_among(source)
    spec, tasks = (tensor_spec, None) if tensor_spec is not None else env_spec(source, cfg)
    if init_from:  # weights for another task's sizes or kind of action: refused now, --dry-run included
        loaded = read_init(init_from, init_task_set, mmap=True)
        try:
            check_dims_match(loaded.dims, spec.obs_shape, spec.action_dim, spec.discrete, spec.task, init_from)
        except CheckpointError as e:
            if not loaded.imported or loaded.dims.multitask or "task" in req.given:
                raise
            raise CheckpointError(f"{e} (a reference TD-MPC2 checkpoint does not name its task: give the one it "
                                  f"was trained on, {name('task')})") from None
    run_dir = req.resume or (Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg.for_task(spec)))
    if req.resume is None:
        check_fresh(run_dir, req.from_python)  # early, before the memory plan; build() checks again under the lock

    def for_run(c: Config) -> Config:
        overlap = c.overlap_updates if c.overlap_updates is not None else overlap_default(device, tensor, c)
        return validate(dataclasses.replace(c.for_task(spec, len(tasks.tasks) if tasks else 1),
                                            run_dir=os.path.abspath(run_dir), overlap_updates=overlap),
                        req.from_python)

    filled = for_run(cfg)
    off_cuda = (cuda_only_notes(filled, device, req.given, req.from_python)
                + unused_setting_notes(filled, spec.discrete, req.given, req.from_python))
    plan = memory.assess_run(filled, spec.obs_shape, spec.action_dim, spec.episodic, device, req.gpu_mem,
                             req.fit_memory, resuming=req.resume is not None, tasks=tasks, discrete=spec.discrete,
                             tensor_envs=tensor, from_python=req.from_python)
    if plan.applied and plan.changes:  # task-derived fields (updates per round) follow the lowered settings
        filled = for_run(dataclasses.replace(cfg, **{k: new for ch in plan.changes for k, (_, new) in ch.values.items()}))
    if plan.chunked_from is not None:
        filled = dataclasses.replace(filled, plan_chunk_envs=plan.cfg.plan_chunk_envs)
    host_error = dataclasses.replace(plan, cfg=filled).host_error(available_host_memory())
    many_threads = threads_error(filled.threads, req.from_python)
    said = run_notes(filled, tasks, shard, req.from_python)
    if req.on_eval is not None and not filled.eval_episodes:
        said.append("note: on_eval is never called: eval_episodes=0 plays no evaluation")
    if req.dry_run and shard.main:
        if resuming:
            print("\n".join(resuming), file=sys.stderr)
        print(memory.dry_run_report(dataclasses.replace(plan, cfg=filled), spec.obs_shape, spec.action_dim, device,
                                    spec.discrete))
        if host_error:
            print(f"host memory: DOES NOT FIT this machine: {host_error}")
        if many_threads:
            print(f"threads: TOO MANY for this machine: {many_threads}")
        for line in (*req.notes, *off_cuda, init_note, *said):  # where the config came from, as a run says it
            if line:
                print(line, file=sys.stderr)
    if not plan.fits:
        raise BadInput(plan.error())
    if host_error and not req.dry_run:
        raise BadInput(host_error)
    if many_threads and not req.dry_run:
        raise BadInput(many_threads)
    if req.dry_run:
        return None
    assert device is not None
    cap = (cap_cuda_memory(device, plan.target.capacity, req.from_python)
           if req.gpu_mem and plan.target.capacity and device.type == "cuda" else None)
    notes = [n for n in (*req.notes, *off_cuda, memory.summary_line(plan), plan.chunk_line(), cap, init_note, *said)
             if n]
    user_env = req.env
    if isinstance(user_env, gym.Env) and (filled.eval_episodes or filled.num_envs > 1):
        _check_copyable(user_env)
    eval_source: EnvSource = (lambda: copy.deepcopy(user_env)) if isinstance(user_env, gym.Env) else source
    return RunSetup(filled, spec, tasks, run_dir, device, memory.buffer_storage(plan, device), shard, checkpoint,
                    init_from, source, source if tensor else eval_source, notes, tensor, init_task_set,
                    req.from_python, tuple(resuming))


def overlap_default(device: torch.device | None, tensor_envs: bool, cfg: Config) -> bool:
    """overlap_updates when unset: where a GPU's updates can run beside the host's env step."""
    return device is not None and device.type == "cuda" and not tensor_envs and not cfg.dataset


def _resume_state(req: RunRequest, cfg: Config, changes: dict[str, tuple[Any, Any]],
                  shard: distributed.Shard) -> tuple[Path, list[str]] | None:
    """The checkpoint a resume starts from and the lines that say what it continues and changes; None for a run
    that already reached its steps (said, nothing changed). Fewer steps than done: refused."""
    assert req.resume is not None
    checkpoint, resuming = resume_checkpoint(req.resume), []
    saved = load_file(checkpoint, mmap=True)
    done = saved.get("train", {})
    step = saved_step(done)
    if done.get("finished") and step >= cfg.steps:
        names = [named(n, None, req.from_python) for n in changes]
        if req.init_from:
            names.append(named("init_from", req.init_from, req.from_python))
        unused = f" ({', '.join(names)} not applied: nothing was changed)" if names else ""
        for line in req.notes:  # where the config came from (--cfg ignored)
            if line:
                say_once(line)
        more = named("steps", None, req.from_python)
        say_once(f"run in {req.resume} already finished at step {step:,}; pass {more} above it to extend it{unused}")
        return None
    if cfg.steps < step:  # it would end at once, evaluated and marked finished with a lower steps saved
        own = changes["steps"][0] if "steps" in changes else cfg.steps
        raise BadInput(f"{named('steps', cfg.steps, req.from_python)}: the run in {req.resume} is already at step "
                       f"{step:,}; give more to continue it, or leave it out (the run's own: {own:,}); nothing was "
                       f"changed")
    for name, (old, new) in changes.items():
        by = "fit()'s keywords" if req.from_python else "the command line"
        resuming.append(f"resume: {name} changed from {old!r} to {new!r} by {by}")
    if req.init_from:
        resuming.append(f"resume: {named('init_from', req.init_from, req.from_python)} ignored; the run's own "
                        f"checkpoint applies")
    ranks = saved.get("ranks")  # data-parallel processes of the session that wrote it (older files: not said)
    old_batch = (req.base or cfg).batch_size
    if ranks is not None and ranks * old_batch != shard.world * cfg.batch_size:
        resuming.append(f"resume: this run trained on {ranks} data-parallel process{'es' if ranks > 1 else ''} "
                        f"(global batch {ranks * old_batch}); it continues on {shard.world} (global batch "
                        f"{shard.world * cfg.batch_size}): --batch-size is per process")
    resuming.append(f"resume: continuing {req.resume} from step {step:,} ({checkpoint.name})")
    return checkpoint, resuming


def _absolute_paths(cfg: Config) -> Config:
    return dataclasses.replace(cfg, dataset=tuple(os.path.abspath(p) for p in cfg.dataset),
                               save_data=cfg.save_data and os.path.abspath(cfg.save_data))


def _check_copyable(env: gym.Env) -> None:
    """Evaluation (and envs past the first) play on deep copies of an env object: one that cannot be copied is
    refused before the run starts, not at its first evaluation."""
    try:
        copy.deepcopy(env)
    except Exception as e:
        name = type(env.unwrapped).__name__
        raise BadInput(f"fit(env=...): the {name} object cannot be copied ({type(e).__name__}: {e}), and evaluation "
                       f"and envs past the first play on copies of it: pass a function making one (env={name} or "
                       f"env=lambda: {name}(...))") from None


def env_spec(env: EnvSource, cfg: Config) -> tuple[EnvSpec, TaskSetup | None]:
    """What the model is built for: the data's (offline), a multi-task run's padded dims, or the task's, read
    off one environment (closed at once, unless it is the user's own env object). That env is stepped once (an
    observation of another shape than declared is refused now), so it is not one of the training envs: an env
    may keep state across resets."""
    if cfg.dataset:
        return offline_spec(cfg)
    tasks = task_setup(cfg) if isinstance(env, str) and env == cfg.task else None
    if tasks is not None:
        return tasks.spec(cfg), tasks
    built, spec = make_env(env, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
    try:
        check_observations(built, spec, step=not isinstance(env, gym.Env))
    finally:
        if not isinstance(env, gym.Env):
            built.close()
    return spec, None


def _check_tensor_run(cfg: Config) -> None:
    """What tensor-native envs do not do (yet), refused in one line before anything is built."""
    refused = {"save_data": cfg.save_data, "save_video": cfg.save_video, "obs": cfg.obs != "state",
               "vectorization": cfg.vectorization != "sync", "task_set": bool(cfg.task_set),
               "overlap_updates": bool(cfg.overlap_updates)}  # their step is device work: nothing to overlap
    for name, on in refused.items():
        if on:
            raise BadInput(f"--{name.replace('_', '-')} is not supported with tensor-native envs ({cfg.task}); "
                           f"see docs/gpu-simulators.md")


def _check_no_tensor_task_among(task: str) -> None:
    """A multi-task run steps host envs, one copy per env: a tensor-native task in its list is refused in one line
    (not stepped on the host behind the user's back)."""
    tasks = expand(task)
    if len(tasks) > 1:
        for name in tasks:
            if is_tensor_task(name):
                raise BadInput(f"multi-task runs are not supported with tensor-native envs ({name} in --task {task}); "
                               f"train it alone, see docs/gpu-simulators.md")


def build(s: RunSetup, no_buffer: bool = False, on_log: Callback | None = None,
          on_eval: Callback | None = None) -> Trainer:
    """The parts of the run, handed to its loop. A fresh run directory whose setup fails is removed: a bad
    input leaves nothing behind."""
    cfg = s.cfg
    lock = RunDirLock(s.run_dir)  # one writer per run directory, before anything is written
    if s.shard.main:
        lock.acquire(s.from_python)
        for line in s.resuming:  # the run is this process's now: what its resume continues, before what it restores
            print(line, file=sys.stderr)
        for stale in remove_stale_temp_files(s.run_dir):
            print(f"removed {stale}, left by a write that was killed", file=sys.stderr)
        if not s.resume:
            set_aside_unfinished(s.run_dir)
    data, envs = None, None
    try:
        data = open_offline(cfg, s.device, cfg.seed, (s.shard.rank, s.shard.world)).sampler if cfg.dataset else None
        envs = None if cfg.dataset else _vector_envs(s)
        torch.manual_seed(cfg.seed)
        lengths = s.tasks.episode_lengths if s.tasks else s.spec.episode_length
        agent = Agent(cfg, model_dims(cfg, s.spec, s.tasks), lengths, s.device, s.shard)
        if s.init_from:
            line = init_weights(agent.model, s.init_from, s.spec.obs_shape, s.spec.action_dim, s.spec.discrete,
                                s.spec.task, s.init_task_set)
            if s.shard.main:
                print(line, file=sys.stderr)
            agent.weights_changed()
        trainer: Trainer
        if data is not None:
            trainer = OfflineTrainer(s, agent, data, lock, on_log, on_eval)
        else:
            assert envs is not None
            env_tasks = None if s.tasks is None else s.tasks.env_tasks(cfg.num_envs)
            buffer = ReplayBuffer(cfg.buffer_size, envs.num_envs, s.spec.obs_shape, s.spec.action_dim, cfg.horizon,
                                  obs_dtype=torch.uint8 if cfg.obs == "rgb" else torch.float32, device=s.device,
                                  storage=s.buffer_storage, env_tasks=env_tasks, discrete=s.spec.discrete)
            recorder = None if not cfg.save_data or not s.shard.main else EpisodeRecorder(DatasetWriter(
                cfg.save_data, s.spec.obs_shape, s.spec.action_dim, s.tasks.task_set if s.tasks else (cfg.task,),
                cfg.obs, cfg.action_repeat or 1, f"tdmpc.train --save-data, run {s.run_dir}",
                s.tasks.obs_dims if s.tasks else None, s.tasks.action_dims if s.tasks else None,
                discrete=s.spec.discrete, action_start=task_action_start(
                    s.env, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat) if s.spec.discrete else 0),
                env_tasks if env_tasks is not None else np.zeros(envs.num_envs, dtype=np.int64))
            trainer = OnlineTrainer(s, agent, envs, buffer, recorder, lock, no_buffer, on_log, on_eval)
            if s.shard.main:
                trainer.warn_if_disk_short()
        set_threads(cfg.threads, s.from_python)
        return trainer
    except BaseException:
        for part in (envs, data):
            if part is not None:
                part.close()
        lock.abandon()
        raise


def model_dims(cfg: Config, spec: EnvSpec, tasks: TaskSetup | None) -> ModelDims:
    """The model a run trains: for the task of `spec`, or a multi-task one over the task set."""
    assert cfg.episodic is not None
    if tasks is None:
        return ModelDims.from_config(cfg, spec.obs_shape, spec.action_dim, cfg.episodic, discrete=spec.discrete)
    return ModelDims.from_config(cfg, spec.obs_shape, spec.action_dim, cfg.episodic, tasks.task_set,
                                 tasks.action_dims)


def _vector_envs(s: RunSetup) -> LockstepEnv:
    """The training envs: a tensor-native vector env, or numpy ones (num_envs of the task, or of each task of a
    multi-task run) behind HostVectorEnv; async workers ignore SIGINT/SIGTERM so only the trainer handles a stop."""
    cfg = s.cfg
    if s.tensor_envs:
        return make_tensor_vector_env(s.env, cfg.num_envs, seed=cfg.seed, device=s.device)[0]  # type: ignore[arg-type]
    asynchronous = cfg.vectorization == "async"
    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)} if asynchronous else {}
    try:
        if s.tasks is None:
            envs = make_envs(s.env, cfg.num_envs, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat,
                             asynchronous=asynchronous)
        else:
            envs = make_envs(s.tasks.tasks, cfg.num_envs, seed=cfg.seed, action_repeat=s.tasks.action_repeat,
                             pad_to=(s.tasks.obs_dim, s.tasks.action_dim), asynchronous=asynchronous)
        return HostVectorEnv(envs, s.spec.task)
    finally:
        for sig, h in ignored.items():
            signal.signal(sig, h)


def open_run(req: RunRequest) -> Trainer | None:
    """prepare() and build(), then the lines a user should see before training starts; None where prepare() says
    there is nothing to run."""
    setup = prepare(req)
    if setup is None:
        return None
    trainer = build(setup, req.no_buffer, req.on_log, req.on_eval)
    for line in setup.notes:  # beside the progress bar, which is drawn by now
        trainer.logger.message(line)
    return trainer


def run(trainer: Trainer) -> int:
    """The loop, to the config's steps (a finished run given more steps goes on), after a warning where a CPU
    would take hours (a trainer driven by hand, trainer_for's, sets its own end)."""
    if trainer.device.type == "cpu" and isinstance(trainer, OnlineTrainer):
        speed.warn_if_slow(trainer)
    trainer.counters.finished = False
    return trainer.run()


def trainer_for(cfg: Config, run_dir: Path, device: torch.device, resume: bool = False,
                gpu_mem: str | None = None) -> Trainer:
    """The trainer the pipeline builds for `cfg` in `run_dir` on `device`, to drive its loop by hand (tests,
    notebooks, benchmarks); `gpu_mem` as tdmpc.train's --gpu-mem."""
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir), device=str(device))
    trainer = open_run(RunRequest(cfg, resume=Path(run_dir) if resume else None,
                                  base=saved_config(Path(run_dir)) if resume else None, gpu_mem=gpu_mem))
    assert trainer is not None
    return trainer


def fit(env: EnvSource | None = None, *, cfg: Config | None = None, run_dir: str | Path | None = None,
        resume: bool = False, init_from: str | Path | None = None, on_log: Callback | None = None,
        on_eval: Callback | None = None, config_from_checkpoint: bool = False, no_buffer: bool = False,
        gpu_mem: str | None = None, fit_memory: bool = False, **overrides: Any) -> tuple[Path, Agent]:
    """Train an agent and return (run_dir, agent).

    env: a task name ('walker-walk', 'Pendulum-v1'), a gymnasium env, or a zero-argument function making
    one (default: cfg.task); or a gymnasium vector env speaking torch tensors (a GPU simulator's, trained as
    it is: docs/gpu-simulators.md). An env object is used as it is for the first environment; more environments
    (num_envs > 1) and evaluation use deep copies of it. Every Config field is a keyword (steps=20_000,
    model_size=1, ...), applied over `cfg` (default: what tdmpc.train starts from, cpu.json without a GPU).
    resume=True continues the run in run_dir, from its config.json (cfg= is not read then; keywords override it) or,
    with config_from_checkpoint=True, the config its checkpoint holds (when config.json is damaged or missing);
    no_buffer=True resumes without the saved replay buffer (a damaged one: it refills by acting).
    gpu_mem ('16GiB') plans memory for a card of that size and, on a larger one, caps the allocator at it;
    fit_memory=True lowers the settings that do not fit it (as tdmpc.train's --gpu-mem and --fit-memory).
    on_log / on_eval get each train.csv / eval.csv row as a dict;
    returning False stops the run (a checkpoint is written, so it can be resumed) and fit returns.

    A stop signal also writes a checkpoint, then goes on as the signal would: Ctrl-C (SIGINT) raises
    KeyboardInterrupt, SIGTERM or SIGUSR1 (a scheduler's) exits with tdmpc.train's requeue code, 3. A run that
    stops on an error it reports (out of memory, ...) raises RunFailed."""
    if importing_main_in_a_worker():  # an unguarded script, imported again by an env's process: no second run,
        raise SystemExit(EXIT_BAD_INPUT)  # and no second report: the script's own process says what to do
    if cfg is not None and not isinstance(cfg, Config):
        raise BadInput(f"fit(cfg=...) takes a tdmpc Config (or pass its fields as keywords), not a "
                       f"{type(cfg).__name__}")
    for name, fn in (("on_log", on_log), ("on_eval", on_eval)):
        if fn is not None and not callable(fn):
            raise BadInput(f"fit({name}=...) takes a function of one row (a dict), not a {type(fn).__name__}")
    if isinstance(env, str) and "task" in overrides and overrides["task"] != env:
        raise BadInput(f"fit(env={env!r}, task={overrides['task']!r}): two tasks; give one of them")
    if run_dir is not None:
        overrides["run_dir"] = str(run_dir)
    if isinstance(env, str):
        overrides.setdefault("task", env)
    if resume and run_dir is None:
        raise BadInput("resume=True needs the run_dir of the run to continue")
    if resume and cfg is not None:
        raise BadInput("fit(resume=True) continues with the run's own config.json, so cfg= would not be read: pass "
                       "the fields to change as keywords (steps=...)")
    for name, given in (("config_from_checkpoint", config_from_checkpoint), ("no_buffer", no_buffer)):
        if given and not resume:
            raise BadInput(f"fit({name}=True) applies to a resume: pass resume=True and the run_dir")
    resumed = Path(run_dir) if resume and run_dir is not None else None
    base = (saved_config(resumed, config_from_checkpoint, from_python=True) if resumed
            else cfg or base_config(TrainArgs()))
    config = from_dict(overrides, source="fit() keywords", base=base)
    trainer = open_run(RunRequest(config, resume=resumed, no_buffer=no_buffer, gpu_mem=gpu_mem, fit_memory=fit_memory,
                                  init_from=str(init_from) if init_from else None,
                                  given=frozenset(overrides), base=base if resume else None,
                                  env=None if isinstance(env, str) else env, on_log=on_log, on_eval=on_eval,
                                  from_python=True,
                                  notes=(base_note(TrainArgs(), "cfg=tdmpc.config.load_json('a4000.json')")
                                         if cfg is None and not resumed else None,)))
    if trainer is None:  # a resumed run that had already reached its steps
        assert resumed is not None
        return resumed, Agent.from_checkpoint(resume_checkpoint(resumed, say=False), device=config.device)
    code = run(trainer)
    if code == EXIT_REQUEUE and trainer.stop_signal == signal.SIGINT:
        raise KeyboardInterrupt
    if code == EXIT_REQUEUE and trainer.stop_signal is not None:
        raise SystemExit(EXIT_REQUEUE)
    if code not in (EXIT_OK, EXIT_REQUEUE):
        raise RunFailed(f"the run in {trainer.run_dir} stopped: "
                        + (trainer.error_message or "see the error above; its last checkpoint is kept"))
    return trainer.run_dir, trainer.agent
