"""Reference TD-MPC2 checkpoints as input: the importer (every size inferred from shapes, the
older flat Q layout, tensordict metadata), evaluate and fine-tune from the command line, and a
one-line error with exit code 2 for every kind of bad input."""

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tdmpc.model.checkpoint import CheckpointError, load_file, load_reference, reference_to_ours
from tdmpc.config import MODEL_SIZES, Config
from tdmpc.model.checkpoint import read_checkpoint
from tdmpc.training.init_from import architecture_from_checkpoint
from tdmpc.model.world_model import ModelDims, WorldModel
from helpers import cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "reference-ms1"
REF = FIXTURE / "reference_checkpoint.pt"


def make_dims(obs_shape: tuple[int, ...], action_dim: int, episodic: bool = False, **fields) -> ModelDims:
    """ModelDims with the reference defaults (Config's) for every field not given."""
    return ModelDims.from_config(Config(model_size=1, **fields), obs_shape, action_dim, episodic)


REF_DIMS = make_dims((24,), 6, latent_dim=128, mlp_dim=384, enc_dim=256, num_enc_layers=2, num_q=2)
Q_NAMES = ("weight", "bias", "ln.weight", "ln.bias")  # the flat layout's n % 4


def ref_state() -> dict:
    return torch.load(REF, weights_only=True)["model"]


def save_model(sd: dict, path: Path) -> Path:
    torch.save({"model": sd}, path)
    return path


def to_reference_layout(model: WorldModel) -> dict:
    """Our model's state dict under the reference's names, as its save() writes it, with the
    `_detach_Qs_params` alias and the tensordict metadata entries."""
    enc = "_encoder.rgb." if model.dims.pixels else "_encoder.state."
    out = {}
    for key, value in model.state_dict().items():
        if key.startswith("_encoder."):
            key = enc + key[len("_encoder."):]
        elif key.startswith("_Qs."):
            out["_detach_Qs_params." + key[len("_Qs."):]] = value.clone()
            key = "_Qs.params." + key[len("_Qs."):]
        elif key.startswith("_target_Qs."):
            key = "_target_Qs_params." + key[len("_target_Qs."):]
        out[key] = value.clone()
    for prefix in ("_Qs.params.", "_detach_Qs_params.", "_target_Qs_params."):
        out[prefix + "__batch_size"] = torch.Size([model.dims.num_q])
        out[prefix + "__device"] = None
    return out


def to_prerelease_layout(sd: dict) -> dict:
    """The layout of the reference's first release (its issue #23): each MLP a Sequential of Linear,
    LayerNorm and activation modules, nested one level down except the state encoder, which is shifted by
    one; the Q ensemble flat, as in to_flat_q_layout."""
    out = {}
    for key, value in to_flat_q_layout(sd).items():
        m = re.fullmatch(r"(_encoder\.state|_dynamics|_reward|_termination|_pi)\.(\d+)\.(ln\.)?(weight|bias)", key)
        if m is None:
            out[key] = value
            continue
        module, layer, ln, name = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        index = 3 * layer + (1 if ln else 0)
        out[f"{module}.{index + 1}.{name}" if module == "_encoder.state" else f"{module}.0.{index}.{name}"] = value
    return out


def to_flat_q_layout(sd: dict) -> dict:
    """The older layout: `_Qs.params.{4 x layer + k}` and `_target_Qs.params.{n}`, no detach alias."""
    out = {}
    for key, value in sd.items():
        if key.startswith("_detach_Qs_params."):
            continue
        m = re.fullmatch(r"(_Qs\.params|_target_Qs_params)\.(\d+)\.(weight|bias|ln\.weight|ln\.bias)", key)
        if m:
            n = 4 * int(m.group(2)) + Q_NAMES.index(m.group(3))
            out[f"{'_Qs' if m.group(1) == '_Qs.params' else '_target_Qs'}.params.{n}"] = value
        else:
            out[key] = value
    return out


