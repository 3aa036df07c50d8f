"""The Python API: import tdmpc, tdmpc.fit(...), Agent.from_checkpoint, act() on one observation, callbacks,
env objects and factories, and wandb (against a stub of the wandb package)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import tdmpc

from helpers import TINY as TINY_RUN, import_or_skip

# The tiny run of the CLI tests, trained to 300 env steps with an evaluation at the end.
TINY = {**{k: v for k, v in TINY_RUN.items() if k != "task"}, "eval_freq": 300, "save_every": 300, "steps": 300}
REFERENCE = Path(__file__).resolve().parent / "fixtures" / "reference-ms1" / "reference_checkpoint.pt"


class Corridor(gym.Env):
    """Walk right (reward x); ends at |x| >= 0.2 if it terminates; never declares whether it does."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, terminates: bool = False):
        self.terminates, self.x, self.t, self.steps = terminates, 0.0, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action):
        self.x = float(np.clip(self.x + 0.1 * float(action[0]), -1, 1))
        self.t += 1
        self.steps += 1
        done = self.terminates and abs(self.x) >= 0.2
        return np.array([self.x, self.t / 100], np.float32), self.x, done, self.t >= 100, {}


class DeclaredCorridor(Corridor):
    metadata = {"episodic": True}


def test_version_and_the_fit_function_beside_the_train_command_module():
    from importlib.metadata import version

    assert tdmpc.__version__ == version("tdmpc")
    from tdmpc import train  # the module of python -m tdmpc.train; the function is tdmpc.fit: no name is shared

    assert callable(train.main) and callable(tdmpc.fit) and tdmpc.fit.__name__ == "fit" and tdmpc.train is train
    assert {"Agent", "Config", "fit"} <= set(tdmpc.__all__)


def test_train_from_python_returns_the_run_and_an_agent_that_acts_on_one_observation(tmp_path):
    logs, evals = [], []
    run_dir, agent = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_log=logs.append,
                                 on_eval=evals.append, **TINY)
    assert run_dir == tmp_path / "run" and (run_dir / "checkpoints" / "latest.pt").is_file()
    assert [r["env_step"] for r in logs] == [100, 200, 300] and [r["env_step"] for r in evals] == [0, 300]
    assert "consistency_loss" in logs[-1] and np.isfinite(evals[-1]["episode_return"])
    obs = np.zeros(3, np.float32)
    action = agent.act(obs)
    assert action.shape == (1,) and np.all(np.abs(action) <= 1)
    assert agent.act(np.zeros((4, 3), np.float32), eval_mode=True).shape == (4, 1)

    loaded = tdmpc.Agent.from_checkpoint(run_dir / "checkpoints" / "latest.pt", device="cpu")
    assert loaded.cfg.task == "Pendulum-v1" and loaded.act(obs, first_step=True).shape == (1,)


@pytest.mark.parametrize("signame,raised", [("SIGINT", KeyboardInterrupt), ("SIGTERM", SystemExit)])
def test_a_stop_signal_during_fit_writes_a_checkpoint_then_acts_as_the_signal(tmp_path, signame, raised):
    """Ctrl-C raises KeyboardInterrupt and a scheduler's SIGTERM exits with the requeue code, after the checkpoint:
    a script (or a Slurm job) calling fit() does not carry on as if training had finished."""
    import os
    import signal

    import torch

    def signal_at_first_log(row: dict) -> None:
        os.kill(os.getpid(), getattr(signal, signame))

    with pytest.raises(raised) as e:
        tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_log=signal_at_first_log, **TINY)
    if raised is SystemExit:
        assert e.value.code == 3
    ck = torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["train"]["step"] == 100 and not ck["train"]["finished"]


def test_a_second_ctrl_c_that_python_drops_in_a_finalizer_still_stops_at_once(tmp_path):
    """A signal handler's exception raised inside a __del__ is printed and dropped by Python: the second Ctrl-C is
    raised again at the loop's next safe point, before the stop's checkpoint (none is written)."""
    import os
    import signal

    class InterruptedWhileCollected:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs inside this finalizer

    def twice(row: dict) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        InterruptedWhileCollected()

    dropped = []
    with pytest.raises(KeyboardInterrupt):
        with pytest.MonkeyPatch.context() as m:  # what Python would print as "Exception ignored in ... Traceback"
            m.setattr(sys, "unraisablehook", dropped.append)
            tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_log=twice, **TINY)
    assert not (tmp_path / "run" / "checkpoints" / "latest.pt").exists()
    assert not dropped  # the loop raises it again: printed, it read as a crash (a CI run's stderr once held it)


