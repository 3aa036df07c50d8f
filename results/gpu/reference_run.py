"""The reference TD-MPC2 (github.com/nicklashansen/tdmpc2) trained as its train.py does, with timers around it.

Run from anywhere: python reference_run.py REF_DIR OUT_JSON key=value ... (config.yaml overrides, as on its
command line). What differs from `python train.py key=value ...`, and why:
- hydra's decorator is bypassed (its submitit launcher plugin is not installed on the lent GPU, and a short
  timing run needs no output directory): config.yaml is read with OmegaConf, the overrides merged, and
  parse_cfg, set_seed, make_env, TDMPC2, Buffer, Logger and OnlineTrainer are used exactly as train.py uses them,
  after the same environment variables and torch flags (cudnn.benchmark, TF32 'high').
- `seed_steps=N` may be passed (train.py derives it: max(1000, 5 * episode length) = 2500 on DMC). It sets the
  random-action steps and the pretraining updates, not the speed of a training step.
- act() is timed on the host (it ends in .cpu(), a sync); update() with CUDA events (no added sync); the
  trainer's own steps_per_second and elapsed_time are read from each train log row, so the steady-state rate
  is the difference between the last rows, after pretraining.
- It runs with gymnasium 0.29.1 first on its path (its wrappers predate gymnasium 1.x), as its docker image has.
- The peak (torch.cuda.max_memory_allocated/reserved) is read after the run, or an out-of-memory error recorded;
  a SIGTERM (a time limit) stops the run and still writes what was measured;
  `mem_gib=G` caps the allocator at G GiB first (torch.cuda.set_per_process_memory_fraction).
"""
import json
import os
import signal
import sys
import time

ref, out = os.path.abspath(sys.argv[1]), sys.argv[2]
overrides = sys.argv[3:]
os.environ['MUJOCO_GL'] = os.getenv("MUJOCO_GL", 'egl')
os.environ['LAZY_LEGACY_OP'] = '0'
os.environ['TORCHDYNAMO_INLINE_INBUILT_NN_MODULES'] = "1"
sys.path.insert(0, os.path.join(ref, 'tdmpc2'))
import warnings
warnings.filterwarnings('ignore')
import torch

torch.backends.cudnn.benchmark = True
torch.set_float32_matmul_precision('high')
import hydra.utils
from omegaconf import OmegaConf

ours = {k: v for k, v in (o.split('=', 1) for o in overrides) if k in ('seed_steps', 'mem_gib')}
cfg = OmegaConf.load(os.path.join(ref, 'tdmpc2', 'config.yaml'))
cfg.pop('defaults', None)
cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([o for o in overrides if o.split('=', 1)[0] not in ours]))
workdir = os.path.join(os.path.dirname(os.path.abspath(out)), 'reference_workdir')
hydra.utils.get_original_cwd = lambda: workdir  # what parse_cfg asks hydra for

from common.parser import parse_cfg
from common.seed import set_seed
from common.buffer import Buffer
from envs import make_env
from tdmpc2 import TDMPC2
from trainer.online_trainer import OnlineTrainer
from common.logger import Logger

result = {"overrides": overrides, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
if 'mem_gib' in ours:
    cap = float(ours['mem_gib']) * 2**30
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / torch.cuda.get_device_properties(0).total_memory))
    result["mem_cap_gib"] = float(ours['mem_gib'])
cfg = parse_cfg(cfg)
set_seed(cfg.seed)
env = make_env(cfg)  # train.py's order: the env first (it fills the shapes and seed_steps), then the agent
if 'seed_steps' in ours:
    cfg.seed_steps = int(ours['seed_steps'])
agent = TDMPC2(cfg)
act_ms, upd_events, rows = [], [], []
_act, _update = agent.act, agent.update


def act(*a, **k):
    t0 = time.perf_counter()
    r = _act(*a, **k)
    act_ms.append((time.perf_counter() - t0) * 1e3)
    return r


def update(*a, **k):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    r = _update(*a, **k)
    e.record()
    upd_events.append((s, e))
    return r


agent.act, agent.update = act, update
logger = Logger(cfg)
_log = logger.log


def log(d, category='train'):
    rows.append({"category": category, **{k: float(v) for k, v in d.items()
                                           if k in ("step", "elapsed_time", "steps_per_second", "episode_reward")}})
    return _log(d, category)


logger.log = log
trainer = OnlineTrainer(cfg=cfg, env=env, agent=agent, buffer=Buffer(cfg), logger=logger)


class Stopped(Exception):
    """SIGTERM (a time limit): what was measured so far is still written."""


def stop(signum, frame):
    raise Stopped()


signal.signal(signal.SIGTERM, stop)
t0 = time.perf_counter()
try:
    trainer.train()
    result["finished"] = True
except torch.OutOfMemoryError as e:
    result["finished"] = False
    result["out_of_memory"] = str(e).splitlines()[0][:300]
except Stopped:
    result["finished"] = False
    result["stopped"] = "SIGTERM"
torch.cuda.synchronize()
result["wall_s"] = time.perf_counter() - t0
upd = [s.elapsed_time(e) for s, e in upd_events]
n_act = len(act_ms)
result.update(seed_steps=cfg.seed_steps, steps=cfg.steps, horizon=cfg.horizon, num_samples=cfg.num_samples,
              model_size=cfg.model_size, compile=cfg.compile, train_rows=rows,
              act_calls=n_act, updates=len(upd),
              act_ms_median_last_half=sorted(act_ms[n_act // 2:])[len(act_ms[n_act // 2:]) // 2] if n_act else None,
              update_ms_median_last_half=sorted(upd[len(upd) // 2:])[len(upd[len(upd) // 2:]) // 2] if upd else None,
              peak_allocated_gib=torch.cuda.max_memory_allocated() / 2**30,
              peak_reserved_gib=torch.cuda.max_memory_reserved() / 2**30)
train = [r for r in rows if r["category"] == "train"]
if len(train) >= 3:  # steady state: the last rows, well after the pretraining burst
    a, b = train[-3], train[-1]
    result["steady_steps_per_s"] = (b["step"] - a["step"]) / (b["elapsed_time"] - a["elapsed_time"])
with open(out, 'w') as f:
    json.dump(result, f, indent=1)
print(json.dumps({k: v for k, v in result.items() if k != "train_rows"}))
