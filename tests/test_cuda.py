"""CUDA paths: graphed plan() and update(), learning and checkpoints on a GPU. Skipped without one (CI has none)."""

import json

import numpy as np
import pytest
import torch

from tdmpc.planners.mppi import GaussianMPPI, MPPIConfig
from tdmpc.agent import Agent
from tdmpc.buffer import Batch
from tdmpc.config import Config
from tdmpc.runtime.cuda_graphs import CUDAGraphed
from tdmpc.model.world_model import ModelDims

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")


class CudaQuadratic:
    """The planner test's known-optimum model, on the GPU."""

    num_q, episodic = 2, False
    latent_dim, latent_dtype = 3, torch.float32  # the latent is the target action (A = 3 below)

    def encode(self, obs, task=None):
        return obs

    def next(self, z, a, task=None):
        return z

    def latent_part(self, z, task=None):
        return z

    def step(self, z, a, task=None, z_part=None):
        z = z_part if z_part is not None else z
        return z, -((a - z) ** 2).sum(-1, keepdim=True)

    def reward_logits(self, features):
        return torch.stack(features)

    def termination(self, z):
        return torch.zeros(z.shape[:-1] + (1,), device=z.device)

    def q_heads(self, pairs):
        return list(pairs)

    def prior_q(self, z, task, reduce, heads=None, eps=None):
        return torch.zeros(z.shape[:-1] + (1,), device=z.device)

    def pi(self, z, task=None):
        from tdmpc.model.policy import PolicyOutput
        a = torch.rand_like(z) * 2 - 1
        zero = torch.zeros(z.shape[:-1] + (1,), device=z.device)
        return PolicyOutput(a, a, torch.zeros_like(a), zero, zero, zero)

    def pi_action(self, z, task=None, eps=None):
        return self.pi(z, task).action if eps is None else torch.tanh(eps)

    def action_mask(self, task):
        return None

    def decode(self, logits):
        return logits


def test_graphed_plan_follows_new_inputs():
    N, A = 4, 3
    planner = GaussianMPPI(CudaQuadratic(), MPPIConfig.from_config(Config(iterations=10), A), N, A, 0.99, CUDA)
    graphed = CUDAGraphed(lambda o, f: planner.plan(o, f, True))
    first = torch.ones(N, dtype=torch.bool, device=CUDA)
    for _ in range(6):  # warm-up calls, the capture, then replays with fresh targets
        targets = torch.rand(N, A, device=CUDA) * 1.6 - 0.8
        action = graphed(targets, first)
        assert (action - targets).abs().max() < 0.1
    assert graphed.graph is not None


def make_agent(graphs: bool, compile: bool = False, **over) -> Agent:
    cfg = Config(model_size=1, num_samples=128, num_elites=16, num_pi_trajs=8, iterations=3, batch_size=64,
                 device="cuda", cuda_graphs=graphs, compile=compile, **over)
    torch.manual_seed(0)
    return Agent(cfg, ModelDims.from_config(cfg, (24,), 6, True), 500, CUDA)


def test_graphed_update_learns_and_refreshes_the_planning_copy():
    agent = make_agent(graphs=True)
    g = torch.Generator().manual_seed(0)
    batch = Batch(torch.randn(4, 64, 24, generator=g).cuda(), torch.rand(3, 64, 6, generator=g).cuda(),
                  torch.randn(3, 64, generator=g).cuda(), torch.zeros(3, 64, dtype=torch.bool).cuda())
    losses = [agent.update(batch)["total_loss"].item() for _ in range(30)]
    assert agent.learner._update_fn.graph is not None
    assert losses[-1] < 0.7 * losses[0]
    obs = np.random.randn(2, 24).astype(np.float32)
    agent.act(obs, np.ones(2, dtype=bool))
    for p_copy, p in zip(agent.plan_model.parameters(), agent.model.parameters()):
        assert torch.allclose(p_copy.float(), p.float(), atol=1e-2)


def test_no_host_sync_in_graphed_act_and_update():
    from test_fast_paths import CountSyncs

    agent = make_agent(graphs=True)
    batch = Batch(torch.randn(4, 64, 24, device=CUDA), torch.rand(3, 64, 6, device=CUDA),
                  torch.randn(3, 64, device=CUDA), torch.zeros(3, 64, dtype=torch.bool, device=CUDA))
    obs, first = np.random.randn(2, 24).astype(np.float32), np.ones(2, dtype=bool)
    for _ in range(5):
        agent.act(obs, first)
        agent.update(batch)
    with CountSyncs() as counter:
        agent.act(obs, first)
        agent.update(batch)
    assert counter.calls == []


