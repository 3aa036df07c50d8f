"""scripts/: each tool runs on a tiny discrete run (CartPole-v1, 200 env steps: its checkpoint and replay buffer
file), and the scripts here and the one-off diagnostics kept beside their results (results/) use the public API
only: no private attribute, no private name imported, no source patching."""

from __future__ import annotations

import ast
import csv
import json
import importlib.util
import os
import subprocess
import sys
import re
import shlex
import tarfile
from pathlib import Path
from types import ModuleType

import h5py
import numpy as np
import pytest

import tdmpc

from helpers import TINY

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
# The documents that name scripts by path and must name files that exist (RESULTS.md, BENCHMARKS.md, README.md and
# docs/results/ can join this list once they name the moved scripts' new paths).
DOCUMENTS = [SCRIPTS / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "results").glob("*.md")),
             *sorted((ROOT / "results").rglob("*.md")), *sorted((ROOT / "results").rglob("*.log"))]


def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (its main(argv) runs it)."""
    if str(SCRIPTS) not in sys.path:  # as `python scripts/<name>.py` has it: the scripts import their shared module
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory) -> tuple[str, str]:
    """A tiny discrete run's checkpoint and buffer file: 100 seed steps, then 100 of planning with updates."""
    run = tmp_path_factory.mktemp("scripts") / "run"
    run_dir, _ = tdmpc.fit(env="CartPole-v1", run_dir=run,
                           **{**TINY, "task": "CartPole-v1", "seed_steps": 100, "steps": 200, "eval_freq": 200,
                              "eval_episodes": 1, "save_every": 200, "log_every": 200})
    ckpt = run_dir / "checkpoints"
    return str(ckpt / "latest.pt"), str(next(ckpt.glob("buffer_*.h5")))


def test_planner_diagnosis_plays_every_policy_and_its_prior_is_the_acting_paths(cartpole, capsys):
    ck, _ = cartpole
    policies = ["prior", "prior-act", "q", "lookahead", "lookahead1-noterm", "lookahead2-blend", "mppi",
                "mppi:plan_horizon=1"]
    script("planner_diagnosis").main(["CartPole-v1", ck, "2", f"--policies={','.join(policies)}"])
    out = capsys.readouterr().out
    assert "horizon 3, 2 actions" in out and "2 episodes (seeds 0-1)" in out, out
    rows = {line.split()[0]: line.split("returns ")[1] for line in out.splitlines() if " return " in line}
    assert list(rows) == policies, out
    # The prior's most probable action, read off WorldModel.pi, is what the acting path plays with mpc=False (fp32).
    assert rows["prior"] == rows["prior-act"], out
    script("planner_diagnosis").main(["CartPole-v1", ck, "1", "--decode-mean", "--policies=q,lookahead1"])
    out = capsys.readouterr().out
    assert re.search(r"^q +return", out, re.M) and re.search(r"^lookahead1 +return", out, re.M), out


def test_planner_diagnosis_values_decoded_as_the_mean_agree_with_action_values_decoded_so(cartpole):
    import torch

    d = script("planner_diagnosis").Diagnosis(cartpole[0], "all")
    z = torch.randn(5, d.m.latent_dim).softmax(-1)
    with torch.no_grad():
        logits_every = torch.stack([d.m.Q(z, torch.eye(2)[[k]].expand(5, 2), None, d.heads) for k in range(2)], -2)
        expected = d.mean_decode(logits_every).squeeze(-1).mean(0)
        torch.testing.assert_close(d.values(z), expected)
        d.decode_mean = None
        torch.testing.assert_close(d.values(z), d.m.action_values(z, None, d.heads).mean(0))


def test_prior_diagnosis(cartpole, capsys):
    script("prior_diagnosis").main(["CartPole-v1", cartpole[0], "--steps", "30"])
    out = capsys.readouterr().out
    states = int(re.search(r": (\d+) states", out).group(1))
    assert 1 <= states <= 30, out
    probs = [float(p) for p in re.search(r"mean probabilities \[([^\]]+)\]", out).group(1).split()]
    assert len(probs) == 2 and abs(sum(probs) - 1) < 1e-3, out
    planner = [int(c) for c in re.search(r"planner's actions +\[([^\]]+)\]", out).group(1).split()]
    assert sum(planner) == states, out


def transitions(buffer_file: str, lo: int, hi: int) -> int:
    """The rows of [lo, hi) that are a transition (not the first of an episode; the run's buffer has not wrapped)."""
    with h5py.File(buffer_file, "r") as f:
        first = f["first"][0]
    return int((~first[max(lo, 1):hi]).sum())