def test_fit_without_a_config_starts_where_the_train_command_does(tmp_path, monkeypatch, capsys):
    """No GPU: cpu.json, as python -m tdmpc.train, and the same note saying so."""
    import torch

    from tdmpc.config import CPU_CONFIG, load_json

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    stop = lambda row: False  # noqa: E731
    run_dir, agent = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_log=stop, steps=300, seed_steps=100,
                               eval_episodes=1, log_every=100, threads=1, model_size=1, num_samples=32,
                               iterations=1, num_elites=4, num_pi_trajs=4, batch_size=16)
    cpu = load_json(CPU_CONFIG)
    assert (agent.cfg.buffer_size, agent.cfg.horizon, agent.cfg.lr) == (cpu.buffer_size, cpu.horizon, cpu.lr)
    out = capsys.readouterr()
    assert "no GPU here: starting from the CPU default" in out.out + out.err  # (through the progress bar's stream)


def test_a_callback_returning_false_stops_with_a_checkpoint_and_resume_continues(tmp_path, capsys):
    """The stop's message tells a Python user how to resume from Python (a run on an env object has no name the
    command line could rebuild), and a resume's changes are said as fit()'s keywords."""
    stop_at_first_log = lambda row: False  # noqa: E731
    run_dir, _ = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_log=stop_at_first_log, **TINY)
    import torch

    ck = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["train"]["step"] == 100 and not ck["train"]["finished"]
    err = capsys.readouterr().err
    assert f"Resume with: tdmpc.fit(env=..., run_dir={str(run_dir)!r}, resume=True)" in err
    _, _ = tdmpc.fit(run_dir=run_dir, resume=True, eval_episodes=3)
    ck = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["train"]["step"] == 300 and ck["train"]["finished"]
    assert "resume: eval_episodes changed from 1 to 3 by fit()'s keywords" in capsys.readouterr().err


def test_an_on_eval_callback_stops_the_run_at_the_evaluated_step(tmp_path):
    run_dir, _ = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", on_eval=lambda row: False, **TINY)
    ck = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert ck["train"]["step"] == 0 and ck["train"]["last_eval"] == 0  # not a step after it


@pytest.mark.slow  # subprocess runs of tens of seconds: CI's slow step keeps the default suite under 8 min
def test_the_command_line_resumes_a_run_of_an_env_factory_by_its_registered_id(tmp_path):
    """No name rebuilds a factory's env: --resume takes --task with the registered id (what the error advises),
    as a task change it allows for such a run only."""
    from helpers import run_train

    run_dir, agent = tdmpc.fit(env=lambda: gym.make("Pendulum-v1"), run_dir=tmp_path / "run", **TINY)
    assert agent.cfg.task.startswith("custom:")
    r = run_train("--resume", run_dir, "--steps", 400)
    assert r.returncode == 2 and "pass --task with the env's registered id" in r.stderr, r.stderr
    r = run_train("--resume", run_dir, "--task", "Pendulum-v1", "--steps", 400)
    assert r.returncode == 0, r.stderr
    assert f"task changed from {agent.cfg.task!r} to 'Pendulum-v1'" in r.stderr
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 400


def test_an_env_object_trains_as_is_and_is_copied_for_more_envs_and_evaluation(tmp_path, capsys):
    env = Corridor(terminates=True)
    run_dir, agent = tdmpc.fit(env=env, run_dir=tmp_path / "run", num_envs=2, **{**TINY, "seed_steps": 400,
                                                                                     "steps": 400, "eval_freq": 400})
    assert env.steps == 200  # the object itself was stepped (400 steps / 2 envs), its copies the rest
    assert agent.cfg.task == "custom:Corridor"
    assert agent.cfg.episodic is False  # it does not declare that it terminates
    assert "ended an episode in a terminal state, but episodic is off" in capsys.readouterr().err
    # no name rebuilds the object: the command line says how to evaluate it, and Python does with the env given
    from tdmpc.cli.evaluate import main as evaluate

    assert evaluate(["--checkpoint", str(run_dir / "checkpoints" / "latest.pt"), "--episodes", "1"]) == 2
    assert "is a run's name for an env object it was given" in capsys.readouterr().err
    assert len(tdmpc.run_episodes(agent, lambda: Corridor(terminates=True), 1, seed=0).returns) == 1