def test_a_discrete_agent_plans_and_updates_as_cuda_graphs_without_host_syncs():
    from test_fast_paths import CountSyncs

    cfg = Config(model_size=1, num_samples=128, num_elites=16, num_pi_trajs=8, iterations=3, batch_size=64,
                 device="cuda", cuda_graphs=True, compile=False)  # eager kernels under graphs (compiled: below)
    torch.manual_seed(0)
    agent = Agent(cfg, ModelDims.from_config(cfg, (4,), 3, True, discrete=True), 500, CUDA)
    batch = Batch(torch.randn(4, 64, 4, device=CUDA), torch.randint(3, (3, 64), device=CUDA, dtype=torch.int32),
                  torch.randn(3, 64, device=CUDA), torch.zeros(3, 64, dtype=torch.bool, device=CUDA))
    obs, first = np.random.randn(2, 4).astype(np.float32), np.ones(2, dtype=bool)
    for _ in range(5):
        action = agent.act(obs, first)
        agent.update(batch)
    assert action.dtype == np.int64 and ((action >= 0) & (action < 3)).all()
    assert agent.learner._update_fn.graph is not None and all(fn.graph is not None for fn in agent.actor._plan_fns.values())
    with CountSyncs() as counter:
        agent.act(obs, first)
        agent.update(batch)
    assert counter.calls == []


def fresh_batch(g: torch.Generator) -> Batch:
    """A random batch of B = 64 sub-trajectories (H = 3) for make_agent's model, on the GPU."""
    return Batch(torch.randn(4, 64, 24, generator=g).cuda(), torch.rand(3, 64, 6, generator=g).cuda() * 2 - 1,
                 torch.randn(3, 64, generator=g).cuda(), torch.zeros(3, 64, dtype=torch.bool).cuda())


def assert_same_losses(a: dict, b: dict, step: int) -> None:
    """The world model's losses of two updates on one batch, within 5% (dropout's random stream aside)."""
    for key in ("consistency_loss", "reward_loss", "value_loss"):
        assert abs(a[key].item() - b[key].item()) <= 0.05 * abs(a[key].item()) + 1e-3, (step, key, a, b)


def test_graphed_update_matches_eager():
    """The captured update replays the same arithmetic as eager mode on fresh batches (dropout's random
    stream aside): a replay that kept stale inputs or outputs would drift from the eager losses."""
    eager, graphed = make_agent(graphs=False), make_agent(graphs=True)
    g = torch.Generator().manual_seed(1)
    for step in range(12):
        batch = fresh_batch(g)
        assert_same_losses(eager.update(batch), graphed.update(batch), step)
    assert graphed.learner._update_fn.graph is not None


def test_cuda_graphs_capture_the_compiled_plan_and_update():
    """--compile under CUDA graphs: the graphs capture the compiled functions (the first warm-up call compiles),
    the replays learn as the eager graphed update does, act() still replays without a host sync, and planning
    finds what the eager graphed planner finds on the same weights.

    Planning in fp32 with full-precision matmuls, with fallback_random (eager's random numbers): then compiled and
    eager planners agree to float level (on the CPU 1.2e-5 at these sizes). In bf16 they do not, and need not:
    inductor keeps a fused kernel's intermediates in fp32 where eager rounds each op to bf16, near-tied elites
    reorder, and three iterations carry it on (planned means 0.35 and 0.32 apart on an H200, 2026-11-26 and -27;
    0.07-0.19 on the CPU). A reward head that spreads the candidates' returns keeps elites from near-ties, as in
    test_compile.py."""
    from test_fast_paths import CountSyncs
    import torch._inductor.config

    exact = dict(precision="fp32", matmul_precision="highest")
    with torch._inductor.config.patch(fallback_random=True):  # not monkeypatch: see test_compile.py
        eager, compiled = make_agent(graphs=True, **exact), make_agent(graphs=True, compile=True, **exact)
        g = torch.Generator().manual_seed(1)
        obs, first = np.random.randn(2, 24).astype(np.float32), np.ones(2, dtype=bool)
        for step in range(12):
            batch = fresh_batch(g)
            assert_same_losses(eager.update(batch), compiled.update(batch), step)
            compiled.act(obs, first)
        assert compiled.learner._update_fn.graph is not None and compiled.actor._plan_fns[(2, "train", False)].graph is not None
        with CountSyncs() as counter:
            compiled.act(obs, first)
            compiled.update(batch)
        assert counter.calls == []
        torch.manual_seed(5)
        torch.nn.init.normal_(eager.model._reward[-1].weight, std=0.5)
        eager.load_state_dict(eager.state_dict())  # as a checkpoint would: the planning copy takes the new weights
        compiled.load_state_dict(eager.state_dict())
        for agent in (eager, compiled):  # the eval planners' first calls compile and capture: not the compared ones
            agent.act(obs, first, eval_mode=True)
        means = []
        for agent in (eager, compiled):
            torch.manual_seed(3)
            agent.act(obs, first, eval_mode=True)
            means.append(agent.planner(2, "eval").mean)
        assert (means[0] - means[1]).abs().max() < 1e-3


