import dataclasses
import json

import numpy as np
import pytest
import torch

from tdmpc.config import MODEL_SIZES, Config, ConfigError, from_dict, load_json, parse_cli, validate

from helpers import TINY  # noqa: E402


def test_defaults_are_the_reference_values():
    c = validate(Config())
    assert (c.horizon, c.iterations, c.num_samples, c.num_elites, c.num_pi_trajs) == (3, 6, 512, 64, 24)
    assert (c.min_std, c.max_std, c.temperature, c.rho, c.tau, c.lr, c.enc_lr_scale) == (0.05, 2, 0.5, 0.5, 0.01,
                                                                                      3e-4, 0.3)
    assert (c.consistency_coef, c.reward_coef, c.value_coef, c.termination_coef) == (20, 0.1, 0.1, 1)
    assert (c.num_bins, c.vmin, c.vmax, c.model_size, c.batch_size) == (101, -10, 10, 5, 256)


@pytest.mark.parametrize("size", sorted(MODEL_SIZES))
def test_model_size_presets(size):
    assert Config(model_size=size).sizes() == MODEL_SIZES[size]


def test_mt30_at_size_19_has_the_references_latent_of_512():
    """The reference's parser sets latent_dim 512 for mt30 at size 19 (its released checkpoint's size); other task
    sets and sizes keep the preset, and an explicit latent_dim wins."""
    assert Config(task="mt30", model_size=19).sizes() == {**MODEL_SIZES[19], "latent_dim": 512}
    assert Config(task="mt80", model_size=19).sizes() == MODEL_SIZES[19]
    assert Config(task="mt30", model_size=48).sizes() == MODEL_SIZES[48]
    assert Config(task="mt30", model_size=19, latent_dim=768).sizes()["latent_dim"] == 768


def test_explicit_dims_override_the_preset():
    assert Config(model_size=5, mlp_dim=1024).sizes()["mlp_dim"] == 1024


def test_precedence_defaults_json_cli(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"batch_size": 128, "horizon": 5, "task": "cup-catch"}))
    _, cfg, base, given = parse_cli(_Run, ["--cfg", str(path), "--batch-size", "512"], lambda run: load_json(run.cfg))
    assert base.batch_size == 128 and given == {"batch_size"}
    assert cfg.batch_size == 512  # CLI beats JSON
    assert cfg.horizon == 5 and cfg.task == "cup-catch"  # JSON beats defaults
    assert cfg.num_samples == 512  # defaults fill the rest


def test_cfg_name_finds_configs_dir():
    cfg = load_json("a4000.json")
    assert cfg.model_size == 5 and cfg.batch_size == 256 and cfg.buffer_size == 1_000_000
    assert load_json("a4000").to_dict() == cfg.to_dict()


def test_missing_config_file_lists_available():
    with pytest.raises(ConfigError, match="not found.*a4000.json"):
        load_json("nope.json")


def test_unknown_json_key_names_it_and_suggests():
    with pytest.raises(ConfigError, match=r"unknown config key 'batchsize'.*did you mean 'batch_size'"):
        from_dict({"batchsize": 3})


def test_wrong_json_type_is_an_error():
    with pytest.raises(ConfigError, match="'horizon'.*expected int"):
        from_dict({"horizon": "three"})
    for value in (2.5, float("inf"), True):
        with pytest.raises(ConfigError, match="'steps'.*expected int"):
            from_dict({"steps": value})
    steps = from_dict({"steps": 1e5}).steps  # a whole number in exponent form: JSON and Python read a float
    assert steps == 100_000 and isinstance(steps, int)


@pytest.mark.parametrize("overrides,field", [
    ({"num_elites": 500}, "num_elites"),  # > num_samples - num_pi_trajs
    ({"batch_size": 0}, "batch_size"),
    ({"mlp_dim": -4}, "mlp_dim"),
    ({"horizon": 0}, "horizon"),
    ({"plan_horizon": 0}, "plan_horizon"),
    ({"model_size": 7}, "model_size"),
    ({"rho": 1.5}, "rho"),
    ({"min_std": 3.0}, "min_std"),
    ({"device": "tpu"}, "device"),
    ({"num_q": 1}, "num_q"),
    ({"entropy_bonus": "sac"}, "entropy_bonus"),  # every field with a fixed set of values is checked
    ({"dataset_stream": "disk"}, "dataset_stream"),
    ({"updates_per_round": 0}, "updates_per_round"),  # a run that never updates learns nothing
    ({"obs": "rgb", "model_size": 1}, "num_channels"),  # the pixel encoder's 16 x 32 outputs are not a latent of 128
    ({"obs": "rgb", "model_size": 1, "task": "Pendulum-v1"}, "obs"),  # pixels are DMC's: said before their sizes
    ({"num_envs": 8, "seed_steps": 16}, "seed_steps"),  # 2 steps per env: no sub-trajectory of horizon 3 to sample
])
def test_validation_names_the_field_in_one_line(overrides, field):
    with pytest.raises(ConfigError) as e:
        validate(Config(**overrides))
    assert f"'{field}'" in str(e.value) and "\n" not in str(e.value)