class NanCorridor(Corridor):
    def step(self, action):
        obs, *rest = super().step(action)
        return (obs * np.nan if self.steps == 50 else obs), *rest


def test_a_run_that_stops_on_an_error_raises_run_failed_saying_the_error(tmp_path):
    """RunFailed said only "the error above", which a notebook's stderr may not show beside the exception."""
    from tdmpc.errors import RunFailed

    with pytest.raises(RunFailed) as e:
        tdmpc.fit(env=NanCorridor, run_dir=tmp_path / "run", **{**TINY, "eval_episodes": 0})
    said = str(e.value)
    assert "returned a non-finite observation at env step 49; pass nonfinite_data='drop'" in said and "\n" not in said
    assert f"checkpoint written at step 49 (resume with tdmpc.fit(env=..., run_dir={str(tmp_path / 'run')!r}, " \
           f"resume=True, nonfinite_data='drop'))" in said


def test_a_damaged_replay_buffer_is_resumed_without_from_python_as_the_error_says(tmp_path, capsys):
    """The error advised --resume RUN --no-buffer, which fit() had no keyword for (an env object's run could not
    continue at all)."""
    from tdmpc.errors import BufferFileError

    run_dir, _ = tdmpc.fit(env=Corridor, run_dir=tmp_path / "run", on_log=lambda row: row["env_step"] < 200, **TINY)
    (buffer,) = (run_dir / "checkpoints").glob("buffer_*.h5")
    buffer.write_bytes(buffer.read_bytes()[:100])
    with pytest.raises(BufferFileError) as e:
        tdmpc.fit(env=Corridor, run_dir=run_dir, resume=True)
    assert f"Resume without it: tdmpc.fit(env=..., run_dir={str(run_dir)!r}, resume=True, no_buffer=True)" in str(e.value)
    capsys.readouterr()
    _, agent = tdmpc.fit(env=Corridor, run_dir=run_dir, resume=True, no_buffer=True)
    assert "resume: no_buffer=True: acting without updates until step" in capsys.readouterr().err
    with pytest.raises(tdmpc.errors.BadInput, match=r"^fit\(no_buffer=True\) applies to a resume"):
        tdmpc.fit(env=Corridor, run_dir=tmp_path / "other", no_buffer=True)


def test_an_env_object_that_cannot_be_copied_is_refused_before_the_run_starts(tmp_path):
    """Evaluation plays on a deep copy of an env object: a raw TypeError from deepcopy came out of the first one."""
    import threading

    env = Corridor()
    env.lock = threading.Lock()
    with pytest.raises(tdmpc.errors.BadInput, match=r"the Corridor object cannot be copied \(TypeError: cannot "
                                                    r"pickle '_thread.lock' object\).*env=lambda: Corridor\(...\)"):
        tdmpc.fit(env=env, run_dir=tmp_path / "run", **TINY)
    assert not (tmp_path / "run").exists()
    tdmpc.fit(env=env, run_dir=tmp_path / "run", **{**TINY, "eval_episodes": 0, "steps": 20})  # no copy needed


