"""One update and one plan compute what the reference TD-MPC2 computes, from a fixture the reference itself wrote
(../shared/fixtures/reference-update-ms1: its weights, batch, three _update and four _plan calls with every draw)."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tdmpc.agent import Agent
from tdmpc.learner import Learner
from tdmpc.cli.parity import main
from tdmpc.report import parity

FIXTURE = Path(os.environ.get("TDMPC_FIXTURES", Path(__file__).parents[2] / "shared" / "fixtures")) / \
    "reference-update-ms1"

if not FIXTURE.is_dir():
    if os.environ.get("CI"):  # CI has ../shared beside the checkout: a missing fixture is a failure there
        raise FileNotFoundError(f"{FIXTURE}: the reference's update fixture is missing")
    pytest.skip(f"{FIXTURE} is not here (../shared/fixtures, or set TDMPC_FIXTURES)", allow_module_level=True)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the fixture was written
    yield
    torch.set_num_threads(threads)


def _summary(report: parity.Report) -> str:
    return "\n".join(c.line() for c in report.failed()[:10])


def test_three_updates_match_the_reference():
    """Losses, grad norms, entropies and the running scale of each call; every weight and target Q after the three
    calls; Adam's steps and moments. The start makes the scale leave 1 and both optimisers clip in every call."""
    report = parity.check_update(parity.read_fixture(FIXTURE))
    assert report.ok, _summary(report)
    names = {c.name for c in report.checks}
    assert {"update 3: pi_scale", "update 1: grad_norm", "update 2: pi_grad_norm", "weights: _target_Qs.0.weight",
            "adam _pi.0.weight: exp_avg_sq", "adam _encoder.0.weight: step"} <= names
    assert sum(n.startswith("weights: ") for n in names) == len(parity.build_agent(parity.read_fixture(FIXTURE))[1])
    assert not report.notes  # every recorded draw was asked for


def test_four_plans_match_the_reference():
    """Fresh and warm-started, train and eval mode: the action, the mean kept for the warm start, the final std,
    the prior's rollout actions, the last iteration's values and its elite set, in fp32 planning."""
    report = parity.check_plan(parity.read_fixture(FIXTURE))
    assert report.ok, _summary(report)
    assert sum(c.name.endswith(": action") for c in report.checks) == 4


def test_a_scale_that_does_not_move_fails(monkeypatch):
    monkeypatch.setattr(Learner, "_update_scale", lambda self, q, task: None)
    report = parity.check_update(parity.read_fixture(FIXTURE))
    failed = {c.name for c in report.failed()}
    assert {"update 1: pi_scale", "update 1: pi_loss", "update 3: scale after"} <= failed


@pytest.mark.parametrize("norm", [10.0, 40.0])
def test_clipping_at_the_wrong_norm_fails(norm):
    """The clip folded into fused Adam's grad_scale. At half the reference's norm every call still clips, by half
    the factor: Adam's steps do not see a constant factor, but its moments do (exp_avg halves). At twice it, call 3's
    gradients (30.3 and 33.8) are not clipped while calls 1 and 2's are: the weights move differently too."""
    report = parity.check_update(parity.read_fixture(FIXTURE, grad_clip_norm=norm))
    failed = {c.name for c in report.failed()}
    assert {"adam _dynamics.0.weight: exp_avg", "adam _pi.0.weight: exp_avg_sq"} <= failed
    if norm == 40.0:
        assert {"weights: _pi.0.weight", "weights: _encoder.0.weight"} <= failed


def test_a_plan_that_draws_its_noise_elsewhere_fails(monkeypatch):
    """The replayed draws decide the plan: shifting the sampled candidates' noise by one iteration changes it."""
    from tdmpc.planners.mppi import GaussianMPPI
    from tdmpc.report.parity import plan

    original = plan.plan_draws

    def shifted(draws, agent, eval_mode):
        out = original(draws, agent, eval_mode)
        c, A = agent.planner_cfg, agent.dims.action_dim
        views = GaussianMPPI.draw_views(out["plan.normal"][0], c, 1, A)
        views["noise"].copy_(views["noise"].roll(1, 0))
        return out

    monkeypatch.setattr(plan, "plan_draws", shifted)
    report = parity.check_plan(parity.read_fixture(FIXTURE))
    assert "plan t0: action" in {c.name for c in report.failed()}