@torch.no_grad()
def outputs(m: WorldModel, obs: torch.Tensor, action: torch.Tensor, task: torch.Tensor | None = None) -> dict:
    z = m.encode(obs, task)
    eps = torch.randn(*z.shape[:-1], m.dims.action_dim, generator=torch.Generator().manual_seed(0))
    pi = m.pi(z, task, eps=eps)
    out = {"z": z, "z_next": m.next(z, action, task), "reward_logits": m.reward(z, action, task),
           "reward": m.decode(m.reward(z, action, task)), "pi_mean": pi.mean, "pi_log_std": pi.log_std,
           "pi_scaled_entropy": pi.scaled_entropy, "q_logits": m.Q(z, action, task),
           "q_target_logits": m.Q(z, action, task, target=True), "q_values": m.decode(m.Q(z, action, task))}
    if m.episodic:
        out["termination"] = m.termination(z)
    return out


def random_model(dims: ModelDims) -> WorldModel:
    """A model whose every tensor (zero-initialised heads and targets included) is non-trivial."""
    m = WorldModel(dims)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


# --- the importer -------------------------------------------------------------------------

SYNTHETIC = {
    "size5-episodic": make_dims((67,), 21, episodic=True, **MODEL_SIZES[5]),
    "size19-3-layer-encoder": make_dims((39,), 4, **MODEL_SIZES[19]),
    "odd-sizes": make_dims((5,), 1, episodic=True, enc_dim=40, mlp_dim=48, latent_dim=32, num_enc_layers=4,
                           num_q=3, num_bins=51, log_std_min=-5.0, log_std_max=1.0),
}


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_every_size_is_inferred_and_outputs_match(tmp_path, name):
    dims = SYNTHETIC[name]
    ours = random_model(dims)
    path = save_model(to_reference_layout(ours), tmp_path / "ref.pt")
    loaded = load_reference(path)
    d = loaded.dims
    assert (d.obs_shape, d.action_dim, d.latent_dim, d.mlp_dim, d.enc_dim, d.num_enc_layers, d.num_q, d.episodic,
            d.num_bins, d.log_std_min, d.log_std_max) == \
        (dims.obs_shape, dims.action_dim, dims.latent_dim, dims.mlp_dim, dims.enc_dim, dims.num_enc_layers,
         dims.num_q, dims.episodic, dims.num_bins, dims.log_std_min, dims.log_std_max)
    assert d == dims
    obs, action = torch.randn(8, dims.obs_shape[0]), torch.rand(8, dims.action_dim) * 2 - 1
    expected, got = outputs(ours, obs, action), outputs(loaded, obs, action)
    assert expected.keys() == got.keys() and ("termination" in got) == dims.episodic
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6, msg=key)


def test_pixel_encoder_is_inferred():
    dims = make_dims((9, 64, 64), 6, latent_dim=128, mlp_dim=64, num_channels=8, num_q=2)
    ours = random_model(dims)
    inferred, state = reference_to_ours(to_reference_layout(ours))
    assert inferred == dims
    loaded = WorldModel(inferred)
    loaded.load_state_dict(state)
    obs = torch.randint(0, 256, (4, 9, 64, 64), dtype=torch.uint8)
    with torch.no_grad():  # the same random shift for both (the encoder shifts in every mode, as the reference's)
        torch.manual_seed(0)
        z = loaded.eval().encode(obs)
        torch.manual_seed(0)
        torch.testing.assert_close(z, ours.encode(obs), rtol=0, atol=1e-6)


def test_older_flat_q_layout_matches_the_reference_outputs(tmp_path):
    flat = to_flat_q_layout(ref_state())
    assert "_Qs.params.8" in flat and "_target_Qs.params.9" in flat and "_Qs.params.0.weight" not in flat
    assert not any(k.startswith("_detach_Qs") for k in flat)
    m = load_reference(save_model(flat, tmp_path / "old.pt"))
    assert m.dims == REF_DIMS
    io = torch.load(FIXTURE / "reference_io.pt", weights_only=True)
    got = outputs(m, io["obs"], io["action"])
    for name in ("z", "z_next", "reward_logits", "reward", "pi_mean", "pi_log_std", "q_logits", "q_target_logits",
                 "q_values"):
        assert got[name].shape == io[name].shape, name
        err = (got[name] - io[name]).abs().max().item()
        assert err < 1e-5, f"{name}: max abs error {err}"