@pytest.mark.slow  # env processes of their own: CI's slow step keeps the default suite under 8 minutes
def test_an_unguarded_script_with_async_envs_says_to_guard_it(tmp_path):
    """Each async env's process imports the main script: unguarded, it ran fit() again there, and the user saw
    a lock error, a ConnectionResetError and multiprocessing's bootstrapping RuntimeError; then one error per env
    process besides fit()'s own."""
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(f"import tdmpc\ntdmpc.fit(env='Pendulum-v1', run_dir={str(tmp_path / 'run')!r}, num_envs=2, "
                      f"vectorization='async', **{ {**TINY, 'steps': 300, 'eval_episodes': 0}!r})\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1 and "RunDirError" not in r.stderr and "bootstrapping" not in r.stderr, r.stderr
    assert "tdmpc.errors.TaskError: the env processes of vectorization 'async' exited as they started" in r.stderr
    assert r.stderr.count("Traceback") == 1, r.stderr  # fit()'s own exception; the env processes end quietly
    assert "keeps its calls under `if __name__ == '__main__':`" in r.stderr and not (tmp_path / "run").exists()


def test_a_finished_run_whose_latest_checkpoint_is_gone_returns_the_agent_of_the_one_before(tmp_path):
    """fit(resume=True) said the run had finished (from previous.pt), then loaded latest.pt: CheckpointError."""
    run_dir, _ = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "run", **{**TINY, "steps": 20, "eval_episodes": 0})
    (run_dir / "checkpoints" / "latest.pt").rename(run_dir / "checkpoints" / "previous.pt")
    _, agent = tdmpc.fit(run_dir=run_dir, resume=True)
    assert agent.cfg.task == "Pendulum-v1"


def test_fit_plans_for_a_card_and_names_its_own_keywords_when_it_does_not_fit(tmp_path):
    """fit() had no gpu_mem or fit_memory, and its refusal advised --fit-memory."""
    from tdmpc.config import load_json

    with pytest.raises(tdmpc.errors.BadInput) as e:
        tdmpc.fit(env="Pendulum-v1", cfg=load_json("a4000.json"), run_dir=tmp_path / "run", gpu_mem="800MB",
                  device="cpu")
    said = str(e.value)
    assert "exceeds the budget" in said and "a card of 800MB" in said and "lower: cuda_graphs=False, " in said, said
    assert "(or pass fit_memory=True to apply these)" in said and "--" not in said, said
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("keywords, said", [
    ({"obs": "rgb", "env": "cartpole-swingup", "num_channels": 8},
     "latent_dim is 16: use num_channels=1, or a model size with latent_dim 128 (model_size=5)"),
    ({"buffer_size": 3, "num_envs": 2}, "(num_envs, per task)"),
    ({"device": "cuda"}, "CUDA is not available here; use device='cpu'"),
    ({"threads": 4096}, "threads=4096: this process may use"),
    ({"gpu_mem": "lots"}, "gpu_mem: cannot read the memory size 'lots'"),
    ({"gpu_mem": "0GB"}, "gpu_mem='0GB': must be more than 0"),
    ({"dataset": []}, "dataset names no file: give one or more dataset files, or leave dataset out"),
])
def test_fit_s_refusals_name_its_keywords_not_the_command_line_s_flags(tmp_path, keywords, said):
    """The config's own checks, the device, threads and --gpu-mem spoke of flags (--num-channels 8, use --device
    cpu) to a fit() user, who has none."""
    import torch

    if keywords.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is here: the refusal needs a machine without it")
    with pytest.raises((tdmpc.errors.BadInput, tdmpc.errors.ConfigError, tdmpc.errors.DeviceError)) as e:
        tdmpc.fit(**{"env": "Pendulum-v1", "run_dir": tmp_path / "run", **TINY, **keywords})
    assert said in str(e.value) and "--" not in str(e.value), str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["evaluate", "collect"])
def test_the_commands_name_their_device_flag_and_python_its_keyword(command, tmp_path, capsys):
    """Agent.from_checkpoint (Python) says use device='cpu'; evaluate and collect, which load through it, say the
    flag, before the checkpoint is read."""
    import importlib

    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the refusal needs a machine without it")
    main = importlib.import_module(f"tdmpc.cli.{command}").main
    extra = ["--out", str(tmp_path / "data.h5")] if command == "collect" else []
    assert main(["--checkpoint", str(tmp_path / "no.pt"), "--device", "cuda", *extra]) == 2
    assert capsys.readouterr().err.strip() == ("error: device 'cuda' requested but CUDA is not available here; use "
                                               "--device cpu")
    with pytest.raises(tdmpc.errors.DeviceError, match="use device='cpu'"):
        tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cuda")