def test_bf16_planning_is_reported_not_held():
    lines = parity.bf16_distance(parity.read_fixture(FIXTURE))
    assert len(lines) == 4 and all("final elites shared, action max abs error" in ln for ln in lines)


def test_command_exit_codes(tmp_path, capsys):
    assert main([str(FIXTURE), "--failures-only"]) == 0
    out = capsys.readouterr().out
    assert "272 of 272 quantities inside their tolerance: agrees with the reference" in out
    assert "deviation 'policy loss masked after a terminal step': not exercised here" in out

    assert main([str(tmp_path)]) == 2  # not a fixture
    assert "not an update/plan fixture: missing meta.json" in capsys.readouterr().err

    # A fixture whose result after the updates was moved: the command says which quantities, exit 1.
    bad = tmp_path / "moved"
    shutil.copytree(FIXTURE, bad)
    (bad / "checkpoint_after.pt").chmod(0o644)
    after = torch.load(bad / "checkpoint_after.pt", weights_only=True)
    after["model"]["_pi.0.weight"] = after["model"]["_pi.0.weight"] + 1e-3
    torch.save(after, bad / "checkpoint_after.pt")
    assert main([str(bad), "--failures-only"]) == 1
    out = capsys.readouterr().out
    assert "FAIL weights: _pi.0.weight" in out and "271 of 272" in out


@pytest.mark.parametrize("name,damage,needle", [
    ("batch.pt", lambda f: f.write_bytes(f.read_bytes()[:1000]), "batch.pt: not a readable fixture file"),
    ("plan_io.pt", lambda f: f.write_text("version https://git-lfs.github.com/spec/v1\n"),
     "plan_io.pt: not a readable fixture file"),
    ("update_io.pt", lambda f: torch.save({}, f), "update_io.pt: not a fixture's recorded calls"),
    ("meta.json", lambda f: f.write_text(f.read_text().replace('"episode_length"', '"episode_len"')),
     "meta.json: not a fixture's meta.json (KeyError: 'episode_length')")])
def test_a_damaged_fixture_file_is_one_line_naming_it(tmp_path, capsys, name, damage, needle):
    """A copy cut short, a git-LFS pointer, a file without its calls, a meta.json without a field: tracebacks
    (exit 1) where the command promises one line and exit 2."""
    bad = tmp_path / "bad"
    shutil.copytree(FIXTURE, bad)
    (bad / name).chmod(0o644)
    damage(bad / name)
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err


def test_a_compact_fixture_is_compared_by_its_sums(tmp_path):
    """A compact fixture (larger models) keeps per parameter Adam's step and, for each moment, its float64 sum,
    abs-sum, L2 norm and max-abs instead of the tensors, and no large intermediates."""
    compact = tmp_path / "compact"
    shutil.copytree(FIXTURE, compact)
    meta = json.loads((compact / "meta.json").read_text())
    meta["args"]["compact"] = True
    (compact / "meta.json").chmod(0o644)
    (compact / "meta.json").write_text(json.dumps(meta))
    full = torch.load(FIXTURE / "optim_after.pt", weights_only=True)
    summary = {"format": "summary", "scale": full["scale"]}
    for key in ("optim", "pi_optim"):
        names = [n for group in full[f"{key}_param_names"] for n in group]
        state = {names[i]: {"step": st["step"], **{m: {"sum": float(st[m].double().sum()),
                                                       "abs_sum": float(st[m].double().abs().sum()),
                                                       "l2": float(st[m].double().norm()),
                                                       "max_abs": float(st[m].double().abs().max()),
                                                       "sha256": "0" * 64}
                                                   for m in ("exp_avg", "exp_avg_sq")}}
                 for i, st in full[key]["state"].items()}
        summary[key] = {"param_names": full[f"{key}_param_names"], "state": state}
    (compact / "optim_after.pt").chmod(0o644)
    torch.save(summary, compact / "optim_after.pt")
    io = torch.load(FIXTURE / "update_io.pt", weights_only=True)
    for call in io["calls"]:
        for name in ("next_z", "zs", "q_logits", "reward_logits"):
            del call["intermediates"][name]
    (compact / "update_io.pt").chmod(0o644)
    torch.save(io, compact / "update_io.pt")

    report = parity.check_update(parity.read_fixture(compact))
    assert report.ok, _summary(report)
    assert "adam _Qs.0.weight: exp_avg_sq l2" in {c.name for c in report.checks}


