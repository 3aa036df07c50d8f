"""--compile: compiled plan() and update() compute what the eager ones do, compile once, and learn.

Compiling is slow on 2 cores, so these run in CI's own step (`python -m pytest -m compile`), not in the
default suite. The random draws are inductor's own unless fallback_random is set; with it set, compiled and
eager draw the same numbers from the same seed, which is what lets the outputs be compared."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch._inductor.config as inductor_config

from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config, validate
from tdmpc.model.world_model import ModelDims

from test_learning import CONFIG, THRESHOLD

pytestmark = pytest.mark.compile

SMALL = dict(model_size=None, enc_dim=32, mlp_dim=32, latent_dim=16, num_enc_layers=2, num_q=5, num_samples=32,
             num_elites=4, num_pi_trajs=4, iterations=2, horizon=3, batch_size=16, precision="fp32", device="cpu")
OBS, ACT = 5, 2


@pytest.fixture(autouse=True)
def same_random_numbers():
    # config.patch, not monkeypatch: pytest 9.2's monkeypatch deletes an attribute it did not find in the module's
    # __dict__ on undo, and inductor's config keeps its values elsewhere, so the second test found none.
    with inductor_config.patch(fallback_random=True):
        torch._dynamo.reset()
        yield


def make(compile: bool, kind: str, **over) -> Agent:
    tasks = ("cartpole-swingup", "cheetah-run") if kind == "multitask" else ()
    cfg = validate(Config(**{**SMALL, **over}, compile=compile, episodic=kind == "episodic",
                          **({"task_set": tasks, "task": "mt2"} if tasks else {})))
    dims = ModelDims.from_config(cfg, (OBS,), ACT, kind == "episodic", tasks=tasks, action_dims=(1, 2) if tasks else (),
                                 discrete=kind == "discrete")
    torch.manual_seed(0)
    return Agent(cfg, dims, [100, 200] if tasks else 100, torch.device("cpu"))


def batch(agent: Agent, multitask: bool) -> Batch:
    g = torch.Generator().manual_seed(1)
    H, B = agent.cfg.horizon, agent.cfg.batch_size
    action = (torch.randint(0, ACT, (H, B), generator=g) if agent.dims.discrete
              else torch.rand(H, B, ACT, generator=g) * 2 - 1)
    return Batch(torch.randn(H + 1, B, OBS, generator=g), action,
                 torch.randn(H, B, generator=g), torch.rand(H, B, generator=g) < 0.1,
                 torch.randint(0, 2, (B,), generator=g) if multitask else None)


@pytest.mark.parametrize("kind", ["single", "multitask", "episodic", "discrete"])
def test_compiled_plan_and_update_equal_the_eager_ones(kind):
    eager, compiled = make(False, kind), make(True, kind)
    # A reward head that spreads the candidates' returns: the zero-initialised one values them all within ~1e-5,
    # where float-level differences reorder near-tied elites, and the final draw picks an elite by position. (The
    # Q heads stay as they are: the policy loss would turn lr-sized differences of Adam's steps into large ones.)
    torch.manual_seed(5)
    torch.nn.init.normal_(eager.model._reward[-1].weight, std=0.5)
    if kind == "episodic":  # predictions far from the 0.5 threshold, which float-level differences could cross
        torch.nn.init.constant_(eager.model._termination[-1].bias, -4.0)
    eager.load_state_dict(eager.state_dict())  # as a checkpoint would: the planning copy takes the new weights
    obs = torch.randn(3, OBS)
    task = [0, 1, 1] if kind == "multitask" else None
    for step in range(3):  # acting, then an update that refreshes the planning copy, then acting again
        # From the same state each step: the termination threshold would turn float-level differences between
        # compiled and eager updates into different elites a step later.
        compiled.load_state_dict(eager.state_dict())
        actions = []
        for agent in (eager, compiled):
            torch.manual_seed(10 + step)
            actions.append(agent.act(obs, first_step=step == 0, task=task))
        assert torch.allclose(torch.as_tensor(actions[0]), torch.as_tensor(actions[1]), atol=1e-4), (kind, step)
        metrics = []
        for agent in (eager, compiled):
            torch.manual_seed(20 + step)
            metrics.append(agent.update(batch(agent, kind == "multitask")))
        for name in ("consistency_loss", "reward_loss", "value_loss", "pi_loss", "grad_norm"):
            assert torch.allclose(metrics[0][name], metrics[1][name], rtol=1e-4, atol=1e-5), (kind, step, name)
    # Adam moves each weight by about lr whatever its gradient's size, so where a gradient is ~0 float-level
    # differences can move a weight by up to 2 lr; on the whole the weights agree far closer than that.
    # (A single small bias whose gradient is ~0 throughout can average near lr / 10 by itself: the discrete
    # model's did, at 3.1e-5 against 3e-5, with its losses and actions equal to the eager ones.)
    lr = eager.cfg.lr
    diffs = [(a - b).abs().detach() for a, b in zip(eager.model.parameters(), compiled.model.parameters())]
    assert all(d.max() <= 2 * lr for d in diffs), max(float(d.max()) for d in diffs)
    assert torch.cat([d.flatten() for d in diffs]).mean() < lr / 10


def test_bf16_planning_compiled_stays_close_to_eager():
    """bf16 planning: inductor fuses and rounds differently, so elites can differ; the planned mean of a
    single-iteration plan stays within 0.05 of eager's (actions in [-1, 1])."""
    eager, compiled = make(False, "single", precision="bf16"), make(True, "single", precision="bf16")
    obs = torch.randn(4, OBS)
    means = []
    for agent in (eager, compiled):
        torch.manual_seed(3)
        agent.act(obs, first_step=True, eval_mode=True)
        means.append(agent.planner(4, "eval").mean)
    assert (means[0] - means[1]).abs().max() < 0.05