def test_a_factory_and_what_an_env_declares(tmp_path):
    short = {**TINY, "steps": 20, "eval_episodes": 0}  # what the run is built as, not what it learns
    _, agent = tdmpc.fit(env=DeclaredCorridor, run_dir=tmp_path / "run", **short)
    assert agent.cfg.episodic is True and agent.dims.episodic
    _, agent = tdmpc.fit(env=lambda: Corridor(), run_dir=tmp_path / "run2", episodic=True, **short)
    assert agent.cfg.episodic is True  # a setting, whatever the env says


def test_run_episodes_without_a_seed_plays_new_episodes_each_call():
    """seed=None played seed 0's episodes every time (a user's repeated evaluations were one evaluation)."""
    import torch

    from tdmpc.agent import Agent
    from tdmpc.model.world_model import ModelDims

    cfg = tdmpc.Config(model_size=1, precision="fp32", num_samples=32, num_elites=4, num_pi_trajs=2, iterations=1,
                       mpc=False)
    agent = Agent(cfg, ModelDims.from_config(cfg, (3,), 1, False), episode_length=200, device=torch.device("cpu"))
    seeded = [tdmpc.run_episodes(agent, "Pendulum-v1", 2, seed=0).returns for _ in range(2)]
    fresh = [tdmpc.run_episodes(agent, "Pendulum-v1", 2, seed=None).returns for _ in range(2)]
    assert seeded[0] == seeded[1] and fresh[0] != fresh[1] and seeded[0] not in fresh


def test_run_episodes_on_an_env_of_other_sizes_is_one_line():
    import torch

    from tdmpc.agent import Agent
    from tdmpc.errors import BadInput
    from tdmpc.model.world_model import ModelDims

    cfg = tdmpc.Config(model_size=1, precision="fp32", num_samples=32, num_elites=4, num_pi_trajs=2, iterations=1)
    agent = Agent(cfg, ModelDims.from_config(cfg, (3,), 1, False), episode_length=200, device=torch.device("cpu"))
    with pytest.raises(BadInput, match=r"CartPole-v1 .*obs \(4,\).*the agent's model is for obs \(3,\)"):
        tdmpc.run_episodes(agent, "CartPole-v1", 1, seed=0)


@pytest.mark.parametrize("bias", [50.0, -50.0])
def test_evaluation_scores_the_termination_head_on_every_transition_it_ran(bias):
    import torch

    from tdmpc.agent import Agent
    from tdmpc.cli.evaluate import run_episodes
    from tdmpc.model.world_model import ModelDims

    cfg = tdmpc.Config(model_size=1, precision="fp32", num_samples=32, num_elites=4, num_pi_trajs=2, iterations=1)
    agent = Agent(cfg, ModelDims.from_config(cfg, (2,), 1, True), episode_length=100, device=torch.device("cpu"))
    last = [m for m in agent.model._termination.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():  # a head that always (bias 50) or never (-50) predicts the end
        last.weight.zero_()
        last.bias.fill_(bias)
    res = run_episodes(agent, lambda: Corridor(terminates=True), episodes=4, seed=0)
    t = res.termination
    terminal = sum(n < 100 for n in res.lengths)  # Corridor truncates at 100 steps; shorter episodes terminated
    assert t.sum() == sum(res.lengths) and t[1].sum() == terminal > 0
    summary = res.summary()
    assert summary["terminal_steps"] == terminal
    if bias > 0:
        assert t[1, 1] == terminal and t[0, 1] == sum(res.lengths) - terminal and summary["termination_recall"] == 1
    else:
        assert t[:, 1].sum() == 0 and summary["termination_recall"] == 0
        assert summary["termination_accuracy"] == pytest.approx(1 - terminal / sum(res.lengths))


def test_a_reference_checkpoint_needs_its_task():
    with pytest.raises(ValueError, match="does not name its task"):
        tdmpc.Agent.from_checkpoint(REFERENCE, device="cpu")
    agent = tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu", num_samples=64, num_elites=8,
                                        num_pi_trajs=4)
    assert agent.imported_from_reference and agent.act(np.zeros(24, np.float32)).shape == (6,)