from dataclasses import dataclass  # noqa: E402


@dataclass
class _Run:
    cfg: str | None = None


@pytest.mark.parametrize("argv,episodic,overlap", [
    (["--episodic"], True, None), (["--no-episodic"], False, None), (["--episodic", "False"], False, None),
    (["--overlap-updates", "--episodic", "None"], None, True), (["--no-overlap-updates"], None, False)])
def test_optional_bool_fields_take_the_flag_pair_and_the_value_form(argv, episodic, overlap):
    """tyro gives Optional[bool] fields only `--name {None,True,False}`; --name and --no-name work as for a bool."""
    _, cfg, _, found = parse_cli(_Run, argv, lambda run: Config())
    assert (cfg.episodic, cfg.overlap_updates) == (episodic, overlap)
    assert found == {name for name, v in (("episodic", "episodic"), ("overlap_updates", "overlap")) if v in " ".join(argv)}


def test_integer_flags_take_a_whole_number_in_exponent_form():
    """--steps 1e6, as papers and the reference's configs write step counts, was 'takes an integer, not 1e6'."""
    _, cfg, _, found = parse_cli(_Run, ["--steps", "1e5", "--eval-freq=2.5e3", "--buffer-size", "1E6", "--lr", "3e-4"],
                                 lambda run: Config())
    assert (cfg.steps, cfg.eval_freq, cfg.buffer_size, cfg.lr) == (100_000, 2_500, 1_000_000, 3e-4)
    assert {"steps", "eval_freq", "buffer_size", "lr"} <= found
    with pytest.raises(SystemExit):  # not a whole number: tyro's own refusal, one line
        parse_cli(_Run, ["--steps", "1.2345e2"], lambda run: Config())


def test_bench_takes_no_overlap_updates_the_compile_pair_and_update_stream():
    from tdmpc.bench.cli import BenchArgs
    from tdmpc.runtime.args import parse_args

    assert parse_args(BenchArgs, ["--no-overlap-updates"], "bench", "").overlap_updates is False
    assert parse_args(BenchArgs, [], "bench", "").overlap_updates is None
    assert [parse_args(BenchArgs, argv, "bench", "").compile for argv in ([], ["--compile"], ["--no-compile"])] == \
        [None, True, False]
    assert [parse_args(BenchArgs, argv, "bench", "").update_stream for argv in ([], ["--update-stream"])] == [False, True]


@pytest.mark.parametrize("argv,given,expected_cpu,expected_cuda", [
    ([], None, False, True), (["--compile"], True, True, True), (["--no-compile"], False, False, False)])
def test_compile_is_on_with_cuda_and_off_on_the_cpu_unless_given(argv, given, expected_cpu, expected_cuda):
    """Config.compile None: compiled with CUDA (1.53x end to end on an H200), eager on the CPU (measured slower
    there: docs/speed.md); --compile and --no-compile decide everywhere. The agent's actor and learner follow it."""
    from tdmpc.runtime.compile import Compiled, compile_enabled

    _, cfg, _, _ = parse_cli(_Run, argv, lambda run: Config())
    assert cfg.compile is given
    assert (compile_enabled(cfg.compile, torch.device("cpu")), compile_enabled(cfg.compile, torch.device("cuda"))) == \
        (expected_cpu, expected_cuda)
    from tdmpc.agent import Agent
    from tdmpc.model.world_model import ModelDims

    tiny = validate(Config(**{**TINY, "compile": cfg.compile}))
    agent = Agent(tiny, ModelDims.from_config(tiny, (3,), 1, False), episode_length=100, device=torch.device("cpu"))
    assert agent.actor.compile is expected_cpu and isinstance(agent.learner._pi_loss, Compiled) is expected_cpu