def test_the_deviations_page_lists_every_deviation_the_command_knows():
    page = (Path(__file__).parents[1] / "docs" / "deviations.md").read_text()
    for dev in parity.DEVIATIONS:
        assert dev.name in page, dev.name


def test_turning_the_policy_mask_off_gives_the_references_unmasked_loss():
    """The one deviation an update on the reference's own batches shows (episodic tasks, a terminal at the last
    step): `mask_policy_after_terminal` False weights every latent as the reference does."""
    from tdmpc.buffer import Batch
    from tdmpc.config import Config
    from tdmpc.model.world_model import ModelDims

    losses = {}
    for mask in (True, False):
        cfg = Config(model_size=1, batch_size=8, horizon=3, mask_policy_after_terminal=mask, device="cpu")
        agent = Agent(cfg, ModelDims.from_config(cfg, (5,), 2, True), 100, torch.device("cpu"))
        g = torch.Generator().manual_seed(0)
        terminated = torch.zeros(3, 8, dtype=torch.bool)
        terminated[-1, :4] = True  # where the reference's buffer puts terminations: at the last step
        batch = Batch(torch.randn(4, 8, 5, generator=g), torch.rand(3, 8, 2, generator=g) * 2 - 1,
                      torch.randn(3, 8, generator=g), terminated)
        _, _, zs, reached = agent.learner._model_loss_eager(batch.obs, batch.action, batch.reward, batch.terminated,
                                                            None)
        assert reached[-1, :4].eq(0).all() and reached[:-1].eq(1).all() and reached[-1, 4:].eq(1).all()
        zs = zs.detach()
        for given, key in ((reached, mask), (None, (mask, "none"))):
            torch.manual_seed(2)  # the same policy noise and Q heads
            agent.scale.fill_(1.0)
            losses[key] = agent.learner._pi_loss(zs, None, given)[0]
    assert torch.equal(losses[False], losses[(False, "none")])  # off: as if nothing were masked
    assert not torch.allclose(losses[True], losses[(True, "none")])


@pytest.mark.compile
def test_compiled_update_and_plan_match_the_reference():
    fx = parity.read_fixture(FIXTURE, compile=True)
    report = parity.check_update(fx)
    assert report.ok, _summary(report)
    report = parity.check_plan(fx)
    assert report.ok, _summary(report)


def test_a_multitask_fixture_builds_the_agent_its_meta_and_checkpoint_describe(tmp_path):
    """Multi-task fixtures (a later one) take their task set, task dim and episode lengths from meta.json, as
    loading the reference's mt30 checkpoint does; here with the mt30 forward fixture's checkpoint."""
    mt30 = Path(__file__).parent / "fixtures" / "reference-mt30-ms1"
    ref = json.loads((mt30 / "reference_meta.json").read_text())
    cfg = {k: ref[k] for k in ("num_bins", "vmin", "vmax", "simnorm_dim", "dropout", "log_std_min", "log_std_max",
                               "num_q", "discount_denom", "discount_min", "discount_max")}
    cfg.update(multitask=True, tasks=ref["tasks"], episode_lengths=ref["episode_lengths"], task_dim=ref["task_dim"],
               model_size=1, batch_size=16, horizon=3, episodic=False)
    fixture = tmp_path / "mt30"
    fixture.mkdir()
    (fixture / "meta.json").write_text(json.dumps({"cfg": cfg, "fixture": {"episodic": False}, "args": {}}))
    shutil.copy(mt30 / "reference_checkpoint.pt", fixture / "checkpoint_before.pt")
    for name in parity.FILES[2:]:
        (fixture / name).touch()
    agent, _ = parity.build_agent(parity.read_fixture(fixture))
    assert agent.dims.tasks == tuple(ref["tasks"]) and agent.dims.task_dim == 96
    assert torch.allclose(agent.discount, torch.tensor(ref["discounts"]))
