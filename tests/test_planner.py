import pytest
import torch

from tdmpc.model.policy import PolicyOutput
from tdmpc.config import Config
from tdmpc.planners.mppi import GaussianMPPI, MPPIConfig


class QuadraticModel:
    """Latent = the target action a*; reward = -||a - a*||^2; Q = 0. The best action is a*.

    With `action_dims` it is a multi-task model: task t acts on its first action_dims[t] dims only."""

    num_q = 2
    episodic = False
    latent_dtype = torch.float32

    def __init__(self, action_dims=None, A=None):
        self.latent_dim = A  # the latent is the target action
        self.masks = None
        if action_dims is not None:
            self.masks = torch.tensor([[1.0] * n + [0.0] * (A - n) for n in action_dims])

    def encode(self, obs, task=None):
        return obs

    def next(self, z, a, task=None):
        return z

    def reward(self, z, a, task=None):
        return -((a - z) ** 2).sum(-1, keepdim=True)  # "logits" that decode() passes through

    def latent_part(self, z, task=None):
        return z

    def step(self, z, a, task=None, z_part=None):
        z = z_part if z_part is not None else z
        return self.next(z, a), self.reward(z, a)

    def reward_logits(self, features):
        return torch.stack(features)

    def termination(self, z):
        return torch.zeros(z.shape[:-1] + (1,))

    def q_heads(self, pairs):
        return list(pairs)

    def prior_q(self, z, task, reduce, heads=None, eps=None):
        return torch.zeros(z.shape[:-1] + (1,))

    def pi(self, z, task=None):
        a = torch.rand(z.shape[:-1] + (z.shape[-1],)) * 2 - 1
        zero = torch.zeros(z.shape[:-1] + (1,))
        return PolicyOutput(a, a, torch.zeros_like(a), zero, zero, zero)

    def pi_action(self, z, task=None, eps=None):
        return self.pi(z, task).action if eps is None else torch.tanh(eps)

    def action_mask(self, task):
        return None if self.masks is None else self.masks[task]

    def decode(self, logits):
        return logits


def test_planner_finds_known_optimum_for_a_batch_of_envs():
    N, A = 5, 4
    targets = torch.rand(N, A) * 1.6 - 0.8  # a different a* per env
    # The returned action is an elite *sampled* from the softmax weights (as in the reference),
    # so it sits about one final std (~0.07 after 6 iterations) from the mean; 10 iterations
    # shrink that spread below the 0.1 tolerance.
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(iterations=10), A), N, A, discount=0.99, device=torch.device("cpu"))
    action = planner.plan(targets, torch.ones(N, dtype=torch.bool), eval_mode=True)
    assert action.shape == (N, A)
    assert (action - targets).abs().max() < 0.1


def test_reference_settings_converge_the_mean_to_the_optimum():
    N, A = 5, 4
    targets = torch.rand(N, A) * 1.6 - 0.8
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(), A), N, A, discount=0.99, device=torch.device("cpu"))
    planner.plan(targets, torch.ones(N, dtype=torch.bool), eval_mode=True)
    assert (planner.prev_mean[0] - targets).abs().max() < 0.06


def test_exploration_noise_only_outside_eval_mode():
    N, A = 3, 2
    targets = torch.zeros(N, A)
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(), A), N, A, discount=0.99, device=torch.device("cpu"))
    first = torch.ones(N, dtype=torch.bool)
    torch.manual_seed(1)
    a_eval = planner.plan(targets, first, eval_mode=True)
    torch.manual_seed(1)
    a_train = planner.plan(targets, first, eval_mode=False)
    assert not torch.allclose(a_eval, a_train)
    assert (a_train - a_eval).abs().max() < 1.0  # noise scale is the final std (>= min_std, small here)


def test_warm_start_shifts_by_one_step_and_resets_per_env():
    N, A, H = 3, 2, 3
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(horizon=H), A), N, A, discount=0.99, device=torch.device("cpu"))
    prev = torch.arange(H * N * A, dtype=torch.float32).view(H, N, A)
    planner.prev_mean.copy_(prev)
    planner._warm_start(torch.tensor([False, True, False]))
    for env in (0, 2):
        assert torch.equal(planner.mean[:-1, env], prev[1:, env])
        assert torch.equal(planner.mean[-1, env], torch.zeros(A))
    assert torch.equal(planner.mean[:, 1], torch.zeros(H, A))
    assert torch.equal(planner.std, torch.full((H, N, A), 2.0))


def test_plan_saves_mean_for_next_step():
    N, A = 2, 3
    targets = torch.tensor([[0.5, -0.5, 0.2], [-0.3, 0.1, 0.7]])
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(), A), N, A, discount=0.99, device=torch.device("cpu"))
    planner.plan(targets, torch.ones(N, dtype=torch.bool), eval_mode=True)
    # every step of the horizon has the same optimum here, so the saved mean is near a* everywhere
    assert (planner.prev_mean - targets).abs().max() < 0.15