def test_updates_on_their_own_stream_compute_what_the_serial_order_does(tmp_path):
    """--update-stream: the same run (seed, steps, overlap_updates) with its rounds of updates on a side stream and
    on the default one. A plan that read a half-written planning copy, or a batch drawn from rows being written,
    would send the runs apart; the serial order run twice bounds what the GPU's own nondeterminism accounts for."""
    from tdmpc.config import validate
    from tdmpc.training.setup import trainer_for

    from helpers import TINY

    def run(name: str, stream: bool) -> list[torch.Tensor]:
        cfg = validate(Config(**{**TINY, "device": "cuda", "seed_steps": 100, "steps": 10**6, "eval_freq": 10**6,
                                 "log_every": 10**6, "save_every": 10**6, "overlap_updates": True,
                                 "update_stream": stream, "compile": False}))  # the order, not the kernels
        trainer = trainer_for(cfg, tmp_path / name, CUDA)
        assert (trainer.agent.streams.stream is not None) == stream
        while trainer.counters.step < 300:
            trainer.step()
        trainer.evaluate()  # joins the side stream
        params = [p.detach().clone() for p in trainer.agent.model.parameters()]
        trainer.close()
        return params

    serial, again, side = run("serial", False), run("again", False), run("side", True)
    noise = max((a - b).abs().max().item() for a, b in zip(serial, again))
    apart = max((a - b).abs().max().item() for a, b in zip(serial, side))
    assert apart <= max(10 * noise, 1e-5), (apart, noise)


def test_pendulum_learns_on_cuda(tmp_path):
    """The CI learning task, on the GPU (bf16 planning, fp32 updates, CUDA graphs): the same bar as on the CPU."""
    from test_learning import CONFIG, THRESHOLD

    from helpers import read_csv, run_train

    cfg = tmp_path / "learn.json"
    cfg.write_text(json.dumps({**CONFIG, "device": "cuda", "precision": "auto"}))
    r = run_train("--cfg", cfg, "--run-dir", tmp_path / "run", timeout=1200)
    assert r.returncode == 0, r.stderr
    final = float(read_csv(tmp_path / "run" / "eval.csv")[-1]["episode_return"])
    assert final > THRESHOLD, final


def test_checkpoint_moves_between_gpu_and_cpu(tmp_path):
    """A run checkpointed on the GPU resumes on the CPU, and back, to its planned end."""
    from helpers import run_train, tiny_json

    run = tmp_path / "run"
    cfg = tiny_json(tmp_path, device="cuda", steps=400, eval_freq=400, save_every=400)
    for device, steps in (("cuda", 400), ("cpu", 600), ("cuda", 800)):
        args = ("--cfg", cfg, "--run-dir", run) if steps == 400 else ("--resume", run)
        r = run_train(*args, "--device", device, "--steps", steps)
        assert r.returncode == 0, r.stderr
        ck = torch.load(run / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
        assert ck["train"]["step"] == steps and ck["train"]["finished"]


def test_gpu_mem_caps_a_real_runs_allocator(tmp_path):
    """--gpu-mem in a real run on CUDA (tests/test_memory.py checks the cap on a mocked card): the run says what
    it set, and its peak reserved memory stays under the cap."""
    from helpers import read_csv, run_train, tiny_json

    r = run_train("--cfg", tiny_json(tmp_path, device="cuda"), "--run-dir", tmp_path / "run", "--gpu-mem", "1GiB")
    assert r.returncode == 0, r.stderr
    assert "memory: allocator capped at 1.0 GiB" in r.stdout + r.stderr
    peaks = [float(row["gpu_peak_reserved_gib"]) for row in read_csv(tmp_path / "run" / "train.csv")]
    assert peaks and max(peaks) <= 1.0, peaks