def test_one_step_check(cartpole, capsys):
    ck, buf = cartpole
    script("one_step_check").main([ck, buf, "0", "150"])
    out = capsys.readouterr().out
    assert f"{transitions(buf, 0, 150)} transitions of rows 0-149" in out, out
    assert "pred with action 0" in out and "pred with action 1" in out and "pred with action 2" not in out, out
    stored = [int(c) for c in re.search(r"actions stored: \[([^\]]+)\]", out).group(1).split()]
    assert sum(stored) == transitions(buf, 0, 150), out
    assert "argmax agreement Q vs 1-step" in out and "consistency |next(z,a)-enc(s')|^2 mean" in out, out
    mae = float(re.search(r"corr\(pred with stored action, reward\) \S+ MAE (\S+)", out).group(1))
    assert np.isfinite(mae), out  # the correlation is nan: CartPole's rewards are constant


def test_reward_decode_calibration(cartpole, capsys):
    ck, buf = cartpole
    script("reward_decode_calibration").main([ck, buf, "1", "10000"])
    out = capsys.readouterr().out
    rows = int(re.match(r"(\d+) rows: mean reward 1.000", out).group(1))  # CartPole: +1 a step
    assert rows == transitions(buf, 1, 10000), out
    per_action = [int(n) for n in re.findall(r"action \d: (\d+) rows", out)]
    assert len(per_action) == 2 and sum(per_action) == rows, out


def test_reward_decode_calibration_reruns_its_logged_figures_on_the_committed_checkpoint_and_buffer(capsys):
    """The LunarLander checkpoint and buffer file kept in results/discrete/checkpoints/ give the figures that
    results/discrete/planner_diagnosis.log shows for ll42k.pt (that checkpoint) and buffer_0000050000.h5."""
    kept = ROOT / "results" / "discrete" / "checkpoints"
    log = (ROOT / "results" / "discrete" / "planner_diagnosis.log").read_text().splitlines()
    at = log.index("$ python scripts/reward_decode_calibration.py ll42k.pt buffer_0000050000.h5 30000 42000")
    script("reward_decode_calibration").main([str(kept / "LunarLander-v3-seed1-42501.pt"),
                                              str(kept / "LunarLander-v3-seed1-buffer-50000.h5"), "30000", "42000"])
    assert capsys.readouterr().out.splitlines() == log[at + 1:at + 7]


def test_reward_noise_fit(cartpole, capsys):
    script("reward_noise_fit").main([cartpole[1], "--steps", "4", "--held-out", "50", "--every", "2"])
    out = capsys.readouterr().out
    assert "50 held out; inputs: 4 observation dims and 2 actions" in out, out
    maes = [float(m) for m in re.findall(r"^\d+ test MAE (\S+)", out, re.M)]
    assert len(maes) == 3 and all(np.isfinite(maes)), out  # steps 0, 2 and 4


def test_cartpole_test_seeds(capsys):
    script("cartpole_test_seeds").main(["100", "0", "1", "--seeds", "1", "--eval-freq", "100", "--eval-episodes", "1"])
    out = capsys.readouterr().out
    found = re.search(r"^seed 1 uniform_prior_coef 0 plan_horizon 1: \[([^\]]+)\]$", out, re.M)
    assert found and len(found.group(1).split(",")) == 2, out  # evaluations at 0 and 100


SHARED = {"buffer_rows"}  # modules the scripts import, run through them


def test_every_script_has_a_readme_line_and_a_test():
    names = sorted(p.stem for p in SCRIPTS.glob("*.py"))
    assert names, "no scripts"
    readme, tests = (SCRIPTS / "README.md").read_text(), Path(__file__).read_text()
    for name in names:
        assert f"`{name}.py`" in readme, f"scripts/README.md does not list {name}.py"
        if name not in SHARED:
            assert f'script("{name}")' in tests, f"tests/test_scripts.py does not run scripts/{name}.py"


# torch's CUDA memory snapshots, documented under these names (pytorch.org/docs/stable/torch_cuda_memory.html)
DOCUMENTED_PRIVATE = {"_record_memory_history", "_snapshot"}