def test_plan_runs_in_inference_mode_with_preallocated_buffers():
    N, A = 2, 2
    planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(), A), N, A, discount=0.99, device=torch.device("cpu"))
    ptrs = [t.data_ptr() for t in (planner.actions, planner.noise, planner.mean, planner.std, planner.prev_mean)]
    out = planner.plan(torch.zeros(N, A), torch.ones(N, dtype=torch.bool))
    assert out.is_inference()
    assert ptrs == [t.data_ptr() for t in (planner.actions, planner.noise, planner.mean, planner.std,
                                           planner.prev_mean)]


def test_chunked_rollouts_plan_like_one_big_call():
    N, A = 6, 3
    targets = torch.rand(N, A) * 1.6 - 0.8
    results = []
    for chunk_rows in (None, 1024):  # all envs at once, or 2 envs per model call
        planner = GaussianMPPI(QuadraticModel(A=A), MPPIConfig.from_config(Config(), A), N, A, discount=0.99, device=torch.device("cpu"),
                       chunk_rows=chunk_rows)
        torch.manual_seed(3)
        results.append(planner.plan(targets, torch.ones(N, dtype=torch.bool), eval_mode=True))
    assert planner.chunk_envs == 2
    assert torch.allclose(results[0], results[1], atol=1e-6)


def test_each_env_plans_for_its_own_task_with_its_mask_and_discount():
    """Tasks with 1, 2 and 3 action dims: masked dims are exactly 0, the active ones find the optimum; the
    return is discounted with each env's own task discount."""
    N, A = 6, 3
    model = QuadraticModel(action_dims=[1, 2, 3], A=A)
    discounts = torch.tensor([0.5, 0.9, 0.99])
    planner = GaussianMPPI(model, MPPIConfig.from_config(Config(iterations=10), A), N, A, discount=discounts,
                   device=torch.device("cpu"), chunk_rows=1024)  # 2 envs per model call, as on a CPU
    assert planner.chunk_envs == 2
    task = torch.tensor([0, 1, 2, 2, 1, 0])
    target = torch.tensor([[0.5, -0.3, 0.2], [-0.2, 0.4, -0.6], [0.1, 0.7, -0.4]]).repeat(2, 1)
    torch.manual_seed(0)
    action = planner.plan(target, torch.ones(N, dtype=torch.bool), eval_mode=True, task=task)
    mask = model.masks[task]
    assert torch.equal(action * (1 - mask), torch.zeros_like(action))
    assert ((action - target * mask).abs() * mask).max() < 0.1
    assert torch.allclose(planner.gamma.view(-1), discounts[task])
    # a perfect candidate of env e returns 0 at every step; the worst (all at -target) is discounted per task
    worst = planner.G.min(1).values.view(-1)
    assert (worst < 0).all()


def test_a_new_planner_is_its_class_and_one_registration_line(monkeypatch):
    """A toy planner (the policy prior's mean, no search) registered under a name and chosen by Config.planner:
    the agent plans with it; an unknown name is one line naming the planners there are."""
    from tdmpc.agent import Agent
    from tdmpc.config import validate
    from tdmpc.errors import ConfigError
    from tdmpc.model.random import TORCH
    from tdmpc.model.world_model import ModelDims
    from tdmpc.planners import make

    class PriorMean:
        def __init__(self, model, cfg, num_envs, action_dim, discount, device, chunk_rows, random=TORCH):
            self.model, self.random = model, random

        def plan_graph(self, obs, first_step, eval_mode=False, task=None):
            return self.model.pi(self.model.encode(obs, task), task).mean

        plan = plan_graph

        def buffer_bytes(self):
            return 0

    monkeypatch.setitem(make.PLANNERS, "prior-mean", PriorMean)  # the registration line
    cfg = validate(Config(model_size=1, device="cpu", planner="prior-mean", precision="fp32"))
    agent = Agent(cfg, ModelDims.from_config(cfg, (5,), 2, False), 100, torch.device("cpu"))
    obs = torch.randn(3, 5)
    with torch.no_grad():
        expected = agent.model.pi(agent.model.encode(obs)).mean
    assert torch.allclose(agent.act(obs), expected, atol=1e-6)
    assert isinstance(agent.planner(3), PriorMean)
    with pytest.raises(ConfigError, match="'planner' = 'nope': not a planner: one of mppi, prior-mean"):
        make.make_planner("nope", agent.plan_model, agent.planner_cfg, 3, 2, 0.99, torch.device("cpu"))


@pytest.mark.parametrize("flags", [[], ["--dry-run"], ["--no-mpc"]])
def test_an_unknown_planner_stops_the_run_before_it_trains(tmp_path, monkeypatch, capsys, flags):
    """The config layer does not see the planners' registry: the setup pipeline asks it first, before anything is
    built or written: one line, exit code 2, with --dry-run too, and for a run that would never plan."""
    from helpers import tiny_json
    from tdmpc.cli.train import main

    monkeypatch.chdir(tmp_path)
    code = main(["--cfg", str(tiny_json(tmp_path)), "--device", "cpu", "--planner", "nope", "--run-dir",
                 str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "error: config field 'planner' = 'nope': not a planner: one of mppi", err
    assert not (tmp_path / "run").exists()