def test_earliest_files_without_targets_or_log_std_bounds_load():
    sd = {k: v for k, v in to_flat_q_layout(ref_state()).items()
          if not k.startswith("_target_Qs") and k not in ("log_std_min", "log_std_dif")}
    dims, state = reference_to_ours(sd)
    assert dims == REF_DIMS  # log_std bounds: the reference defaults, -10 and 2
    for key in [k for k in state if k.startswith("_Qs.")]:
        assert torch.equal(state[key.replace("_Qs.", "_target_Qs.", 1)], state[key])


@pytest.mark.parametrize("change,needle", [
    (lambda sd: sd.update({"_task_emb.weight": torch.zeros(30, 96), "_action_masks": torch.ones(30, 6)}),
     "not more than the latent size 128 and task dim 96"),  # an embedding the first layers have no room for
    (lambda sd: sd.update({"_dynamics.0.0.weight": torch.zeros(3, 3)}), "mixes the current layout"),
    (lambda sd: sd.pop("_dynamics.0.weight"), "missing '_dynamics.0.weight'"),
    (lambda sd: sd.update({"_pi.2.weight": torch.zeros(10, 384)}), "'_pi.2.weight' (10, 384) (expected (12, 384))"),
    (lambda sd: sd.update({"_Qs.params.1.ln.bias": torch.zeros(3, 384)}), "'_Qs.params.1.ln.bias' (3, 384)"),
])
def test_importer_rejects_with_one_line(change, needle):
    sd = ref_state()
    change(sd)
    with pytest.raises(CheckpointError) as e:
        reference_to_ours(sd, "ref.pt")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_load_file_errors_are_one_line(tmp_path):
    data = REF.read_bytes()
    legacy = tmp_path / "legacy.pt"
    torch.save({"model": ref_state()}, legacy, _use_new_zipfile_serialization=False)
    cases = {
        "empty": (b"", "the file is empty"),
        "text": (b"step,return\n1,2\n", "not a torch checkpoint (a text file"),
        "binary": (b"\x00\x01" + np.random.default_rng(0).bytes(4000), "not a torch checkpoint (unknown binary"),
        "truncated": (data[: len(data) // 2], "truncated or corrupt"),
        "cut-at-the-end": (data[:-100], "truncated or corrupt"),
        "legacy-truncated": (legacy.read_bytes()[:5000], "truncated or corrupt"),
        "garbage-pickle": (b"\x80\x02" + np.random.default_rng(1).bytes(4000), "not a torch checkpoint"),
    }
    for name, (content, needle) in cases.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(content)
        with pytest.raises(CheckpointError) as e:
            load_file(path)
        assert needle in str(e.value) and "\n" not in str(e.value), name
    assert load_reference(legacy).dims == REF_DIMS  # the pre-1.6 torch.save format still loads


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def unsafe_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "code-ran"
    path = tmp_path / "unsafe.pt"
    torch.save({"model": {**ref_state(), "payload": _RunsCode(marker)}}, path)
    return path, marker


def test_loading_never_runs_code(tmp_path):
    path, marker = unsafe_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="safe weights-only load refuses"):
        load_file(path)
    assert not marker.exists()


# --- --init-from takes the architecture ----------------------------------------------------

@pytest.mark.parametrize("given,cfg,expect", [
    (set(), Config(), dict(model_size=1, enc_dim=256, mlp_dim=384, latent_dim=128, num_q=2, episodic=False)),
    (set(), Config(model_size=5), dict(model_size=1, mlp_dim=384, num_q=2)),  # a --cfg file yields
    ({"mlp_dim"}, Config(mlp_dim=384), dict(model_size=1, mlp_dim=384, latent_dim=128, num_q=2)),  # as theirs
    ({"episodic"}, Config(episodic=True), dict(model_size=1, episodic=True)),
])
def test_architecture_comes_from_the_checkpoint_unless_given_as_a_flag(given, cfg, expect):
    new, note = architecture_from_checkpoint(cfg, str(REF), given)
    got = {**new.sizes(), "model_size": new.model_size, "episodic": new.episodic}
    assert {k: got[k] for k in expect} == expect
    assert note.startswith("init-from: architecture from the checkpoint") and "\n" not in note


@pytest.mark.parametrize("given,cfg,needle", [({"mlp_dim"}, Config(mlp_dim=512), "mlp_dim: checkpoint 384, config 512"),
                                              ({"model_size"}, Config(model_size=5), "latent_dim: checkpoint 128")])
def test_a_size_flag_that_contradicts_the_checkpoint_is_refused_before_anything_is_built(given, cfg, needle):
    with pytest.raises(CheckpointError, match="architecture differs") as e:
        architecture_from_checkpoint(cfg, str(REF), given)
    assert needle in str(e.value)


# --- the command line ---------------------------------------------------------------------

SMALL_PLAN = ["--num-samples", "32", "--num-elites", "4", "--num-pi-trajs", "2", "--iterations", "1"]


def evaluate_args(path, tmp_path, task="walker-walk"):
    # the policy prior acts (--no-mpc): even small plans cost tens of ms on a busy 2-core CPU, x 500 steps
    return ["--checkpoint", path, *(["--task", task] if task else []), "--episodes", 1, "--no-mpc",
            "--device", "cpu", "--report", tmp_path / "report.json"]


def train_args(path, tmp_path, task="walker-walk"):
    # DMC: 2 env steps per decision; 20 steps < 100 seed steps, so no update happens
    return ["--init-from", path, "--task", task, "--steps", 20, "--seed-steps", 100, "--eval-episodes", 0,
            *SMALL_PLAN, "--batch-size", 16, "--buffer-size", 10_000, "--no-save-buffer", "--no-tensorboard",
            "--no-progress", "--device", "cpu", "--run-dir", tmp_path / "run"]


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_evaluate_a_reference_checkpoint(capsys, tmp_path):
    r = cli(capsys, "tdmpc.evaluate", *evaluate_args(REF, tmp_path))
    assert r.returncode == 0, r.stderr
    assert "walker-walk (imported reference TD-MPC2 checkpoint): return" in r.stdout
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["imported_reference"] is True and rep["task"] == "walker-walk"
    assert rep["episodes"] == 1 and rep["lengths"] == [500]
    assert rep["dims"]["obs_shape"] == [24] and rep["dims"]["mlp_dim"] == 384


def test_evaluate_planning_overrides_reach_the_config(capsys, tmp_path):
    planning = [a for a in evaluate_args(REF, tmp_path) if a != "--no-mpc"]  # refused before any episode
    r = cli(capsys, "tdmpc.evaluate", *planning, "--num-samples", 32, "--num-pi-trajs", 2, "--num-elites", 40)
    assert_one_line_error(r, "'num_elites' = 40", "num_samples - num_pi_trajs (32 - 2 = 30)")


def test_evaluate_a_reference_checkpoint_needs_a_task(capsys, tmp_path):
    r = cli(capsys, "tdmpc.evaluate", *evaluate_args(REF, tmp_path, task=None))
    assert_one_line_error(r, "does not name its task", "--task")


def test_fine_tune_from_a_reference_checkpoint_saves_our_format(capsys, tmp_path):
    r = cli(capsys, "tdmpc.train", *train_args(REF, tmp_path))
    assert r.returncode == 0, r.stderr
    assert "init-from: architecture from the checkpoint (model size 1): enc_dim 256, mlp_dim 384, latent_dim 128, " \
           "num_enc_layers 2, num_q 2, episodic False" in r.stderr
    assert "initialised weights from an imported reference TD-MPC2 checkpoint" in r.stderr
    saved = load_file(tmp_path / "run" / "checkpoints" / "latest.pt")
    assert saved["format"] == "tdmpc" and saved["train"]["updates"] == 0
    assert ModelDims.from_dict(saved["dims"]) == REF_DIMS
    dims, expected = reference_to_ours(ref_state())
    assert saved["model"].keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(saved["model"][key], value), key
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["model_size"], config["mlp_dim"], config["num_q"], config["episodic"]) == (1, 384, 2, False)
    assert read_checkpoint(tmp_path / "run" / "checkpoints" / "latest.pt", {}).imported is False