@pytest.mark.parametrize("argv,given", [
    ([], set()),
    (["--model-size", "1"], {"model_size"}),  # equal to the base's value: still given
    (["--no-mpc", "--episodic", "None", "--wandb-tags", "a", "b"], {"mpc", "episodic", "wandb_tags"}),
    (["--obs", "state", "--lr", "3e-4", "--task", "cup-catch"], {"obs", "lr", "task"}),
])
def test_the_fields_given_on_the_command_line_are_known_even_when_equal_to_the_base(argv, given):
    base = Config(model_size=1)
    _, cfg, _, found = parse_cli(_Run, argv, lambda run: base)
    assert found == given


@pytest.mark.parametrize("num_envs, tasks, updates", [(1, 1, 1), (4, 1, 4), (2, 3, 6), (64, 1, 64), (1024, 1, 64),
                                                      (256, 2, 128)])
def test_defaults_give_every_task_its_seed_episodes_and_every_env_step_one_update(num_envs, tasks, updates):
    """One update per env step up to 64 envs (the reference's ratio), 64 a round per task beyond."""
    from tdmpc.envs import EnvSpec

    spec = EnvSpec(task="t", obs_shape=(5,), action_dim=1, episode_length=500, action_repeat=2, episodic=False)
    cfg = Config(num_envs=num_envs).for_task(spec, tasks)
    assert cfg.seed_steps == max(5 * 500, 3 * num_envs) * 2 * tasks and cfg.updates_per_round == updates
    given = Config(num_envs=num_envs, seed_steps=100, updates_per_round=1).for_task(spec, tasks)
    assert (given.seed_steps, given.updates_per_round) == (100, 1)


@pytest.mark.parametrize("num_envs, tasks", [(4096, 1), (512, 3)])
def test_unset_seed_steps_are_enough_for_many_envs(num_envs, tasks):
    """The default seed steps give every env a sub-trajectory before the first update, as validate requires; a
    value the user sets is kept (and still checked). docs/gpu-simulators.md's 4,096-env dry run failed on them."""
    from tdmpc.envs import EnvSpec

    spec = EnvSpec(task="t", obs_shape=(3,), action_dim=1, episode_length=200, action_repeat=1, episodic=False)
    cfg = validate(Config(num_envs=num_envs, horizon=3).for_task(spec, tasks))
    assert cfg.seed_steps == num_envs * 3 * tasks
    with pytest.raises(ConfigError, match="seed_steps"):
        validate(Config(num_envs=num_envs, horizon=3, seed_steps=1000).for_task(spec, tasks))


@pytest.mark.parametrize("argv", [["--task-set", "finger-spin,cheetah-run"], ["--task-set", "finger-spin", "cheetah-run"]])
def test_a_task_set_is_a_task_list_however_it_is_spelled(argv):
    _, cfg, _, given = parse_cli(_Run, argv, lambda run: Config())
    assert cfg.task_set == ("finger-spin", "cheetah-run") and given == {"task_set"}
    assert len(Config(task_set=("mt30",)).task_set) == 30


# --- CUDA-only settings on a CPU run (tdmpc.train --dry-run, in-process) -------------------------------------------

def _dry_run(tmp_path, monkeypatch, capsys, *flags: str) -> tuple[int, str, str]:
    from helpers import tiny_json
    from tdmpc.cli.train import main

    monkeypatch.chdir(tmp_path)
    code = main(["--cfg", str(tiny_json(tmp_path)), "--device", "cpu", "--dry-run", *flags])
    out, err = capsys.readouterr()
    return code, out, err


def test_cuda_graphs_given_on_a_cpu_run_is_said_to_do_nothing(tmp_path, monkeypatch, capsys):
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys, "--cuda-graphs")
    assert code == 0 and "note: --cuda-graphs does nothing on the CPU" in err, err
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys)  # the default (on) is not the user's: nothing said
    assert code == 0 and "cuda-graphs" not in err, err


def test_update_stream_where_it_does_nothing_is_said(tmp_path, monkeypatch, capsys):
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys, "--update-stream")
    assert code == 0 and "note: --update-stream does nothing on the CPU" in err, err
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys)
    assert code == 0 and "update-stream" not in err, err
    from tdmpc.training.notes import cuda_only_notes
    cfg = dataclasses.replace(validate(Config()), update_stream=True, overlap_updates=False)
    notes = cuda_only_notes(cfg, torch.device("cuda"), frozenset({"update_stream"}))
    assert len(notes) == 1 and "without --overlap-updates" in notes[0]
    assert not cuda_only_notes(dataclasses.replace(cfg, overlap_updates=True), torch.device("cuda"),
                               frozenset({"update_stream"}))