def test_no_recompilation_after_the_first_calls(tmp_path):
    """Acting, updating (which refreshes the planning copy in place), saving and loading a checkpoint (a
    resume) leave every compiled function as it was compiled: no new graphs."""
    agent = make(True, "single")
    obs = torch.randn(2, OBS)
    agent.act(obs, first_step=True)
    agent.update(batch(agent, False))
    agent.act(obs)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs > 0
    for _ in range(3):
        agent.update(batch(agent, False))
        agent.act(obs)
    agent.save(tmp_path / "ck.pt")
    agent.load(tmp_path / "ck.pt")
    agent.act(obs)
    agent.update(batch(agent, False))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_a_second_agent_of_the_same_shapes_compiles_nothing(capsys):
    """The bench and the tests build many agents: one of shapes already compiled reuses those graphs (no
    recompile, no line saying it compiled); one of new shapes compiles its own and says so."""
    first = make(True, "single")
    first.update(batch(first, False))
    first.act(torch.randn(2, OBS), first_step=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    capsys.readouterr()
    second = make(True, "single")
    second.update(batch(second, False))
    second.act(torch.randn(2, OBS), first_step=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert "compiled in" not in capsys.readouterr().err
    second.act(torch.randn(3, OBS), first_step=True)  # a planner for 3 envs: new shapes
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert "compile: plan() for 3 env(s), train compiled in" in capsys.readouterr().err


def test_plans_from_staged_and_from_separate_inputs_both_compile(capsys):
    """The H200 bench's profile step: a plan compiled for separate inputs (a CUDA graph's static copies), then
    another agent's act() from numpy, whose observations and first-step flags are two views of one staging copy
    (CUDA's path, taken on the CPU). On torch 2.11 the second fell back to eager ("wrong number of dimensions":
    inductor's cache gave it the first graph); neither may."""
    from tdmpc.runtime.device import cuda_code_path

    obs = np.random.default_rng(0).standard_normal((2, OBS)).astype(np.float32)
    with cuda_code_path():
        first = make(True, "single")
        first.act_on_device(torch.from_numpy(obs).clone(), torch.ones(2, dtype=torch.bool))
        second = make(True, "single", cuda_graphs=False)
        second.act(obs, first_step=np.ones(2, dtype=bool))
        second.act(obs)
    err = capsys.readouterr().err
    assert "runs eagerly" not in err and "compile: plan() for 2 env(s), train compiled in" in err, err


def test_a_failed_compile_falls_back_to_eager_with_one_line(capsys):
    from tdmpc.runtime.compile import Compiled

    def unsupported(x):
        return torch.tensor(x.tolist()) + 1  # a host read: no full graph

    fn = Compiled(unsupported, "a test function")
    assert fn(torch.ones(2)).tolist() == [2.0, 2.0]
    assert fn(torch.ones(2)).tolist() == [2.0, 2.0]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("compile: a test function runs eagerly, its compile failed")
    assert re.search(r"\) at [\w.]+\.py:\d+: \S", err[0]), err[0]  # where it raised, for a report


CACHED = """
import torch
from tdmpc.runtime.compile import Compiled
Compiled(lambda x: (x * 2).sin() @ x.T, "a test function")(torch.ones(3, 3))
"""


def test_a_compile_from_inductors_cache_says_so(tmp_path):
    """A second process of the same graph takes it from inductor's on-disk cache (what a warm start or a cache
    carried to another machine gives), and its line says so; the first says nothing of a cache."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    lines = [next(line for line in subprocess.run([sys.executable, "-c", CACHED], capture_output=True, text=True,
                                                  env=env, timeout=600, check=True).stderr.splitlines()
                  if line.startswith("compile: ")) for _ in range(2)]
    assert lines[0].startswith("compile: a test function compiled in") and "cache" not in lines[0], lines[0]
    assert lines[1].endswith(", 1 of 1 graphs from inductor's cache"), lines[1]


def test_compiled_training_learns_pendulum(tmp_path):
    cfg = tmp_path / "learn.json"
    cfg.write_text(json.dumps({**CONFIG, "compile": True}))
    r = subprocess.run([sys.executable, "-m", "tdmpc.train", "--cfg", str(cfg), "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr
    # the speed probe's planner compiles plan() for 1 env; the training planner, of the same shapes, reuses it
    plans = [ln for ln in r.stderr.splitlines() if ln.startswith("compile: plan() for 1 env(s)")]
    assert len(plans) == 1 and "compiled in" in plans[0], r.stderr
    final = float((tmp_path / "run" / "eval.csv").read_text().strip().splitlines()[-1].split(",")[2])
    assert final > THRESHOLD, f"eval return {final:.0f} with --compile: learning is broken"