def test_fine_tune_from_a_reference_checkpoint_of_another_task_asks_for_its_task(capsys, tmp_path):
    """Without --task the run's task is the config's (cpu.json's cartpole-swingup), which the user never named: the
    refusal says the file names no task and asks for it. With --task, the plain size mismatch."""
    args = train_args(REF, tmp_path)
    without_task = ["--cfg", "cpu.json", *args[:2], *args[4:]]
    r = cli(capsys, "tdmpc.train", *without_task, "--dry-run")
    assert_one_line_error(r, "task 'cartpole-swingup' has obs (5,)", "does not name its task: give the one it was "
                          "trained on, --task")
    r = cli(capsys, "tdmpc.train", *without_task, "--task", "cartpole-swingup", "--dry-run")
    assert_one_line_error(r, "task 'cartpole-swingup' has obs (5,)")
    assert "does not name its task" not in r.stderr and not (tmp_path / "run").exists()


def test_fine_tune_with_a_conflicting_size_flag_fails(capsys, tmp_path):
    r = cli(capsys, "tdmpc.train", *train_args(REF, tmp_path), "--mlp-dim", 512)
    assert_one_line_error(r, "architecture differs", "mlp_dim: checkpoint 384, config 512")
    assert not (tmp_path / "run").exists()


def _bad_checkpoint(kind: str, tmp_path: Path) -> tuple[Path, str, list[str]]:
    """A bad input: (checkpoint, task, words the error must contain)."""
    path = tmp_path / f"{kind}.pt"
    sd = ref_state()
    if kind == "text":
        path.write_text("this is a text file, not a checkpoint\n")
        return path, "walker-walk", ["not a torch checkpoint (a text file"]
    if kind == "random-bytes":
        path.write_bytes(b"\x07" + np.random.default_rng(0).bytes(5000))
        return path, "walker-walk", ["not a torch checkpoint"]
    if kind == "truncated":
        data = REF.read_bytes()
        path.write_bytes(data[: len(data) * 2 // 3])
        return path, "walker-walk", ["truncated or corrupt"]
    if kind == "missing-keys":
        del sd["_reward.1.weight"], sd["_pi.0.bias"]
        return save_model(sd, path), "walker-walk", ["missing keys ['_reward.1.weight', '_pi.0.bias'] (2 in all)"]
    if kind == "unexpected-keys":
        sd["_decoder.0.weight"], sd["_extra"] = torch.zeros(4, 4), torch.zeros(1)
        return save_model(sd, path), "walker-walk", ["unexpected keys ['_decoder.0.weight', '_extra'] (2 in all)"]
    if kind == "task-dims":  # obs 24 / action 6, cartpole has obs 5 / action 1
        return REF, "cartpole-swingup", ["model is for obs (24,) / continuous actions of dim 6",
                                         "'cartpole-swingup' has obs (5,) / continuous actions of dim 1"]
    if kind == "multi-task":  # a task embedding added to a single-task model: its first layers have no room
        sd["_task_emb.weight"], sd["_action_masks"] = torch.zeros(30, 96), torch.ones(30, 6)
        return save_model(sd, path), "walker-walk", ["not more than the latent size 128 and task dim 96"]
    if kind == "unsafe":
        return unsafe_checkpoint(tmp_path)[0], "walker-walk", ["safe weights-only load refuses"]
    raise ValueError(kind)


BAD = ["text", "random-bytes", "truncated", "missing-keys", "unexpected-keys", "task-dims", "multi-task", "unsafe"]


@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("command", ["evaluate", "train"])
def test_bad_checkpoint_is_one_line_and_exit_2(capsys, tmp_path, command, kind):
    path, task, needles = _bad_checkpoint(kind, tmp_path)
    if command == "evaluate":
        r = cli(capsys, "tdmpc.evaluate", *evaluate_args(path, tmp_path, task))
        assert not (tmp_path / "report.json").exists()
    else:
        r = cli(capsys, "tdmpc.train", *train_args(path, tmp_path, task))
        assert not (tmp_path / "run").exists()  # nothing written before the input is known good
    assert_one_line_error(r, *needles)
    assert not (tmp_path / "code-ran").exists()


def test_the_prerelease_nested_layout_loads_with_the_same_outputs(tmp_path):
    ours = random_model(make_dims((24,), 6, episodic=True, **MODEL_SIZES[1]))
    nested = to_prerelease_layout(to_reference_layout(ours))
    assert "_dynamics.0.0.weight" in nested and "_dynamics.0.3.weight" in nested and "_encoder.state.1.weight" in nested
    loaded = load_reference(save_model(nested, tmp_path / "old.pt"))
    assert loaded.dims == ours.dims
    obs, action = torch.randn(8, 24), torch.rand(8, 6) * 2 - 1
    expected, got = outputs(ours, obs, action), outputs(loaded, obs, action)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6, msg=key)


def test_an_mt80_model_of_size_5_is_imported_with_its_task_set(tmp_path):
    """mt80 at model size 5 (task dim 96, obs padded to 39, 6 action dims): every size and the task set
    inferred from the file, outputs equal on DMC and Meta-World tasks, and per-task masks in the policy."""
    from tdmpc.tasks.sets import TASK_SETS, reference_info

    tasks = TASK_SETS["mt80"]
    dims = ModelDims.from_config(Config(model_size=5), (39,), 6, False, tasks,
                                 tuple(reference_info(t).action_dim for t in tasks))
    assert dims.task_dim == 96
    ours = random_model(dims)
    loaded = load_reference(save_model(to_reference_layout(ours), tmp_path / "mt80-5.pt"))
    assert loaded.dims == dims and loaded.num_learnable_params == ours.num_learnable_params
    task = torch.tensor([0, 7, 26, 30, 55, 79])  # walker-stand (6 dims), pendulum (1), reacher-three (3), Meta-World (4)
    obs, action = torch.randn(6, 39), (torch.rand(6, 6) * 2 - 1) * loaded.action_mask(task)
    expected, got = outputs(ours, obs, action, task), outputs(loaded, obs, action, task)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-5, msg=key)
    active = torch.tensor([6, 1, 3, 4, 4, 4])
    assert torch.equal((got["pi_mean"] != 0).sum(-1), active)  # masked dims: mean exactly 0
    assert loaded.dims.tasks[30] == "mw-assembly" and loaded.dims.action_dims[30] == 4


def test_a_multitask_checkpoint_whose_task_set_does_not_fit_is_one_line(tmp_path):
    from tdmpc.tasks.sets import TASK_SETS

    m30 = load_reference(Path(__file__).parent / "fixtures" / "reference-mt30-ms1" / "reference_checkpoint.pt")
    sd = to_reference_layout(m30)
    with pytest.raises(CheckpointError, match="names 3 tasks"):
        reference_to_ours(sd, "mt30.pt", ("walker-walk", "cup-catch", "cheetah-run"))
    swapped = list(TASK_SETS["mt30"])
    swapped[0], swapped[4] = swapped[4], swapped[0]  # reacher-easy (2 dims) where walker-stand (6) was
    with pytest.raises(CheckpointError, match="acts on 6 dims in the model but 2 in its task set"):
        reference_to_ours(sd, "mt30.pt", tuple(swapped))
