"""Tensor-native vector envs (tdmpc/envs/tensor.py): a simulator's torch tensors in lockstep, whatever its autoreset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

import json
import re
from pathlib import Path

from helpers import TINY, import_or_skip, read_csv, run_module, run_train, tiny_json
from tdmpc.config import Config, validate
from tdmpc.training.run_dir import saved_config
from tdmpc.training.setup import RunRequest, open_run
from tdmpc.envs.tensor import TensorVectorEnv, autoreset_mode, is_tensor_task, make_tensor_vector_env
from tdmpc.errors import BadInput, TaskError


class TorchPointEnv(gym.vector.VectorEnv):
    """N points on a line, written for these tests: torch tensors only (numpy actions are refused), episodes of
    `length` steps that end in a terminal state (an even env) or a time limit (an odd one). obs = (position, step);
    reward = the action taken. Next-step autoreset unless `same_step` (then info['final_obs'] holds the last obs)."""

    def __init__(self, num_envs: int = 4, length: int = 3, same_step: bool = False, discrete: bool = False):
        self.num_envs, self.length, self.same_step = num_envs, length, same_step
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = spaces.Discrete(3, start=-1) if discrete else spaces.Box(-2.0, 2.0, (1,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        mode = gym.vector.AutoresetMode.SAME_STEP if same_step else gym.vector.AutoresetMode.NEXT_STEP
        self.metadata = {"autoreset_mode": mode, "episodic": True}
        self.t = torch.zeros(num_envs)
        self.pos = torch.zeros(num_envs)
        self.ended = torch.zeros(num_envs, dtype=torch.bool)
        self.actions: list[torch.Tensor] = []

    def _obs(self) -> torch.Tensor:
        return torch.stack([self.pos, self.t], 1)

    def reset(self, *, seed=None, options=None):
        self.t.zero_()
        self.pos.zero_()
        self.ended.zero_()
        return self._obs(), {}

    def step(self, action):
        if not isinstance(action, torch.Tensor):
            raise TypeError(f"TorchPointEnv takes torch tensors, not {type(action).__name__}")
        self.actions.append(action.clone())
        a = action.float().view(self.num_envs)
        if not self.same_step:  # the envs that ended last step reset now, ignoring their action
            self.t[self.ended], self.pos[self.ended] = 0, 0
            restarted = self.ended.clone()
        else:
            restarted = torch.zeros_like(self.ended)
        moving = ~restarted
        self.pos = torch.where(moving, self.pos + a, self.pos)
        self.t = torch.where(moving, self.t + 1, self.t)
        done = moving & (self.t >= self.length)
        even = torch.arange(self.num_envs) % 2 == 0
        terminated, truncated = done & even, done & ~even
        reward = torch.where(moving, a, torch.zeros_like(a))
        info = {}
        obs = self._obs()
        if self.same_step:
            info["final_obs"] = obs.clone()
            self.t[done], self.pos[done] = 0, 0
            obs = self._obs()
        self.ended = done
        return obs, reward, terminated, truncated, info


def make_points(num_envs: int = 1, **kw) -> TorchPointEnv:
    return TorchPointEnv(num_envs=num_envs, length=10)


# A user's simulator registered with a vector_entry_point, trained as --task test_tensor_envs:TorchPoint-v0
gym.register("TorchPoint-v0", entry_point="test_tensor_envs:make_points", vector_entry_point="test_tensor_envs:make_points",
             max_episode_steps=10)


def steps(envs: TensorVectorEnv, n: int, action: torch.Tensor) -> list:
    envs.reset(seed=0)
    return [envs.step(action) for _ in range(n)]


def test_next_step_autoreset_marks_the_reset_step_as_no_transition():
    env = TorchPointEnv(length=3)
    assert autoreset_mode(env) == "next_step" and is_tensor_task(env)
    envs = TensorVectorEnv(env, "points", "cpu")
    out = steps(envs, 5, torch.ones(4, 1))  # +1 in [-1, 1] is +2 on the env's Box(-2, 2)
    assert torch.equal(env.actions[0], torch.full((4, 1), 2.0))
    assert [bool(s.transition[0]) for s in out] == [True, True, True, False, True]
    assert [bool(s.started[0]) for s in out] == [False, False, False, True, False]
    third, reset = out[2], out[3]
    assert third.terminated.tolist() == [True, False, True, False] and third.truncated.tolist() == [False, True, False, True]
    assert torch.equal(third.next_obs[:, 0], torch.full((4,), 6.0))  # the final observation: 3 steps of +2
    assert torch.equal(reset.obs, torch.zeros(4, 2)) and torch.equal(reset.reward, torch.zeros(4))
    assert not reset.terminated.any() and not reset.truncated.any()
    assert all(s.finite.all() for s in out)


def test_same_step_autoreset_takes_the_final_observation_from_the_info():
    env = TorchPointEnv(length=2, same_step=True)
    assert autoreset_mode(env) == "same_step"
    out = steps(TensorVectorEnv(env, "points", "cpu"), 3, -torch.ones(4, 1))
    assert all(s.transition.all() for s in out)
    assert out[1].started.all() and not out[0].started.any()
    assert torch.equal(out[1].next_obs, torch.tensor([[-4.0, 2.0]] * 4))  # what the action led to
    assert torch.equal(out[1].obs, torch.zeros(4, 2))  # what the envs act on next: the new episode's first


def test_final_observations_from_an_env_declaring_next_step_autoreset_are_an_error():
    env = TorchPointEnv(length=1, same_step=True)
    env.metadata = {}  # ManiSkill3's vector env resets in the same step without saying so
    with pytest.raises(TaskError, match="declares next-step autoreset"):
        steps(TensorVectorEnv(env, "points", "cpu"), 1, torch.zeros(4, 1))


def test_discrete_actions_reach_the_env_as_integers_from_its_start():
    env = TorchPointEnv(discrete=True)
    envs = TensorVectorEnv(env, "points", "cpu")
    assert envs.discrete and envs.action_dim == 3
    steps(envs, 1, torch.tensor([0, 1, 2, 2]))
    assert torch.equal(env.actions[0], torch.tensor([-1, 0, 1, 1]))


class Broken(TorchPointEnv):
    def __init__(self, what: str, **kw):
        super().__init__(**kw)
        self.what = what

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.what == "numpy":
            obs = obs.numpy()
        elif self.what == "shape":
            obs = obs[:, :1]
        elif self.what == "dtype":
            obs = obs.long()
        elif self.what == "reward":
            reward = reward.view(-1, 1)
        elif self.what == "flags":
            terminated = terminated.float()
        elif self.what == "nan":
            reward = torch.where(torch.arange(self.num_envs) == 2, torch.nan, reward)
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize("what,message", [
    ("numpy", "returned observations as a ndarray, not a torch tensor"),
    ("shape", "returned observations of shape (4, 1), but 4 envs of observation_space (2,) make (4, 2)"),
    ("dtype", "returned torch.int64 observations; state observations must be floating point"),
    ("reward", "returned reward of shape (4, 1), not (4,)"),
    ("flags", "returned terminated as torch.float32, not torch.bool"),
])
def test_bad_tensors_are_one_line_errors(what, message):
    envs = TensorVectorEnv(Broken(what), "points", "cpu")
    envs.reset()
    with pytest.raises(TaskError) as e:
        envs.step(torch.zeros(4, 1))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_non_finite_rows_are_flagged_without_a_host_check():
    envs = TensorVectorEnv(Broken("nan"), "points", "cpu")
    out = steps(envs, 1, torch.zeros(4, 1))
    assert out[0].finite.tolist() == [True, True, False, True]


def test_envs_without_autoreset_or_with_other_spaces_are_refused():
    env = TorchPointEnv()
    env.metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}
    with pytest.raises(TaskError, match="autoreset mode 'disabled'"):
        TensorVectorEnv(env, "points", "cpu")
    env = TorchPointEnv()
    env.single_action_space = spaces.MultiDiscrete([2, 2])
    with pytest.raises(TaskError, match="MultiDiscrete action space"):
        TensorVectorEnv(env, "points", "cpu")
    # gymnasium's numpy vector envs (CartPole-v1 registers one) and tasks without one take the numpy path
    assert not is_tensor_task("CartPole-v1") and not is_tensor_task("Pendulum-v1") and not is_tensor_task("walker-walk")


def test_an_ids_kind_is_probed_once(monkeypatch):
    """Each training-time evaluation asks whether its id is a tensor task: CartPole-v1's probe (a vector env built
    from its vector_entry_point) is built once, not once per evaluation."""
    from tdmpc.envs import tensor
    monkeypatch.setattr(tensor, "_KIND", {})
    built = []
    make_vec = gym.make_vec
    monkeypatch.setattr(gym, "make_vec", lambda *a, **k: built.append(a) or make_vec(*a, **k))
    assert not any(is_tensor_task("CartPole-v1") for _ in range(3))
    assert len(built) == 1


def test_a_vector_env_object_and_its_spec():
    envs, spec = make_tensor_vector_env(TorchPointEnv(num_envs=4), 4, seed=0, device="cpu")
    assert spec.obs_shape == (2,) and spec.action_dim == 1 and not spec.discrete and spec.action_repeat == 1
    with pytest.raises(TaskError, match="has 4 envs, not num_envs=8"):
        make_tensor_vector_env(TorchPointEnv(num_envs=4), 8, seed=0, device="cpu")
    with pytest.raises(TaskError, match="action repeat 2 is not supported"):
        make_tensor_vector_env(TorchPointEnv(num_envs=4), 4, seed=0, device="cpu", action_repeat=2)


def test_gymnasium_jax_pendulum_by_id_gives_torch_tensors():
    """phys2d/Pendulum-v0 registers a JAX vector env (vector_entry_point): made with make_vec, through JaxToTorch."""
    import_or_skip("jax", "pip install -e '.[jax]'")
    assert is_tensor_task("phys2d/Pendulum-v0")
    envs, spec = make_tensor_vector_env("phys2d/Pendulum-v0", 8, seed=0, device="cpu")
    assert spec.obs_shape == (3,) and spec.action_dim == 1 and spec.episode_length == 200 and not spec.episodic
    out = [envs.step(torch.zeros(8, 1)) for _ in range(201)]
    assert out[199].truncated.all() and not out[200].transition.any() and out[200].started.all()
    assert all(isinstance(s.reward, torch.Tensor) and s.reward.dtype == torch.float32 for s in out)


def tensor_trainer(run: Path, env, resume: bool = False, **over):
    """The trainer the pipeline builds for a tensor env object (as tdmpc.fit(env=...) does)."""
    cfg = validate(Config(**{**TINY, "num_envs": env.num_envs, **over, "run_dir": str(run)}))
    return open_run(RunRequest(saved_config(run) if resume else cfg, resume=run if resume else None,
                               base=saved_config(run) if resume else None, env=env))


def test_a_tensor_env_trains_resumes_exactly_and_evaluates(tmp_path):
    """Stopped at step 300 (a checkpoint), resumed: the buffer and weights are the checkpoint's, and the run ends
    at 600 having learnt (the return is the sum of the actions: random play gets about 0, the best 2 x 25)."""
    run = tmp_path / "run"
    first = tensor_trainer(run, TorchPointEnv(num_envs=4, length=25), eval_episodes=2)  # one can start far from 0
    original = first.step

    def step():
        original()
        if first.counters.step >= 300:
            first.stop_reason = "signal SIGTERM"

    first.step = step
    assert first.run() == 3
    second = tensor_trainer(run, TorchPointEnv(num_envs=4, length=25), resume=True)
    P = int(first.buffer.ptr.min())  # rows before each env's next one: the resume starts new episodes there
    assert P > 50 and torch.equal(first.buffer.ptr + 1, second.buffer.ptr)
    for name in ("obs", "action", "reward", "terminated", "valid", "first"):
        assert torch.equal(getattr(first.buffer, name)[:, :P], getattr(second.buffer, name)[:, :P]), name
    for p1, p2 in zip(first.agent.model.parameters(), second.agent.model.parameters()):
        assert torch.equal(p1, p2)
    assert second.counters.updates == first.counters.updates
    assert second.run() == 0 and second.counters.step == 600
    evals = read_csv(run / "eval.csv")
    assert [int(r["env_step"]) for r in evals] == [0, 400, 600] and all(r["episode_length"] == "25" for r in evals)
    assert abs(float(evals[0]["episode_return"])) < 10 and float(evals[-1]["episode_return"]) > 15, evals
    assert any(r["episode_return"] for r in read_csv(run / "train.csv"))


def test_a_training_step_on_tensor_envs_touches_no_numpy(tmp_path, monkeypatch):
    """Seeding steps, the pretraining burst and acting steps with every numpy conversion made to fail."""
    trainer = tensor_trainer(tmp_path / "run", TorchPointEnv(num_envs=4, length=25), seed_steps=40, batch_size=8)

    def refused(*args, **kw):
        raise AssertionError("numpy on the tensor path")

    monkeypatch.setattr(torch.Tensor, "numpy", refused)
    monkeypatch.setattr(torch, "from_numpy", refused)
    monkeypatch.setattr(torch.Tensor, "tolist", refused)
    monkeypatch.setattr(torch.Tensor, "item", refused)
    for _ in range(20):
        trainer.step()
    monkeypatch.undo()
    assert trainer.counters.step == 80 and trainer.counters.updates > 10
    assert trainer.buffer.num_valid_starts > 0
    trainer.close()


def test_a_training_step_on_tensor_envs_copies_nothing_and_never_waits(tmp_path):
    """One step that acts with the planner, stores its rows and updates, on CUDA's code path: no host-to-device
    copy and no host wait (the numpy path has one wait, the action coming back)."""
    from tdmpc.runtime.device import cuda_code_path
    from tdmpc.bench.kernels import TransferCounter

    with cuda_code_path():
        trainer = tensor_trainer(tmp_path / "run", TorchPointEnv(num_envs=4, length=25), seed_steps=40, batch_size=8,
                                 update_every=1, updates_per_round=1)
        while trainer.counters.step < 80:
            trainer.step()
        updates = trainer.counters.updates
        with TransferCounter() as c:
            trainer.step()
    assert trainer.counters.updates == updates + 1
    assert c.h2d_copies == 0 and c.blocking_waits == 0, (c.h2d, c.waits)
    trainer.close()


def test_act_takes_and_returns_tensors_on_the_agents_device(tmp_path):
    trainer = tensor_trainer(tmp_path / "run", TorchPointEnv(num_envs=4, length=25))
    agent = trainer.agent
    batch = agent.act(torch.zeros(3, 2), eval_mode=True)
    one = agent.act(torch.zeros(2), eval_mode=True)
    assert isinstance(batch, torch.Tensor) and batch.shape == (3, 1) and batch.device == agent.device
    assert isinstance(one, torch.Tensor) and one.shape == (1,)
    assert isinstance(agent.act(np.zeros(2, np.float32), eval_mode=True), np.ndarray)  # numpy in, numpy out
    trainer.close()


def test_non_finite_data_from_a_tensor_env_stops_the_run_with_one_line(tmp_path, capsys):
    trainer = tensor_trainer(tmp_path / "run", Broken("nan", num_envs=4), log_every=20, eval_episodes=0)
    assert trainer.run() == 1
    err = capsys.readouterr().err
    assert "error: env 2 (custom:Broken) returned a non-finite reward at env step 0" in err
    assert "--nonfinite-data drop" in err
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").is_file()


def test_with_drop_a_non_finite_env_stores_nothing_more_and_the_returns_stay_finite(tmp_path, capsys):
    trainer = tensor_trainer(tmp_path / "run", Broken("nan", num_envs=4), log_every=20, eval_episodes=0,
                             nonfinite_data="drop", steps=60)
    assert trainer.run() == 0
    assert "note: env 2 (custom:Broken) returned a non-finite reward at env step 0; its transitions are dropped" in capsys.readouterr().err
    assert torch.isfinite(trainer.buffer.reward).all() and torch.isfinite(trainer.ep_return).all()
    assert not trainer.buffer.valid[2].any() and trainer.buffer.valid[0].any()


def test_a_users_registered_vector_env_trains_by_its_id(tmp_path):
    cfg = validate(Config(**{**TINY, "task": "test_tensor_envs:TorchPoint-v0", "num_envs": 4, "steps": 240,
                             "eval_freq": 240, "run_dir": str(tmp_path / "run")}))
    trainer = open_run(RunRequest(cfg))
    assert trainer.spec.episode_length == 10 and trainer.spec.episodic  # its spec's limit, its metadata
    assert trainer.run() == 0
    assert [int(r["env_step"]) for r in read_csv(tmp_path / "run" / "eval.csv")] == [0, 240]


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_gymnasium_jax_pendulum_trains_from_the_command_line(tmp_path):
    import_or_skip("jax", "pip install -e '.[jax]'")
    r = run_train("--cfg", str(tiny_json(tmp_path, task="phys2d/Pendulum-v0", num_envs=8, steps=400, seed_steps=200,
                                         updates_per_round=2, eval_freq=400, eval_episodes=2, save_every=400,
                                         run_dir=str(tmp_path / "run"))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "AutoresetMode" not in r.stderr  # gymnasium's warning on its own JAX envs: next-step, as assumed
    evals = read_csv(tmp_path / "run" / "eval.csv")
    assert [int(e["env_step"]) for e in evals] == [0, 400] and all(e["episode_length"] == "200" for e in evals)
    # python -m tdmpc.evaluate plays the checkpoint on the tensor env, its 3 episodes at once; the report's default
    # name keeps the id's namespace slash out of the path
    r = run_module("tdmpc.evaluate", "--checkpoint", tmp_path / "run" / "checkpoints" / "latest.pt", "--episodes", 3,
                   "--seed", 0)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "checkpoints" / "eval_phys2d_Pendulum-v0_seed0.json").read_text())
    assert report["episodes"] == 3 and report["lengths"] == [200, 200, 200] and report["task"] == "phys2d/Pendulum-v0"


@pytest.mark.parametrize("over,flag", [({"save_video": True}, "--save-video"), ({"save_data": "d.h5"}, "--save-data"),
                                       ({"vectorization": "async"}, "--vectorization"),
                                       ({"overlap_updates": True}, "--overlap-updates")])
def test_what_tensor_envs_do_not_do_is_refused_in_one_line(tmp_path, over, flag):
    with pytest.raises(BadInput) as e:
        tensor_trainer(tmp_path / "run", TorchPointEnv(), **over)
    assert f"{flag} is not supported with tensor-native envs" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task", ["Pendulum-v1,test_tensor_envs:TorchPoint-v0", "test_tensor_envs:TorchPoint-v0,Pendulum-v1"])
def test_a_multi_task_run_with_a_tensor_task_is_refused_in_one_line(tmp_path, task):
    """docs/gpu-simulators.md says so; the check fired only for a single tensor id, and such a list trained its
    tensor task on the host path."""
    cfg = validate(Config(**{**TINY, "task": task, "run_dir": str(tmp_path / "run")}))
    with pytest.raises(BadInput) as e:
        open_run(RunRequest(cfg, dry_run=True))
    assert str(e.value).startswith("multi-task runs are not supported with tensor-native envs (test_tensor_envs:")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_the_docs_list_every_refusal_for_tensor_envs():
    """docs/gpu-simulators.md names each flag _check_tensor_run refuses (--overlap-updates was missing), and
    multi-task runs."""
    import inspect

    from tdmpc.training import setup

    docs = " ".join((Path(__file__).resolve().parent.parent / "docs" / "gpu-simulators.md").read_text().split())
    refusals = docs[docs.index("Refused in one line for tensor envs"):][:600]
    names = re.findall(r'"(\w+)": ', inspect.getsource(setup._check_tensor_run))
    assert "overlap_updates" in names and len(names) >= 6
    for name in names:
        assert f"`--{name.replace('_', '-')}" in refusals, f"--{name.replace('_', '-')} is refused but not documented"
    assert "multi-task runs" in refusals