def test_from_checkpoint_without_a_path_is_one_line():
    for bad in (None, 3):
        with pytest.raises(ValueError, match=f"a checkpoint is a path to a .pt file .*not {type(bad).__name__}$"):
            tdmpc.Agent.from_checkpoint(bad, task="walker-walk", device="cpu")  # type: ignore[arg-type]


def test_from_checkpoint_refuses_another_architecture_rather_than_misreport_it():
    """latent_dim=64 was taken into agent.cfg while the model kept the checkpoint's 128."""
    with pytest.raises(ValueError, match=r"architecture is fixed \(latent_dim: checkpoint 128, given 64, num_q: "
                                         r"checkpoint 2, given 8\); leave those settings out$"):
        tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu", latent_dim=64, num_q=8)
    agent = tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu", latent_dim=128, dropout=0.0)
    assert agent.cfg.latent_dim == agent.dims.latent_dim == 128


def test_act_refuses_nan_in_a_cpu_tensor_as_in_numpy():
    """A torch tensor on the host is checked as numpy is (no device to read back from)."""
    from tdmpc.errors import BadInput

    agent = tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu", num_samples=16, num_elites=2,
                                        num_pi_trajs=2, iterations=1)
    obs = torch.zeros(3, 24)
    obs[1, 5] = float("nan")
    with pytest.raises(BadInput, match="NaN or inf in observation 1"):
        agent.act(obs)
    with pytest.raises(BadInput, match="NaN or inf in observation 0"):
        agent.act(torch.full((24,), float("inf")))
    assert torch.isfinite(agent.act(torch.zeros(3, 24))).all()


def test_from_checkpoint_sets_the_threads_it_is_given_and_leaves_them_otherwise():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu")
        assert torch.get_num_threads() == 2
        agent = tdmpc.Agent.from_checkpoint(REFERENCE, task="walker-walk", device="cpu", threads=1)
        assert torch.get_num_threads() == 1 and agent.cfg.threads == 1
    finally:
        torch.set_num_threads(before)


class WandbStub(types.ModuleType):
    """What tdmpc calls of wandb, recorded."""

    def __init__(self, steps: tuple[int, ...] = ()):
        """steps: wandb's run.step at each init (where a resumed run goes on from), 0 past the tuple."""
        super().__init__("wandb")
        self.inits: list[dict] = []
        self.logged: list[dict] = []
        self.steps = steps

    def init(self, **kwargs):
        self.inits.append(kwargs)
        step = self.steps[len(self.inits) - 1] if len(self.inits) <= len(self.steps) else 0
        return types.SimpleNamespace(log=lambda data, step: self.logged.append({"step": step, **data}),
                                     finish=lambda: None, step=step)

    def Video(self, path, format):  # noqa: N802 - wandb's name
        return ("video", Path(path).name, format)


def test_a_resume_behind_what_wandb_holds_says_that_wandb_ignores_the_rows_until_then(tmp_path, monkeypatch, capsys):
    """A run killed after its last checkpoint had logged steps past it to wandb, which has no purge: the resume says
    which rows wandb will ignore and where this run's are, rather than leave wandb's curve silently the old one's."""
    stub = WandbStub(steps=(0, 1_000, 201))
    monkeypatch.setitem(sys.modules, "wandb", stub)
    stop = lambda row: row["env_step"] < 200  # noqa: E731 - stops at the log row of step 200
    a, _ = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "a", on_log=stop, wandb=True, **{**TINY, "steps": 300})
    capsys.readouterr()
    tdmpc.fit(run_dir=a, resume=True, on_log=stop)
    assert ("note: wandb's run goes on from step 1,000, logged before this resume from the checkpoint at step 200: "
            "wandb ignores this run's rows before step 1,000") in capsys.readouterr().err
    tdmpc.fit(run_dir=a, resume=True, on_log=stop)  # wandb holds nothing past the checkpoint: no note
    assert "wandb's run goes on" not in capsys.readouterr().err


