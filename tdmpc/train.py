"""python -m tdmpc.train --cfg cpu.json: online TD-MPC2 training with evaluation, checkpoints, exact resume.

Steps are environment steps, action repeat included (the convention of published curves).
SIGTERM, SIGINT or SIGUSR1 finish the current step, write a checkpoint and exit with code 3.
Before starting, the peak device memory is estimated (tdmpc.memory) and checked against the
card; running out of device memory anyway writes a checkpoint and exits with code 1.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tdmpc import checkpoint, memory
from tdmpc.agent import Agent
from tdmpc.buffer import Batch, ReplayBuffer
from tdmpc.cli import EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, BadInput, run_cli
from tdmpc.config import MODEL_SIZES, Config, from_dict, load_json, parse_cli, peek_flag, save_json, validate
from tdmpc.device import DeviceError, resolve_device, resolve_dtype
from tdmpc.envs import EnvSpec, env_rng_state, make_env, make_vector_env, set_env_rng_state
from tdmpc.evaluate import check_dims_match, read_checkpoint, run_episodes
from tdmpc.logger import RunLogger
from tdmpc.world_model import ModelDims


class TrainingDiverged(RuntimeError):
    """Most updates produce non-finite gradients; continuing would waste the allocation."""


STOP_SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, s))


@dataclass
class TrainArgs:
    cfg: Optional[str] = None
    """JSON config: a name in configs/ (cpu.json, a4000.json) or a path. Flags below override it."""
    resume: Optional[str] = None
    """Continue the run in this directory from its latest checkpoint (flags override its config.json)."""
    init_from: Optional[str] = None
    """Start from these weights: a tdmpc checkpoint or a reference TD-MPC2 one."""
    dry_run: bool = False
    """Print the peak memory estimate (a breakdown) and a verdict for this device or --gpu-mem, and exit
    without training."""
    gpu_mem: Optional[str] = None
    """Plan memory for a card of this size instead of the detected one: 16GB, 16000MB, 8GiB (GB = 10^9
    bytes, GiB = 2^30). Budget = that less a 10% safety margin."""
    fit_memory: bool = False
    """When the estimate exceeds the budget, lower settings until it fits, logging each change, in this
    order: 1. buffer_device device -> host; 2. CUDA graphs off; 3. halve num_envs (not on resume);
    4. halve batch_size (not below 64); 5. halve num_samples (not below 256); 6. the next smaller
    model_size (not on resume). Without it, the run stops and says what to lower."""


@dataclass
class Counters:
    """Where a run is; saved in every checkpoint so a resume continues from the same step."""

    env_step: int = 0  # environment steps, action repeat included
    vector_steps: int = 0  # calls to envs.step()
    episodes: int = 0
    updates: int = 0
    burst_left: int = -1  # pretraining updates still to do; -1 until seeding ends
    next_eval: int = 0
    next_log: int = 0
    next_save: int = 0
    last_eval: int = -1
    elapsed: float = 0.0  # seconds of training, over all sessions
    finished: bool = False


def resolve(cfg: Config, spec: EnvSpec) -> Config:
    """Fill the task-dependent fields, so config.json records what the run really used."""
    seed_steps = cfg.seed_steps if cfg.seed_steps is not None else \
        max(1000, 5 * spec.episode_length) * spec.action_repeat
    return dataclasses.replace(cfg, episodic=spec.episodic if cfg.episodic is None else cfg.episodic,
                               action_repeat=spec.action_repeat, seed_steps=seed_steps)


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, device: torch.device, resume: bool = False,
                 init_from: str | None = None, buffer_storage: torch.device | None = None,
                 memory_target: memory.Target | None = None):
        """buffer_storage: where the replay buffer lives (None: from cfg.buffer_device, 'auto' asking the
        memory estimate); memory_target: the card the run was planned for (None: the detected one)."""
        self.device, self.run_dir = device, run_dir
        self.memory_target = memory_target
        self._doing = "setup"  # "act", "update" or "evaluation": named if the device runs out of memory
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.envs, spec = _make_envs(cfg)
        self.cfg = cfg = resolve(cfg, spec)
        self.spec = spec
        self.dims = ModelDims.from_config(cfg, spec.obs_shape, spec.action_dim, cfg.episodic)
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.agent = Agent(cfg, self.dims, spec.episode_length, device)
        storage = buffer_storage or self._buffer_storage()
        self.buffer = ReplayBuffer(cfg.buffer_size, cfg.num_envs, spec.obs_shape, spec.action_dim, cfg.horizon,
                                   obs_dtype=torch.uint8 if cfg.obs == "rgb" else torch.float32,
                                   device=device, storage=storage)
        self.c = Counters(next_eval=cfg.eval_freq, next_log=cfg.log_every, next_save=cfg.save_every)
        self.stop_signal: int | None = None
        self._metric_sum: dict[str, torch.Tensor] | None = None
        self._metric_n = 0
        self._ep_return = np.zeros(cfg.num_envs)
        self._ep_length = np.zeros(cfg.num_envs, dtype=np.int64)
        self._ended: list[tuple[float, int]] = []  # episodes finished since the last log row
        self._mark = (time.time(), 0, 0)  # (time, env_step, updates) at the last log row: rates
        self._last_bar = 0.0
        if init_from:
            self._init_weights(init_from)
        ckpt = None
        if resume:
            ckpt = checkpoint.load_file(self.ckpt_dir / "latest.pt")
            self._restore(ckpt)
        run_dir.mkdir(parents=True, exist_ok=True)
        save_json(cfg, run_dir / "config.json")
        self.logger = RunLogger(run_dir, cfg, cfg.steps, self.c.env_step)
        if resume:
            self.logger.train_csv.truncate_after(self.c.env_step)
            self.logger.eval_csv.truncate_after(self.c.env_step)
        self.obs, _ = self.envs.reset(seed=None if resume else cfg.seed)
        self.first = np.ones(cfg.num_envs, dtype=bool)
        self.buffer.start(torch.from_numpy(self.obs))

    @property
    def ckpt_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def _buffer_storage(self) -> torch.device:
        """'auto': on the device if the whole memory estimate fits the card, else pinned host memory."""
        cfg, device = self.cfg, self.device
        if cfg.buffer_device == "host" or (cfg.buffer_device == "auto" and device.type == "cuda"
                                           and not self._memory_plan().buffer_on_device):
            return torch.device("cpu")
        return device

    def _memory_plan(self, cfg: Config | None = None, budget: int | None = None) -> memory.Plan:
        """This run's estimate on its target (or on a budget of `budget` bytes), with the way to fit it."""
        cfg = cfg or self.cfg
        target = self.memory_target or memory.detect_target(cfg, self.device)
        if budget is not None:
            target = dataclasses.replace(target, capacity=int(budget / (1 - memory.SAFETY_MARGIN)))
        return memory.plan(cfg, self.spec.obs_shape, self.spec.action_dim, bool(cfg.episodic), target,
                           resuming=True)

    # --- the loop -----------------------------------------------------------------
    def run(self) -> int:
        handlers = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        try:
            try:
                return self._loop()
            except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or an error it caused (a graph capture)
                oom = _out_of_memory_error(e)
                if oom is None:
                    raise
                what = str(oom).strip().splitlines()[0] if str(oom).strip() else "CUDA out of memory"
            return self._out_of_memory(what)  # outside the handler: the traceback's tensors are freed
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.logger.close()
            self.envs.close()

    def _loop(self) -> int:
        cfg, c = self.cfg, self.c
        t_start = time.time() - c.elapsed
        self._mark = (time.time(), c.env_step, c.updates)
        while c.env_step < cfg.steps and self.stop_signal is None:
            if c.env_step >= c.next_eval and not self._evaluate():
                break
            self._step()
            c.elapsed = time.time() - t_start
            if c.env_step >= c.next_log:
                self._log()
            if c.env_step >= c.next_save and self.stop_signal is None:
                self.save()
                c.next_save = _next_multiple(c.env_step, cfg.save_every)
            self._progress()
        if self.stop_signal is not None:
            self.save()
            self.logger.message(f"stopped by signal {signal.Signals(self.stop_signal).name} at step "
                                f"{c.env_step:,}; checkpoint written. Resume with: "
                                f"python -m tdmpc.train --resume {self.run_dir}")
            return EXIT_REQUEUE
        if c.last_eval != c.env_step and not self._evaluate():
            self.save()
            return EXIT_REQUEUE
        c.finished = True
        self.save()
        self.logger.message(f"finished {c.env_step:,} env steps in {c.elapsed / 60:.1f} min; "
                            f"results in {self.run_dir}")
        return EXIT_OK

    def _out_of_memory(self, what: str) -> int:
        """Free what can be freed, write a checkpoint, set the estimate beside the real peak, advise."""
        c, cuda = self.c, self.device.type == "cuda"
        for optim in (self.agent.optim, self.agent.pi_optim):
            optim.zero_grad(set_to_none=True)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        try:
            self.save()
            saved = f"checkpoint written at step {c.env_step:,}"
        except Exception as e:  # e.g. the device is unusable after a failed graph capture
            saved = f"no checkpoint could be written ({type(e).__name__}: {e}); the last one in {self.ckpt_dir} stays"
        # The estimate for the buffer where it really is, beside torch's own peak.
        on_device = "device" if self.buffer.storage.type == "cuda" else "host"
        plan = self._memory_plan(dataclasses.replace(self.cfg, buffer_device=on_device))
        est, gib = plan.estimate, memory.fmt_bytes
        if cuda:
            actual = (f"actual peak {gib(torch.cuda.max_memory_allocated(self.device))} allocated, "
                      f"{gib(torch.cuda.max_memory_reserved(self.device))} reserved")
        else:
            actual = "actual peak not measurable here (no CUDA device)"
        # Reality exceeded the estimate: the settings a resume may change that take it 25% lower.
        flags = self._memory_plan(plan.cfg, budget=int(0.75 * est.total)).flags() or "--batch-size N --num-samples N"
        self.logger.message(
            f"error: out of device memory in {self._doing} at step {c.env_step:,} ({what}); {saved}.\n"
            f"memory: estimate {gib(est.total)} in all, {gib(est.peak_allocated)} of tensors at the peak, on "
            f"{plan.target.label}; {actual}.\n"
            f"advice: resume with lower settings: python -m tdmpc.train --resume {self.run_dir} {flags} "
            f"(--dry-run shows the breakdown)")
        return EXIT_ERROR

    def _on_signal(self, signum: int, frame) -> None:
        self.stop_signal = signum
        if signum == signal.SIGINT:  # a second Ctrl-C aborts at once
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def _step(self) -> None:
        """One step of all N envs, its transitions into the buffer, then any updates due."""
        cfg, c = self.cfg, self.c
        N = cfg.num_envs
        if c.env_step < cfg.seed_steps:
            action = self.rng.uniform(-1, 1, (N, self.spec.action_dim)).astype(np.float32)
        else:
            self._doing = "act"
            action = self.agent.act(self.obs, self.first)
        obs, reward, terminated, truncated, info = self.envs.step(action)
        done = terminated | truncated
        stored = obs
        if done.any():  # SAME_STEP autoreset: obs already holds the next episode's first observation
            stored = obs.copy()
            for i in np.flatnonzero(done):
                stored[i] = info["final_obs"][i]
        self.buffer.add(torch.from_numpy(stored), torch.from_numpy(action),
                        torch.from_numpy(reward.astype(np.float32)), torch.from_numpy(terminated))
        self._ep_return += reward
        self._ep_length += 1
        if done.any():
            ended = np.flatnonzero(done)
            self.buffer.start(torch.from_numpy(obs[ended]), ended)
            self._ended += [(float(self._ep_return[i]), int(self._ep_length[i])) for i in ended]
            self._ep_return[ended], self._ep_length[ended] = 0, 0
            c.episodes += len(ended)
        self.obs, self.first = obs, done
        c.vector_steps += 1
        c.env_step += N * cfg.action_repeat

        if c.env_step < cfg.seed_steps:
            return
        if c.burst_left < 0:  # seeding just ended: pretrain on the seed data
            rounds = c.vector_steps // cfg.update_every
            c.burst_left = rounds * cfg.updates_per_round
            self.logger.message(f"seeding done at step {c.env_step:,}: {c.burst_left:,} pretraining updates")
        if c.burst_left > 0:
            while c.burst_left > 0 and self.stop_signal is None:
                self._update()
                c.burst_left -= 1
                if c.burst_left % 100 == 0:
                    self._progress(force=True)
        elif c.vector_steps % cfg.update_every == 0:
            for _ in range(cfg.updates_per_round):
                self._update()

    def _update(self) -> None:
        self._doing = "update"
        metrics = self.agent.update(self.buffer.sample(self.cfg.batch_size))
        if self.cfg.debug:
            bad = [k for k, v in metrics.items() if not torch.isfinite(v).all()]
            if bad:
                raise FloatingPointError(f"non-finite metrics at update {self.c.updates}: {bad}")
        if self._metric_sum is None:
            self._metric_sum = {k: v.detach().clone().float() for k, v in metrics.items()}
        else:
            torch._foreach_add_(list(self._metric_sum.values()), [v.float() for v in metrics.values()])
        self._metric_n += 1
        self.c.updates += 1

    def _evaluate(self) -> bool:
        """Run the eval episodes; False if a stop signal arrived meanwhile (the eval is redone on resume)."""
        cfg, c = self.cfg, self.c
        if cfg.eval_episodes == 0:
            c.next_eval = _next_multiple(c.env_step, cfg.eval_freq)
            return True
        video = self.run_dir / "videos" / f"step_{c.env_step:09d}.mp4" if cfg.save_video else None
        t0 = time.time()
        self._doing = "evaluation"
        res = run_episodes(self.agent, cfg.task, cfg.eval_episodes, seed=1_000_003 * (cfg.seed + 1),
                           obs=cfg.obs, action_repeat=cfg.action_repeat, video=video,
                           stop=lambda: self.stop_signal is not None)
        if res is None:
            return False
        self.logger.eval({"env_step": c.env_step, **res.summary(), "eval_seconds": round(time.time() - t0, 1),
                          "elapsed": round(c.elapsed, 1)})
        c.next_eval = _next_multiple(c.env_step, cfg.eval_freq)
        c.last_eval = c.env_step
        self._mark = (time.time(), c.env_step, c.updates)  # keep eval time out of the step rate
        return True

    def _log(self) -> None:
        """One train.csv row: the only place device metrics are read back to the host."""
        c = self.c
        now = time.time()
        t0, s0, u0 = self._mark
        row = {"env_step": c.env_step, "episodes": c.episodes, "updates": c.updates,
               "elapsed": round(c.elapsed, 1),
               "env_steps_per_s": (c.env_step - s0) / max(now - t0, 1e-9),
               "updates_per_s": (c.updates - u0) / max(now - t0, 1e-9),
               "episode_return": float(np.mean([r for r, _ in self._ended])) if self._ended else float("nan"),
               "episode_length": float(np.mean([n for _, n in self._ended])) if self._ended else float("nan")}
        if self._metric_sum is not None:
            values = torch.stack(list(self._metric_sum.values())).cpu().tolist()
            row.update({k: v / self._metric_n for k, v in zip(self._metric_sum, values)})
        self.logger.train(row)
        if self._metric_n >= 10 and row.get("skipped", 0.0) > 0.5:
            raise TrainingDiverged(
                f"training diverged: {row['skipped']:.0%} of the last {self._metric_n} updates had non-finite "
                f"gradients and were skipped; the last checkpoint is in {self.ckpt_dir}. Try a lower --lr"
                + (" or --train-precision fp32" if self.cfg.train_precision == "bf16" else ""))
        self._metric_sum, self._metric_n, self._ended = None, 0, []
        self._mark = (now, c.env_step, c.updates)
        c.next_log = _next_multiple(c.env_step, self.cfg.log_every)

    def _progress(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_bar < 0.5:
            return
        self._last_bar = now
        t0, s0, u0 = self._mark
        dt = max(now - t0, 1e-9)
        self.logger.progress(self.c.env_step, (self.c.env_step - s0) / dt, (self.c.updates - u0) / dt)

    # --- checkpoints ----------------------------------------------------------------
    def save(self) -> None:
        """Buffer first (new file name), then latest.pt naming it: a crash leaves a consistent pair."""
        cfg, c = self.cfg, self.c
        buffer_file = None
        if cfg.save_buffer:
            buffer_file = f"buffer_{c.env_step:010d}.h5"
            self.buffer.save(self.ckpt_dir / buffer_file)
        rng = {"torch": torch.get_rng_state(), "numpy": self.rng.bit_generator.state,
               "envs": env_rng_state(self.envs)}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        self.agent.save(self.ckpt_dir / "latest.pt", {
            "train": dataclasses.asdict(c), "rng": rng, "buffer_file": buffer_file,
            "buffer_meta": {"ptr": self.buffer.ptr.tolist(), "filled": self.buffer.filled}})
        for old in self.ckpt_dir.glob("buffer_*.h5"):
            if old.name != buffer_file:
                old.unlink()

    def _restore(self, obj: dict) -> None:
        source = str(self.ckpt_dir / "latest.pt")
        self.agent.load_state_dict(obj, source)
        self.c = Counters(**obj["train"])
        rng = obj["rng"]
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.rng.bit_generator.state = rng["numpy"]
        set_env_rng_state(self.envs, rng["envs"])
        if obj.get("buffer_file"):
            self.buffer.load(self.ckpt_dir / obj["buffer_file"])
        self.buffer.end_episodes()  # the episode in flight at the stop is discarded, see README

    def _init_weights(self, path: str) -> None:
        """Model weights (online and target) from our checkpoint or a reference one; optimisers start fresh."""
        ck = read_checkpoint(Path(path), {})
        check_dims_match(ck.dims, self.spec, path)
        if _architecture(ck.dims) != _architecture(self.dims):
            raise checkpoint.CheckpointError(
                f"{path}: architecture differs from this config ({_dims_diff(ck.dims, self.dims)}); drop those "
                f"flags and --init-from takes the checkpoint's architecture")
        checkpoint.load_state_strict(self.agent.model, ck.state["model"], path)
        origin = "an imported reference TD-MPC2 checkpoint" if ck.imported else "a tdmpc checkpoint"
        print(f"initialised weights from {origin}: {path}", file=sys.stderr)


def warn_if_slow_on_cpu(trainer: Trainer, limit_hours: float = 3.0) -> None:
    """Time one act() and one update() at this config and warn when the run would take too long here."""
    cfg, c = trainer.cfg, trainer.c
    agent, spec = copy.deepcopy(trainer.agent), trainer.spec  # timing updates must not touch the run
    obs = np.zeros((cfg.num_envs, *spec.obs_shape), dtype=np.float32 if cfg.obs == "state" else np.uint8)
    first = np.ones(cfg.num_envs, dtype=bool)
    H, B = cfg.horizon, cfg.batch_size
    batch = Batch(torch.zeros(H + 1, B, *spec.obs_shape), torch.zeros(H, B, spec.action_dim), torch.zeros(H, B),
                  torch.zeros(H, B, dtype=torch.bool))
    rng = torch.get_rng_state()
    timings = []
    for fn in (lambda: agent.act(obs, first, role="timing"), lambda: agent.update(batch)):
        fn()
        t0 = time.perf_counter()
        fn()
        timings.append(time.perf_counter() - t0)
    torch.set_rng_state(rng)
    left_vector_steps = max(cfg.steps - c.env_step, 0) / (cfg.num_envs * cfg.action_repeat)
    hours = left_vector_steps * (timings[0] + timings[1] * cfg.updates_per_round / cfg.update_every) / 3600
    if hours > limit_hours:
        trainer.logger.message(
            f"warning: on this CPU one plan takes {timings[0] * 1e3:.0f} ms and one update {timings[1] * 1e3:.0f} ms, "
            f"so {cfg.steps - c.env_step:,} env steps would take about {hours:.0f} hours. This config is sized for a "
            f"GPU; for CPU training use --cfg cpu.json")


def _architecture(dims: ModelDims) -> dict:
    """The fields of ModelDims that fix the networks (dropout is a training setting; the pixel
    encoder has no enc_dim/num_enc_layers, the state encoder no num_channels)."""
    unused = {"dropout"} | ({"enc_dim", "num_enc_layers"} if dims.pixels else {"num_channels"})
    return {k: v for k, v in dims.to_dict().items() if k not in unused}


def _dims_diff(a: ModelDims, b: ModelDims) -> str:
    arch_a, arch_b = _architecture(a), _architecture(b)
    diffs = [f"{k}: checkpoint {arch_a[k]}, config {arch_b.get(k)}" for k in arch_a if arch_a[k] != arch_b.get(k)]
    return ", ".join(diffs[:4])


# Config fields that --init-from takes from the checkpoint unless given on the command line.
ARCH_FIELDS = ("enc_dim", "mlp_dim", "latent_dim", "num_enc_layers", "num_q", "episodic", "num_bins",
               "num_channels", "log_std_min", "log_std_max", "obs")
SIZE_FIELDS = ARCH_FIELDS[:5]  # what --model-size sets


def _on_command_line(argv: list[str], name: str) -> bool:
    flags = {"--" + name.replace("_", "-"), "--no-" + name.replace("_", "-")}
    return any(arg.split("=", 1)[0].replace("_", "-") in flags for arg in argv if arg.startswith("--"))


def architecture_from_checkpoint(cfg: Config, path: str, argv: list[str]) -> tuple[Config, str]:
    """--init-from: the architecture the user did not set as flags comes from the checkpoint, so a
    released model fine-tunes without spelling out its sizes. Sizes set as flags stay, and if they
    contradict the checkpoint, loading it fails with 'architecture differs'.

    Returns the config and a note saying what was taken (printed once the weights have loaded)."""
    dims = read_checkpoint(Path(path), {}, mmap=True).dims  # shapes only: tensors stay on disk
    theirs = {name: getattr(dims, name) for name in ARCH_FIELDS if name != "obs"}
    theirs["obs"] = "rgb" if dims.pixels else "state"
    given = {name for name in ("model_size", *ARCH_FIELDS) if _on_command_line(argv, name)}
    if "model_size" in given:  # the preset asked for stands
        given |= set(SIZE_FIELDS)
    take = {name: value for name, value in theirs.items() if name not in given}
    sizes = {**cfg.arch(), **{k: v for k, v in take.items() if k in SIZE_FIELDS}}
    preset = next((n for n, p in MODEL_SIZES.items() if p == tuple(sizes[k] for k in SIZE_FIELDS)), None)
    model_size = cfg.model_size if "model_size" in given else preset
    new = dataclasses.replace(cfg, **{**take, **sizes, "model_size": model_size})

    shown = {k: v for k, v in take.items() if k in (*SIZE_FIELDS, "episodic") or v != getattr(cfg, k)}
    if not shown:
        return validate(new), ""
    size = f" (model size {preset})" if preset and "model_size" not in given else ""
    return validate(new), (f"init-from: architecture from the checkpoint{size}: "
                           + ", ".join(f"{k} {v}" for k, v in shown.items()))


def _out_of_memory_error(e: BaseException) -> BaseException | None:
    """The torch.cuda.OutOfMemoryError behind `e`: itself, or the one being handled when `e` was raised
    (a CUDA graph capture that ran out of memory fails again when the capture is closed)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _next_multiple(step: int, every: int) -> int:
    return (step // every + 1) * every


def _make_envs(cfg: Config):
    """Vector envs; async workers ignore SIGINT/SIGTERM so only the trainer handles a stop."""
    ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)} \
        if cfg.vectorization == "async" else {}
    try:
        return make_vector_env(cfg.task, cfg.num_envs, seed=cfg.seed, obs=cfg.obs,
                               action_repeat=cfg.action_repeat, asynchronous=cfg.vectorization == "async")
    finally:
        for s, h in ignored.items():
            signal.signal(s, h)


def set_aside_unfinished(run_dir: Path) -> None:
    """A fresh start in a directory that an earlier session left without a checkpoint (a node
    failure, say): move its files into no-checkpoint-<time>/, so no step appears twice in
    train.csv and nothing is deleted."""
    leftovers = [p for p in run_dir.glob("*") if p.name in ("train.csv", "eval.csv", "config.json", "tb",
                                                            "checkpoints", "videos")] if run_dir.is_dir() else []
    if not leftovers:
        return
    stale = run_dir / f"no-checkpoint-{time.strftime('%Y%m%d-%H%M%S')}"
    stale.mkdir()
    for p in leftovers:
        p.rename(stale / p.name)
    print(f"{run_dir} held files of a session that left no checkpoint; moved them to {stale}", file=sys.stderr)


def _plan_memory(cfg: Config, args: TrainArgs, device: torch.device | None,
                 resuming: bool) -> tuple[Config, memory.Plan]:
    """Estimate peak device memory for the task's dims on this device (or --gpu-mem); with --fit-memory
    lower settings until it fits (each change logged). The dry run prints the breakdown and verdict;
    a real run prints one line. Returns the config to run (changed only by --fit-memory)."""
    spec = _env_spec(cfg)
    resolved = resolve(cfg, spec)
    try:
        target = memory.detect_target(cfg, device, args.gpu_mem)
    except ValueError as e:
        raise BadInput(f"--gpu-mem: {e}") from None
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    mem = memory.plan(resolved, spec.obs_shape, spec.action_dim, bool(resolved.episodic), target,
                      fit=args.fit_memory, resuming=resuming, log=log)
    if mem.applied:
        cfg = dataclasses.replace(cfg, **{k: new for ch in mem.changes for k, (_, new) in ch.values.items()})
    if args.dry_run:
        a = cfg.arch()
        size = f"model size {cfg.model_size}" if cfg.model_size else "custom model"
        print(f"dry run: {cfg.task} (obs {spec.obs_shape} {cfg.obs}, action dim {spec.action_dim}), "
              f"device {device if device is not None else cfg.device + ' (not available here)'}, "
              f"run dir {cfg.run_dir}\n"
              f"{size}: enc_dim {a['enc_dim']}, mlp_dim {a['mlp_dim']}, latent_dim {a['latent_dim']}, "
              f"num_q {a['num_q']}; num_envs {cfg.num_envs}, batch_size {cfg.batch_size}, "
              f"num_samples {cfg.num_samples}, horizon {cfg.horizon}, buffer_size {cfg.buffer_size:,}")
        print(mem.report(f"peak device memory estimate for {target.label}:"))
    elif target.capacity is not None and mem.fits:
        log(f"memory: estimate {memory.fmt_bytes(mem.estimate.total)} of a {memory.fmt_bytes(target.budget)} budget on "
            f"{target.label}, headroom {1 - mem.estimate.total / target.capacity:.0%}; replay buffer "
            + ("on the device" if mem.buffer_on_device else "in pinned host memory"))
    return cfg, mem


def _env_spec(cfg: Config) -> EnvSpec:
    """The task's dims from one environment (closed at once)."""
    env, spec = make_env(cfg.task, seed=cfg.seed, obs=cfg.obs, action_repeat=cfg.action_repeat)
    env.close()
    return spec


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / cfg.task / f"seed{cfg.seed}" / time.strftime("%Y%m%d-%H%M%S")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_cli(lambda: _main(argv))


def _legacy_train_precision(cfg: Config) -> Config:
    """A run saved before train_precision existed trained in its planning precision: a resume keeps that."""
    try:
        dtype = resolve_dtype(cfg.precision, resolve_device(cfg.device))
    except DeviceError:
        return cfg  # reported when the device is resolved for the run
    if dtype != torch.bfloat16:
        return cfg
    print("resume: this run predates train_precision and trained in bf16; it keeps doing so "
          "(--train-precision fp32 switches, as new runs default to)", file=sys.stderr)
    return dataclasses.replace(cfg, train_precision="bf16")


def _main(argv: list[str]) -> int:
    resume, cfg_name = peek_flag(argv, "--resume"), peek_flag(argv, "--cfg")
    if resume and cfg_name:
        print(f"resume: --cfg {cfg_name} ignored; the run's own config.json applies (other flags still override)",
              file=sys.stderr)
    if resume:
        config_file = Path(resume) / "config.json"
        if not (Path(resume) / "checkpoints" / "latest.pt").is_file() or not config_file.is_file():
            raise BadInput(f"--resume {resume}: no run to continue there (need config.json and "
                           f"checkpoints/latest.pt)")
        raw = json.loads(config_file.read_text())
        base = from_dict(raw, source=str(config_file))
        if "train_precision" not in raw:
            base = _legacy_train_precision(base)
    else:
        base = load_json(cfg_name) if cfg_name else Config()
    args, cfg = parse_cli(TrainArgs, argv, base, prog="python -m tdmpc.train",
                          description=__doc__.splitlines()[0])
    if resume:
        changed = {f.name: (getattr(base, f.name), getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
                   if getattr(base, f.name) != getattr(cfg, f.name)}
        for name, (old, new) in changed.items():
            print(f"resume: {name} changed from {old!r} to {new!r} by the command line", file=sys.stderr)
        if args.init_from:
            print(f"resume: --init-from {args.init_from} ignored; the run's own checkpoint applies", file=sys.stderr)
            args.init_from = None
    init_note = ""
    if args.init_from:
        cfg, init_note = architecture_from_checkpoint(cfg, args.init_from, argv)
    try:
        device: torch.device | None = resolve_device(cfg.device)
    except DeviceError:
        if not args.dry_run:
            raise
        device = None  # a dry run still plans (for --gpu-mem, or says there is no GPU)
    run_dir = Path(resume) if resume else Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)
    if not resume and (run_dir / "checkpoints" / "latest.pt").exists():
        raise BadInput(f"run directory {run_dir} already holds a run; continue it with --resume {run_dir} "
                       f"or choose another --run-dir")
    if not resume and not args.dry_run:
        set_aside_unfinished(run_dir)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    buffer_storage, target = None, None
    if args.dry_run or args.gpu_mem or device.type == "cuda":
        cfg, mem = _plan_memory(cfg, args, device, resuming=bool(resume))
        target = mem.target
        if args.dry_run and init_note:
            print(init_note, file=sys.stderr)
        if not mem.fits:
            raise BadInput(mem.error())
        if args.dry_run:
            return EXIT_OK
        if device.type == "cuda":
            buffer_storage = device if mem.buffer_on_device else torch.device("cpu")
    trainer = Trainer(cfg, run_dir, device, resume=bool(resume), init_from=args.init_from,
                      buffer_storage=buffer_storage, memory_target=target)
    if init_note:
        print(init_note, file=sys.stderr)
    if device.type == "cpu":
        warn_if_slow_on_cpu(trainer)
    if trainer.c.finished and trainer.c.env_step >= trainer.cfg.steps:
        print(f"run in {run_dir} already finished at step {trainer.c.env_step:,}; pass --steps N to extend it",
              file=sys.stderr)
        return EXIT_OK
    trainer.c.finished = False
    try:
        return trainer.run()
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