def test_gpu_mem_on_a_cpu_run_says_what_is_true_there(tmp_path, monkeypatch, capsys):
    """The verdict plans for the card, and says this run is not on it (it said "replay buffer on the device")."""
    code, out, _ = _dry_run(tmp_path, monkeypatch, capsys, "--gpu-mem", "8GB")
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert code == 0 and verdict.startswith("verdict: FITS a card of 8GB")
    assert "for a run on one (this run is on the CPU: all of it is host memory, and --gpu-mem caps nothing)" in verdict


@pytest.mark.parametrize("size", ["0GB", "0", "0.0GiB"])
def test_a_gpu_mem_of_zero_must_be_more_than_0(tmp_path, monkeypatch, capsys, size):
    code, _, err = _dry_run(tmp_path, monkeypatch, capsys, "--gpu-mem", size)
    assert code == 2 and err.strip() == (f"error: --gpu-mem {size}: must be more than 0 (the memory of the card to "
                                         f"plan for: 16GB, 16000MB or 8GiB)"), err


def test_a_failed_compile_names_where_it_raised():
    """The fallback line ends with where the failure was raised: the innermost frame (for a compiled graph that
    failed as it ran, inductor's generated code) or the user code dynamo names for a trace it gave up on."""
    from tdmpc.runtime.compile import raised_at

    def inner():
        raise ValueError("wrong number of dimensions1")

    try:
        inner()
    except ValueError as e:
        assert raised_at(e) == f" at test_config.py:{inner.__code__.co_firstlineno + 1}: " \
                               'raise ValueError("wrong number of dimensions1")'
    told = RuntimeError(f'Unsupported\nfrom user code:\n   File "{__file__}", line {inner.__code__.co_firstlineno}, '
                        "in test")
    assert raised_at(told) == f" at test_config.py:{inner.__code__.co_firstlineno}: def inner():"
    assert raised_at(RuntimeError("no traceback")) == ""


def test_a_compiled_function_never_gets_inputs_that_share_storage():
    """act() sends observations and first-step flags to the device in one copy, as two views of it. Torch 2.11's
    inductor cache ran a graph compiled for separate inputs on such a pair and failed ("wrong number of
    dimensions"; reproduced on the CPU: docs/speed.md), so a compiled function gets a copy of each tensor that
    shares storage with an earlier one; its eager fallback, which has no cache, gets them as they are."""
    from tdmpc.runtime.compile import Compiled
    from tdmpc.runtime.transfer import to_device
    from tdmpc.runtime.device import cuda_code_path

    with cuda_code_path():  # CUDA's staging copy, on the CPU
        obs, first = to_device(torch.device("cpu"), np.ones((2, 3), np.float32), np.array([1, 0], bool))
    assert obs.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    seen: list[tuple] = []
    compiled = Compiled(lambda *a: seen.append(a), "f")
    compiled.fn = lambda *a: seen.append(a)  # stands in for torch.compile's function
    for _ in range(2):  # the compiling call and the ones after it
        compiled(obs, first, True, obs[:1])
        got = seen.pop()
        ptrs = [t.untyped_storage().data_ptr() for t in got if isinstance(t, torch.Tensor)]
        assert len(set(ptrs)) == 3 and got[0] is obs and got[2] is True
        assert all(torch.equal(a, b) for a, b in zip(got, (obs, first, True, obs[:1])) if isinstance(a, torch.Tensor))
    compiled.fn = compiled.eager
    compiled(obs, first)
    assert seen.pop()[1] is first


def test_a_pixel_latent_dim_is_checked_by_the_pixel_rule_before_simnorm_s():
    """latent_dim 100 with rgb once blamed simnorm_dim (8 does not divide 100), which a user had not set; pixels need
    a multiple of 16, which the pixel rule says. A state model's latent_dim is still held to simnorm_dim."""
    with pytest.raises(ConfigError, match=r"'num_channels'.*latent_dim is 100: use a latent_dim that is a multiple "
                                          r"of 16"):
        validate(Config(task="cartpole-swingup", obs="rgb", latent_dim=100))
    with pytest.raises(ConfigError, match=r"'simnorm_dim' = 8: must divide latent_dim \(100\)"):
        validate(Config(task="cartpole-swingup", latent_dim=100))