def test_an_exception_in_a_callback_is_raised_after_a_checkpoint_of_the_steps_so_far(tmp_path, capsys):
    """It propagated at once and left nothing since the last periodic checkpoint (here: no checkpoint at all)."""
    def fail(row):
        if row["env_step"] >= 200:
            raise KeyError("the user's own bug")

    with pytest.raises(KeyError, match="the user's own bug"):
        tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "a", on_log=fail, on_eval=fail,
                  **{**TINY, "save_every": 10_000, "eval_episodes": 0})
    err = capsys.readouterr().err
    assert "stopped by an exception in the on_log callback at step 200; checkpoint written" in err
    assert "note: on_eval is never called: eval_episodes=0 plays no evaluation" in err
    assert torch.load(tmp_path / "a" / "checkpoints" / "latest.pt", weights_only=True)["train"]["step"] == 200
    tdmpc.fit(run_dir=tmp_path / "a", resume=True)
    assert "from step 200" in capsys.readouterr().err


def test_resume_messages_name_fits_keywords_and_fewer_steps_than_done_change_nothing(tmp_path, capsys):
    """A resume with fewer steps than the run has done ended it at once: evaluated again, marked finished, the
    lower steps saved, under a note that it was still seeding. Now refused, nothing changed. And fit()'s messages
    named the command line's flags (--steps N, --resume) where fit takes steps= and resume=True."""
    from tdmpc.errors import BadInput, ConfigError, RunDirError

    stop = lambda row: row["env_step"] < 200  # noqa: E731 - stops at the log row of step 200
    a, _ = tdmpc.fit(env="Pendulum-v1", run_dir=tmp_path / "a", on_log=stop, **TINY)
    files = {p: p.read_bytes() for p in sorted(a.rglob("*")) if p.is_file()}
    with pytest.raises(BadInput, match=r"^steps=100: the run in .* is already at step 200; give more to continue it, "
                                       r"or leave it out \(the run's own: 300\); nothing was changed$"):
        tdmpc.fit(run_dir=a, resume=True, steps=100)
    assert {p: p.read_bytes() for p in sorted(a.rglob("*")) if p.is_file()} == files
    with pytest.raises(RunDirError, match="already holds a run; continue it with resume=True, or choose another "
                                          "run_dir$"):
        tdmpc.fit(env="Pendulum-v1", run_dir=a, **TINY)
    with pytest.raises(BadInput, match="continues with the run's own config.json, so cfg= would not be read"):
        tdmpc.fit(run_dir=a, resume=True, cfg=tdmpc.Config(steps=400))  # it was dropped without a word
    (a / "config.json").write_text("{")  # damaged: the way out is fit's own keyword
    with pytest.raises(ConfigError, match=r"config_from_checkpoint=True\)$"):
        tdmpc.fit(run_dir=a, resume=True)
    tdmpc.fit(run_dir=a, resume=True, config_from_checkpoint=True)
    capsys.readouterr()
    tdmpc.fit(run_dir=a, resume=True)
    assert "already finished at step 300; pass steps above it to extend it" in capsys.readouterr().err


def test_wandb_gets_a_unique_id_per_run_kept_on_resume_its_options_and_videos(tmp_path, monkeypatch):
    import_or_skip("imageio")
    stub = WandbStub()
    monkeypatch.setitem(sys.modules, "wandb", stub)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "sweep")
    options = dict(wandb=True, wandb_entity="lab", wandb_project="p", wandb_tags=("a", "b"), **TINY)
    stop = lambda row: row["env_step"] < 200  # noqa: E731 - stops at the log row of step 200
    env = "InvertedPendulum-v5"  # renders through MuJoCo (classic control would need pygame)
    a, _ = tdmpc.fit(env=env, run_dir=tmp_path / "a", on_log=stop, **options)
    tdmpc.fit(run_dir=a, resume=True, save_video=True)
    tdmpc.fit(env=env, run_dir=tmp_path / "b", wandb_group="mine", **options)
    first, resumed, other = stub.inits
    assert first["id"] == resumed["id"] != other["id"] and first["resume"] == "allow"
    assert (first["entity"], first["project"], first["tags"]) == ("lab", "p", ["a", "b"])
    assert first["group"] == "sweep-4242" and other["group"] == "mine"
    videos = [r for r in stub.logged if "eval/video" in r]
    assert len(videos) == 1 and videos[0]["step"] == 300 and videos[0]["eval/video"][2] == "mp4"
    assert any("train/consistency_loss" in r for r in stub.logged)