def _private_uses(path: Path) -> list[str]:
    """Private attributes read or written (x._name, other than the file's own functions and methods, and torch's
    documented DOCUMENTED_PRIVATE), private names imported, and source patching (exec, eval, inspect.getsource), in
    one Python file."""
    tree = ast.parse(path.read_text(), str(path))
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    own |= DOCUMENTED_PRIVATE
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__")
                and node.attr not in own):  # a method the file defines itself is its own business
            found.append(f"{where}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            names = [*(node.module or "").split("."), *(a.name for a in node.names)]
            found += [f"{where}:{node.lineno}: imports {n}" for n in names
                      if n.startswith("_") and n != "__future__"]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("exec", "eval", "inspect.getsource"):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_the_check_finds_what_the_audit_found(tmp_path):
    """m._pi(z), a private name imported, and a method's source edited and executed (as episode_ends_soft.py did)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import inspect\nfrom tdmpc.model.world_model import _private\n"
                   "class Mine:\n    def _own(self):\n        return self._own\n"
                   "a = m._pi(z).argmax(-1)\nsrc = inspect.getsource(P._rollout)\nexec(src)\n")
    found = sorted(f.split(": ", 1)[1] for f in _private_uses(bad))
    assert found == ["._pi", "._rollout", "exec()", "imports _private", "inspect.getsource()"], found


def test_scripts_and_the_diagnostics_beside_results_use_the_public_api_only():
    files = [*sorted(SCRIPTS.glob("*.py")), *sorted((ROOT / "results").rglob("*.py"))]
    assert len(files) >= 6
    problems = [p for f in files for p in _private_uses(f)]
    assert not problems, "\n".join(problems)


def test_the_documents_name_scripts_that_exist():
    """A path to a .py file under scripts/ or results/ in the documents names a file that is there."""
    missing = []
    for doc in DOCUMENTS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for path in re.findall(r"\b((?:scripts|results)/[\w./-]+\.py)\b", line):
                if not (ROOT / path).is_file():
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {path}")
    assert not missing, "\n".join(missing)


def test_gpu_speed_json_takes_the_issues_keys_from_a_leases_stage_files(tmp_path):
    """results/gpu/speed_json.py: results/gpu-speed.json's keys from device_run.sh's stage JSONs, null with a
    reason for what a stage did not measure; the ratio only where both rates exist."""
    spec = importlib.util.spec_from_file_location("speed_json", ROOT / "results" / "gpu" / "speed_json.py")
    assert spec is not None and spec.loader is not None
    speed_json = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed_json)
    model = {"model_size": 5, "plan": {"1": {"ms": 1.0}}, "update": {"fp32": {"ms": 1.5}, "bf16": {"ms": 1.2}},
             "gpu_kernels": {"plan_graphs_on": {"kernels": 250}, "update_graphs_on": {"kernels": 200}}}
    (tmp_path / "ours-compile.json").write_text(json.dumps({
        "machine": {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130"}, "models": [model],
        "end_to_end_by_envs": {"1": {"agent_steps_per_s": 300.0}, "32": {"agent_steps_per_s": 600.0}}}))
    (tmp_path / "reference.json").write_text(json.dumps({"steady_steps_per_s": 100.0, "act_ms_median_last_half": 3.0,
                                                         "update_ms_median_last_half": 10.0}))
    got = speed_json.speed(tmp_path)
    assert got["plan_ms_size5_1env"] == 1.0 and got["update_ms_size5"] == 1.5 and got["plan_kernels_gpu"] == 250
    assert got["e2e_agent_steps_per_s_32env"] == 600.0 and got["ratio_e2e_vs_reference"] == pytest.approx(3.0)
    assert got["seed_case_peak_gib_ours"] is None and set(got["missing"]) == {"seed_case_peak_gib_ours",
                                                                             "seed_case_peak_gib_reference"}
    (tmp_path / "reference.json").write_text(json.dumps({"stopped": "SIGTERM"}))
    (tmp_path / "ours-compile.log").write_text("compile: plan() for 1 env(s), train runs eagerly, its compile failed")
    got = speed_json.speed(tmp_path)
    assert got["ratio_e2e_vs_reference"] is None and "SIGTERM" in got["missing"]["reference_e2e_agent_steps_per_s"]
    assert "ran eagerly" in got["missing"]["compiled"]
    assert speed_json.main([str(tmp_path), "--out"]) == 2


def _script(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _lanes() -> ModuleType:
    return _script("results/gpu/lanes.py")


def test_the_peak_allocations_script_finds_what_is_live_at_the_peak_and_names_the_packages_frames():
    """results/gpu/learning/peak_allocations.py (a lease's diagnostic, CUDA only) on a made-up allocator trace: the
    peak is the largest total of live blocks, its blocks those allocated and not yet freed then, and a block is
    named by its innermost frames in the package."""
    m = _script("results/gpu/learning/peak_allocations.py")
    own = {"filename": "/x/tdmpc/buffer.py", "line": 85, "name": "__init__"}
    torch_frame = {"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"}
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": [torch_frame, own]},
             {"action": "alloc", "addr": 2, "size": 50, "frames": [torch_frame]},
             {"action": "free_requested", "addr": 2, "size": 50},
             {"action": "free_completed", "addr": 2, "size": 50},
             {"action": "alloc", "addr": 3, "size": 120, "frames": [own]},  # the peak: 1 and 3, 220 bytes
             {"action": "free_completed", "addr": 3, "size": 120},
             {"action": "alloc", "addr": 4, "size": 60, "frames": []}]
    peak, blocks = m.at_peak(trace)
    assert peak == 220 and sorted(b["addr"] for b in blocks) == [1, 3]
    assert m.where(trace[0]["frames"]) == "tdmpc/buffer.py:85 __init__"
    assert m.where([torch_frame]) == "nn/functional.py:1 linear" and m.where([]) == "?"


def test_the_lease_pruning_reads_a_lanes_rate_past_an_evaluation(tmp_path, capsys):
    """results/gpu/lanes.py on the rows the 2026-11-28 lease had when it stopped a lane that would have finished:
    cup-catch's row after its 50k evaluation took 13.1 s for 1,000 env steps (4.6 s without one). Over its last 60 s
    the rate says about 290 s to go, under the 308 s left, so no lane stops; with 200 s left the last lane does."""
    prune = _lanes()
    runs = ROOT / "results" / "gpu" / "learning" / "runs"
    cup, finger = ([r for r in csv.DictReader(open(runs / t / "seed1" / "train.csv")) if int(r["env_step"]) <= 51000]
                   for t in ("cup-catch", "finger-spin"))
    assert float(cup[-1]["elapsed"]) - float(cup[-2]["elapsed"]) > 2.5 * (float(cup[-2]["elapsed"]) - float(cup[-3]["elapsed"]))
    need = prune.seconds_needed([cup], 100000, 10000)
    assert 250 < need < 320, need  # the last two rows alone: 49,000 / (1,000 / 13.1 s) + 30 = 672 s
    lanes = [("702", [cup]), ("726", [finger])]
    assert prune.victim(lanes, 100000, 308, 10000)[0] is None
    assert prune.victim(lanes, 100000, 200, 10000)[0] == "726"
    assert prune.victim(lanes[:1], 100000, 200, 10000)[0] is None  # one lane left is never stopped
    assert prune.seconds_needed([cup[:1]], 100000, 10000) is None  # no rate yet: no decision
    # as learning_run.sh calls it: lanes.txt's "pid task:seed,..." lines, the runs' train.csv files
    for task, rows in (("cup-catch", cup), ("finger-spin", finger)):
        (tmp_path / task / "seed1").mkdir(parents=True)
        with open(tmp_path / task / "seed1" / "train.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (tmp_path / "lanes.txt").write_text("702 cup-catch:1\n726 finger-spin:1,cup-catch:2\n")
    prune.main(["prune", str(tmp_path / "lanes.txt"), str(tmp_path), "100000", "308", "702 726", "10000"])
    out, err = capsys.readouterr()
    assert out == "726\n" and "726: " in err  # the second lane's second run cannot finish too
    prune.main(["prune", str(tmp_path / "lanes.txt"), str(tmp_path), "100000", "308", "702", "10000"])
    assert capsys.readouterr().out == ""  # one lane alive: never stopped


def test_the_lease_takes_every_tasks_first_seed_before_extra_seeds_and_spreads_runs_over_lanes(tmp_path):
    """lanes.py: finished runs (evaluated at the last step, as a committed run under runs/) are skipped, a run
    evaluated short of it is not; pending runs come seed by seed in TASKS order, so pendulum-swingup's seed 1
    precedes cheetah-run's seed 2; lanes take them in turn; the probe's choice keeps the way that finishes the most
    runs."""
    lanes = _lanes()
    root = ROOT / "results" / "gpu" / "learning" / "runs"
    header, *_, last = (root / "cheetah-run" / "seed1" / "eval.csv").read_text().splitlines()
    row = last.split(",", 1)[1]
    for run, step in (("cheetah-run/seed1", 100000), ("cup-catch/seed1", 100000), ("pendulum-swingup/seed1", 50000)):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "eval.csv").write_text(f"{header}\n0,{row}\n{step},{row}\n")
    todo = lanes.pending(["cheetah-run", "pendulum-swingup", "cup-catch"], [1, 2, 3], tmp_path, 100000)
    assert todo == [("pendulum-swingup", 1), ("cheetah-run", 2), ("pendulum-swingup", 2), ("cup-catch", 2),
                    ("cheetah-run", 3), ("pendulum-swingup", 3), ("cup-catch", 3)]
    assert lanes.split(todo[:5], 3) == [[todo[0], todo[3]], [todo[1], todo[4]], [todo[2]]]
    assert lanes.split(todo[:2], 4) == [[todo[0]], [todo[1]]]
    # 50k agent steps in 740 s: alone at 190/s (263 + 90 s a run) two in turn; 4 at once at 107/s (467 + 90) four
    assert lanes.choose({(0, 1): 190.0, (1, 4): 107.0}, 7, 740, 50000) == (4, 1, 4)
    assert lanes.choose({(1, 4): 107.0}, 2, 740, 50000) == (2, 1, 2)  # no more lanes than runs
    assert lanes.choose({(1, 7): 20.0}, 7, 740, 50000) == (1, 1, 1)  # none finishes: one run still gives a curve


@pytest.mark.slow
@pytest.mark.parametrize("obs,task", [("state", "Pendulum-v1"), ("rgb", "finger-spin")])
def test_the_gpu_learning_script_runs_a_lane_on_the_cpu(tmp_path, obs, task):
    """results/gpu/learning_run.sh as a lease runs it, rehearsed on the CPU with a tiny config: the preflight, one
    lane through tdmpc.reproduce, the polling and the pack; from frames too (OBS=rgb: EGL here through Mesa). A
    change to the commands it calls fails here, not in a lent GPU's minutes (2026-11-27: a lease was lost to a
    path no CPU test took)."""
    cfg, out = tmp_path / "tiny.json", tmp_path / "out"
    cfg.write_text(json.dumps({**TINY, "num_channels": 1}))  # pixels: a latent of 16 x 1 = TINY's latent_dim
    out.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "STAGE": "start", "DEADLINE": "400", "DEADLINE_ALL": "400", "OUT": str(out), "DEVICE": "cpu",
           "CFG": str(cfg), "STEPS": "600", "TASKS": task, "SEEDS": "1", "PROBE": "none", "JOBS": "1", "OBS": obs,
           "TRAIN_FLAGS": "--no-progress", "WORK": str(tmp_path / "work"), "SITE": str(tmp_path / "no-bundle")}
    r = subprocess.run(["bash", str(ROOT / "results" / "gpu" / "learning_run.sh")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "done at" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    with tarfile.open(out / "learning.tar.gz") as packed:
        names = set(packed.getnames())
        assert {"out/preflight.log", "out/lanes.txt", f"runs/{task}/seed1/eval.csv"} <= names, sorted(names)
        evals = packed.extractfile(f"runs/{task}/seed1/eval.csv").read().decode().strip().splitlines()
        config = json.loads(packed.extractfile(f"runs/{task}/seed1/config.json").read())
    assert evals[-1].split(",")[0] == "600" and config["obs"] == obs, evals  # finished, from its observations


def test_every_bench_stage_of_the_gpu_speed_script_parses(tmp_path):
    """results/gpu/device_run.sh's bench stages, each command line as the device would run it (here with --device
    cpu): a flag renamed or a value refused is a failure here, not a stage lost in a lent GPU's minutes."""
    from tdmpc.bench.cli import BenchArgs, check_args
    from tdmpc.runtime.args import parse_args

    text = (ROOT / "results" / "gpu" / "device_run.sh").read_text()
    bench = re.search(r'^B="python3 -m tdmpc\.bench (.*)"$', text, re.M)
    assert bench is not None
    stages = re.findall(r"^(?:\w+=\S+ )*stage (\S+) \S+ \$B (.*?)(?:\s+#.*)?$", text, re.M)
    assert {"ours", "ours-compile", "seed-case-ours", "update-stream", "no-split", "combo", "combo-no-split"} <= {name for name, _ in stages}
    for _, rest in stages:
        line = f"{bench.group(1)} {rest}".replace("$O", str(tmp_path)).replace("--device cuda", "--device cpu")
        check_args(parse_args(BenchArgs, shlex.split(line), "python -m tdmpc.bench", ""))
