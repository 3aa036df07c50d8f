"""tdmpc.reproduce: the packaged published curves, gathering fake runs, the skip/resume logic, bad input.

No training: run directories are written by hand, and the sequential runner drives a fake trainer.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tdmpc.cli import reproduce
from tdmpc.errors import BadInput
from tdmpc.cli.reproduce import Action, decide, last_eval_step, main, parse_seeds, seeds_text, train_command
from tdmpc.report.published import load_published

EVAL_COLUMNS = ["env_step", "episodes", "episode_return", "episode_return_std", "episode_length", "eval_seconds",
                "elapsed"]


def fake_run(run_dir: Path, task: str, seed: int, evals: list[tuple[int, float]], checkpoint: bool = True,
             seconds_per_step: float = 0.02, exp_name: str = "default", obs: str = "state",
             config: dict | None = None) -> Path:
    """A run directory as tdmpc.train leaves it: config.json (with `config`'s settings), eval.csv,
    checkpoints/latest.pt."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"steps": 100_000, **(config or {}), "task": task, "seed": seed,
                                                     "exp_name": exp_name, "obs": obs}))
    with open(run_dir / "eval.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(EVAL_COLUMNS)
        for step, ret in evals:
            w.writerow([step, 10, ret, 5.0, 500, 3.0, step * seconds_per_step])
    if checkpoint:  # its counters, as the trainer writes them at the last evaluation's step
        import torch

        (run_dir / "checkpoints").mkdir(exist_ok=True)
        torch.save({"train": {"step": max((s for s, _ in evals), default=0)}}, run_dir / "checkpoints" / "latest.pt")
    return run_dir


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- published data -------------------------------------------------------------------

ISSUE_MEANS_AT_100K = {"cartpole-swingup": 839, "cup-catch": 981, "finger-spin": 948, "reacher-easy": 937,
                       "walker-walk": 962, "pendulum-swingup": 724, "cheetah-run": 519}


def test_packaged_csv_has_the_published_tdmpc2_means_at_100k():
    published = load_published()
    for task, expected in ISSUE_MEANS_AT_100K.items():
        curve = published[("tdmpc2", task)]
        value, interpolated = curve.at(100_000)
        assert curve.seeds == 3 and not interpolated
        assert abs(round(value) - expected) <= 1, (task, value)
    assert len({task for _, task in published}) == 12
    assert {alg for alg, _ in published} == {"tdmpc2", "sac", "dreamerv3"}


def test_published_values_between_points_are_interpolated():
    curve = load_published()[("tdmpc2", "cup-catch")]
    v0, v100 = curve.at(0)[0], curve.at(100_000)[0]
    value, interpolated = curve.at(60_000)
    assert interpolated and value == pytest.approx(v0 + 0.6 * (v100 - v0))
    assert curve.at(2_000_000) == (None, False)


# --- gathering ------------------------------------------------------------------------

def test_gather_writes_table_csv_plot_with_ratios_and_verdicts(tmp_path, capsys):
    pub = load_published()
    cup, cart = pub[("tdmpc2", "cup-catch")].at(100_000)[0], pub[("tdmpc2", "cartpole-swingup")].at(100_000)[0]
    fake_run(tmp_path / "runs/cup-catch/seed1", "cup-catch", 1, [(50_000, 500.0), (100_000, 950.0)])
    fake_run(tmp_path / "runs/cup-catch/seed2", "cup-catch", 2, [(50_000, 600.0), (100_000, 930.0)],
             seconds_per_step=0.04)
    fake_run(tmp_path / "runs/cartpole-swingup/seed1", "cartpole-swingup", 1, [(50_000, 300.0), (100_000, 700.0)])
    out = tmp_path / "out"
    assert main(["--gather", str(tmp_path / "runs"), "--out", str(out)]) == 0

    rows = {(r["task"], int(r["env_step"])): r for r in read_rows(out / "results.csv")}
    r = rows[("cup-catch", 100_000)]
    assert r["seeds"] == "2" and float(r["ours_mean"]) == pytest.approx(940.0)
    assert float(r["tdmpc2_mean"]) == pytest.approx(cup, abs=0.01)
    assert float(r["ratio"]) == pytest.approx(940.0 / cup, abs=1e-4) and r["check"] == "PASS"
    assert r["published_interpolated"] == "0" and r["sac_mean"] != ""
    assert float(r["seconds_per_100k"]) == pytest.approx(3000.0)  # mean of 2000 and 4000
    r = rows[("cartpole-swingup", 100_000)]
    assert float(r["ratio"]) == pytest.approx(700.0 / cart, abs=1e-4) and r["check"] == "FAIL"
    assert rows[("cup-catch", 50_000)]["check"] == "" and rows[("cup-catch", 50_000)]["published_interpolated"] == "1"

    md = (out / "results.md").read_text()
    assert f"| cup-catch | default | 100,000 | 2 | 940.0 | {cup:.1f} | {940 / cup:.2f} | PASS |" in md
    assert "Config: each run's own config.json (a note below names any setting a task's seeds differ in" in md
    assert "different settings" not in md  # both seeds have the same
    assert "| cartpole-swingup | default | 100,000 | 1 | 700.0 |" in md and "| FAIL |" in md
    assert "interpolated" in md  # the 50k rows
    assert (out / "results.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "PASS  cup-catch" in printed and "FAIL  cartpole-swingup" in printed


def test_gather_short_runs_compare_at_their_last_step_against_interpolation(tmp_path):
    expected, _ = load_published()[("tdmpc2", "walker-walk")].at(60_000)
    fake_run(tmp_path / "w1", "walker-walk", 1, [(30_000, 100.0), (60_000, 0.95 * expected)])
    rows = reproduce.gather([tmp_path / "w1"], tmp_path / "out")
    (check,) = [r for r in rows if r.check]
    assert check.env_step == 60_000 and check.interpolated and check.check == "PASS (early)"
    assert check.ratio == pytest.approx(0.95)
    md = (tmp_path / "out/results.md").read_text()
    assert "60,000 | 1 |" in md and "| PASS (early) |" in md and "(early): the runs end before the bar's 100,000" in md


def test_gather_judges_only_the_steps_all_of_a_tasks_seeds_reach(tmp_path):
    """Seeds that evaluated at different steps: the verdict came from the seed that got furthest alone (100k, 1
    of 2 seeds) and each row from the seeds present there. As python -m tdmpc.plot draws it, each row is over both
    seeds (one read off the line between its own evaluations), up to the last step both reach, and results.md says
    what is left out."""
    fake_run(tmp_path / "runs/cup-catch/seed1", "cup-catch", 1, [(0, 10.0), (50_000, 500.0), (100_000, 950.0)])
    fake_run(tmp_path / "runs/cup-catch/seed2", "cup-catch", 2, [(0, 20.0), (40_000, 300.0), (60_000, 600.0)])
    rows = reproduce.gather(reproduce.find_runs([tmp_path / "runs"]), tmp_path / "out")
    assert [(r.env_step, r.seeds) for r in rows] == [(0, 2), (40_000, 2), (50_000, 2), (60_000, 2)]
    assert [r.ours for r in rows] == pytest.approx([15.0, (402.0 + 300.0) / 2, (500.0 + 450.0) / 2,
                                                    (590.0 + 600.0) / 2])
    (check,) = [r for r in rows if r.check]
    assert check.env_step == 60_000 and check.seeds == 2
    assert ("cup-catch (default): rows over steps 0–60,000, which all 2 seeds reach; their evaluations span steps "
            "0–100,000") in (tmp_path / "out/results.md").read_text()


def test_gather_names_the_settings_a_tasks_seeds_differ_in_that_change_what_they_learn(tmp_path, capsys):
    """Runs of two configs in one folder: gather averaged them as seeds of one without a word. Now a note (stderr
    and results.md) names each setting that differs and each seed's value; settings that say only how a run
    executes (threads, compile, eval_freq) are not differences; a model_size preset is compared by its sizes."""
    fake_run(tmp_path / "runs/cup/1", "cup-catch", 1, [(0, 10.0), (100_000, 950.0)],
             config={"num_samples": 512, "model_size": 5, "threads": 1})
    fake_run(tmp_path / "runs/cup/2", "cup-catch", 2, [(0, 10.0), (100_000, 900.0)],
             config={"num_samples": 512, "model_size": 5, "threads": 8, "compile": True, "eval_freq": 1000})
    fake_run(tmp_path / "runs/cup/3", "cup-catch", 3, [(0, 10.0), (100_000, 500.0)],
             config={"num_samples": 256, "model_size": 1})
    fake_run(tmp_path / "runs/walker/1", "walker-walk", 1, [(0, 10.0), (100_000, 950.0)],
             config={"model_size": 5, "threads": 1})
    fake_run(tmp_path / "runs/walker/2", "walker-walk", 2, [(0, 10.0), (100_000, 950.0)],
             config={"model_size": None, "mlp_dim": 512, "enc_dim": 256, "latent_dim": 512, "num_q": 5,
                     "num_enc_layers": 2})  # model size 5's sizes, each set: the same network
    reproduce.gather(reproduce.find_runs([tmp_path / "runs"]), tmp_path / "out")
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "different settings" in x]
    assert line.startswith("note: cup-catch (default): its seeds were trained with different settings (")
    assert "num_samples 512 (seeds 1, 2), 256 (seed 3)" in line and "mlp_dim 512 (seeds 1, 2), 384 (seed 3)" in line
    assert "threads" not in line and "compile" not in line and "eval_freq" not in line and "walker" not in err
    assert line[len("note: "):] + "." in (tmp_path / "out/results.md").read_text()
    from tdmpc.cli.plot import main as plot_main

    cups = [str(tmp_path / "runs/cup/1"), str(tmp_path / "runs/cup/3")]
    assert plot_main([*cups, "--out", str(tmp_path / "p.png")]) == 0
    assert capsys.readouterr().err == ("note: cup-catch (default): its seeds were trained with different settings "
                                       "(num_samples 512 (seed 1), 256 (seed 3); mlp_dim 512 (seed 1), 384 (seed 3); "
                                       "latent_dim 512 (seed 1), 128 (seed 3); num_q 5 (seed 1), 2 (seed 3)): the mean "
                                       "mixes configs, not seeds of one\n")


def test_a_pixel_run_is_compared_with_the_published_pixel_results_apart_from_state_runs(tmp_path):
    """obs rgb: its own curve and rows (", pixels"), judged against TD-MPC2 from pixels (the reference's
    results/tdmpc2-pixels: 463.7 at 100k on walker-walk, the mean of 495.4, 437.4 and 458.3), with no SAC beside it;
    a state run of the same task and name keeps the state curve (962.0)."""
    pixels = load_published("rgb")[("tdmpc2", "walker-walk")].at(100_000)[0]
    assert pixels == pytest.approx((495.4 + 437.4 + 458.3) / 3) and ("sac", "walker-walk") not in load_published("rgb")
    fake_run(tmp_path / "runs/pixels", "walker-walk", 1, [(100_000, 450.0)], obs="rgb")
    fake_run(tmp_path / "runs/state", "walker-walk", 1, [(100_000, 950.0)])
    rows = {r.exp_name: r for r in reproduce.gather(reproduce.find_runs([tmp_path / "runs"]), tmp_path / "out")
            if r.check}
    assert set(rows) == {"default", "default, pixels"}
    assert rows["default, pixels"].published["tdmpc2"] == pytest.approx(pixels)
    assert rows["default, pixels"].published["sac"] is None and rows["default, pixels"].check == "PASS"
    assert rows["default"].published["tdmpc2"] == pytest.approx(ISSUE_MEANS_AT_100K["walker-walk"], abs=1)
    assert rows["default"].published["sac"] is not None


def test_a_grid_never_takes_a_run_from_other_observations_for_its_own(tmp_path, capsys):
    """A finished state run where the pixel grid's run goes is a one-line error (exit 2), not a result skipped
    as done; and the other way round."""
    d = fake_run(tmp_path / "runs/walker-walk/seed1", "walker-walk", 1, [(100_000, 950.0)])
    root = ["--tasks", "walker-walk", "--seeds", "1", "--runs-root", str(tmp_path / "runs"), "--cfg", "a4000.json",
            "--dry-run"]
    assert main(root) == 0 and "seed 1: skip" in capsys.readouterr().out
    assert main([*root, "--", "--obs", "rgb"]) == 2
    err = capsys.readouterr().err.strip()
    assert "was trained with obs 'state', not the 'rgb' of -- --obs" in err and "\n" not in err, err
    fake_run(d, "walker-walk", 1, [(100_000, 450.0)], obs="rgb")
    assert main([*root, "--", "--obs", "rgb"]) == 0
    assert main(root) == 2
    assert "was trained with obs 'rgb', not the 'state' of --cfg a4000.json: " in capsys.readouterr().err


def test_a_grid_refuses_a_run_made_with_other_settings_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Runs made with a tiny config were skipped as the result of --cfg a4000.json, and resumed (seeds 1-2) with new
    flags beside a new seed 3 from tdmpc.train's default, all averaged as one grid. Each run to skip or resume is now
    compared with the config the command asks, setting by setting, and one that differs is one line naming the run,
    the setting, both values and where the asked one comes from. --steps may grow; settings that say how a run
    executes or what it writes (threads, eval_episodes, ...) may differ."""
    from helpers import TINY, tiny_json

    from tdmpc.config import from_dict

    _fake_trainer(tmp_path, monkeypatch, 0)
    root = tmp_path / "runs"
    for seed in (1, 2):  # every setting in config.json, as the trainer writes it
        fake_run(root / f"Pendulum-v1/seed{seed}", "Pendulum-v1", seed, [(400, -900.0), (600, -400.0)],
                 config=from_dict(TINY).to_dict())
    grid = ["--tasks", "Pendulum-v1", "--seeds", "1-2", "--steps", "600", "--runs-root", str(root)]
    seed1 = root / "Pendulum-v1/seed1"
    for argv, needle in (
            (["--cfg", "a4000.json"], f"error: {seed1} was trained with batch_size 16, not the 256 of --cfg a4000.json "
                                      f"(and buffer_size, iterations, num_samples, "),
            (["--seeds", "1-3", "--steps", "800", "--", "--batch-size", "32", "--num-envs", "2"],
             f"error: {seed1} was trained with num_envs 1, not the 2 of -- --num-envs (and batch_size, "),
            (["--cfg", str(tiny_json(tmp_path)), "--", "--batch-size", "32"],
             f"error: {seed1} was trained with batch_size 16, not the 32 of -- --batch-size: the seeds of one grid "
             f"share their config; rerun with the --cfg and flags after -- it was made with, or give this config a new "
             f"--runs-root\n")):
        assert main([*grid, *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith(needle) and err.count("\n") == 1, err
    assert not (tmp_path / "calls.jsonl").exists() and not (root / "results.md").exists()

    # The config they were made with: seeds 1 and 2 resume to 800 env steps beside a new seed 3, with other threads
    # and evaluations; results.md names the config
    tiny = ["--cfg", str(tiny_json(tmp_path))]
    assert main([*grid, *tiny, "--seeds", "1-3", "--steps", "800", "--", "--threads", "1", "--eval-episodes", "4"]) == 0
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c[0] for c in calls] == ["--resume", "--resume", "--cfg"], calls
    md = (root / "results.md").read_text()
    assert f"Config: --cfg {tmp_path / 'tiny.json'}, then --threads 1 --eval-episodes 4 (after --); every run " \
           f"checked to match it in what it learns (tdmpc.reproduce)." in md, md


def test_gather_unknown_task_and_runs_without_evals_are_fine(tmp_path, capsys):
    fake_run(tmp_path / "runs/p", "Pendulum-v1", 1, [(400, -500.0)])
    fake_run(tmp_path / "runs/empty", "cup-catch", 1, [])
    assert main(["--gather", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    (row,) = read_rows(tmp_path / "out/results.csv")
    assert row["task"] == "Pendulum-v1" and row["check"] == "n/a" and row["tdmpc2_mean"] == ""
    assert "n/a" in capsys.readouterr().out


def test_gather_keeps_offline_runs_set_aside_runs_and_repeated_seeds_apart(tmp_path, capsys):
    """An offline run's steps are updates: never judged against the published env-step curves; a directory set
    aside (seed1.stale1) is no seed; two runs of one seed are said, and count as one seed each only once."""
    cup = load_published()[("tdmpc2", "cup-catch")].at(100_000)[0]
    fake_run(tmp_path / "runs/cup-catch/seed1", "cup-catch", 1, [(100_000, cup)])
    fake_run(tmp_path / "runs/cup-catch/seed1.stale1", "cup-catch", 1, [(0, 5.0)], checkpoint=False)
    fake_run(tmp_path / "again/cup-catch/seed1", "cup-catch", 1, [(100_000, cup)])
    offline = fake_run(tmp_path / "runs/offline", "cup-catch", 2, [(100_000, 0.0)])
    cfg = json.loads((offline / "config.json").read_text())
    (offline / "config.json").write_text(json.dumps({**cfg, "dataset": ["data.h5"]}))
    assert main(["--gather", str(tmp_path / "runs"), str(tmp_path / "again"), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    rows = read_rows(tmp_path / "out/results.csv")
    assert {(r["exp_name"], r["env_step"]) for r in rows} == {("default", "100000")}, rows  # no stale step 0
    (row,) = rows
    assert row["seeds"] == "1" and row["check"] == "PASS", row
    assert "offline" in err and "seed 1" in err and "2 runs" in err, err

    # Of two runs of one seed, the one that got further counts, whichever path sorts first (a resubmitted grid)
    fake_run(tmp_path / "early/cup-catch/seed1", "cup-catch", 1, [(0, 5.0), (50_000, 10.0)])
    assert main(["--gather", str(tmp_path / "early"), str(tmp_path / "runs"), "--out", str(tmp_path / "out2")]) == 0
    assert read_rows(tmp_path / "out2/results.csv")[0]["env_step"] == "100000"
    assert f"skipping {tmp_path / 'early/cup-catch/seed1'}: seed 1" in capsys.readouterr().err


def test_gather_of_a_file_and_an_out_folder_blocked_by_a_file_are_one_line(tmp_path, capsys):
    run = fake_run(tmp_path / "runs/p", "Pendulum-v1", 1, [(400, -500.0)])
    (tmp_path / "f.h5").write_bytes(b"x")
    for argv, needle in ((["--gather", str(tmp_path / "f.h5")], "a file; give run directories"),
                         (["--gather", str(run), "--out", str(tmp_path / "f.h5" / "sub")], "f.h5 is a file"),
                         (["--tasks", "Pendulum-v1", "--seeds", "1", "--out", str(tmp_path / "f.h5")], "f.h5 is a file")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and "\n" not in err, err


def test_gather_with_nothing_to_read_is_one_line_exit_2(tmp_path, capsys):
    assert main(["--gather", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no run directories") and "\n" not in err


def test_an_evaluation_row_a_crash_cut_short_is_no_evaluation(tmp_path):
    """The runner read a cut-short last row ("100000,10,9" of "100000,10,912.5,...") as a finished evaluation."""
    d = fake_run(tmp_path / "cup-catch/seed1", "cup-catch", 1, [(50_000, 500.0)])
    with open(d / "eval.csv", "a") as f:
        f.write("100000,10,9")
    assert last_eval_step(d) == 50_000 and decide(d, "cup-catch", 1, 100_000) is Action.RESUME


# --- the sequential runner ------------------------------------------------------------

def test_decide_start_skip_resume_restart(tmp_path):
    d = tmp_path / "cup-catch/seed1"
    assert decide(d, "cup-catch", 1, 100_000) is Action.START
    d.mkdir(parents=True)
    assert decide(d, "cup-catch", 1, 100_000) is Action.START  # empty
    fake_run(d, "cup-catch", 1, [(50_000, 500.0)])
    assert decide(d, "cup-catch", 1, 100_000) is Action.RESUME
    fake_run(d, "cup-catch", 1, [(50_000, 500.0), (100_000, 900.0)])
    assert decide(d, "cup-catch", 1, 100_000) is Action.SKIP
    assert decide(d, "cup-catch", 1, 200_000) is Action.RESUME  # extend a finished shorter run
    fake_run(d, "cup-catch", 1, [(50_000, 500.0)])  # the final checkpoint failed (a full disk) after its eval
    fake_run(d, "cup-catch", 1, [(50_000, 500.0), (100_000, 900.0)], checkpoint=False)
    assert decide(d, "cup-catch", 1, 100_000) is Action.RESUME
    (d / "checkpoints/latest.pt").write_bytes(b"damaged")  # eval.csv's word, as with none
    assert decide(d, "cup-catch", 1, 100_000) is Action.SKIP
    (d / "checkpoints/latest.pt").unlink()  # checkpoints deleted to free disk: still finished
    assert decide(d, "cup-catch", 1, 100_000) is Action.SKIP
    fake_run(d, "cup-catch", 1, [(50_000, 500.0)])
    (d / "checkpoints/latest.pt").rename(d / "checkpoints/previous.pt")  # latest.pt gone: train resumes the one before
    assert decide(d, "cup-catch", 1, 100_000) is Action.RESUME
    (d / "checkpoints/previous.pt").unlink()
    fake_run(d, "cup-catch", 1, [(50_000, 500.0)], checkpoint=False)  # died before its first checkpoint
    assert decide(d, "cup-catch", 1, 100_000) is Action.RESTART
    with pytest.raises(BadInput, match="seed 1, not cup-catch seed 2"):
        decide(d, "cup-catch", 2, 100_000)


def test_train_commands(tmp_path):
    d = tmp_path / "run"
    start = train_command(Action.START, d, "cup-catch", 2, 100_000, "a4000.json", ["--device", "cpu"])
    assert start[-12:] == ["--cfg", "a4000.json", "--task", "cup-catch", "--seed", "2", "--steps", "100000",
                           "--run-dir", str(d), "--device", "cpu"]
    resume = train_command(Action.RESUME, d, "cup-catch", 2, 100_000, "a4000.json", ["--device", "cpu"])
    assert resume[-6:] == ["--resume", str(d), "--steps", "100000", "--device", "cpu"]
    assert "--cfg" not in resume  # the run's own config.json applies


FAKE_TRAIN = r'''
import csv, json, os, sys
from pathlib import Path
argv = sys.argv[1:]
flag = lambda name: argv[argv.index(name) + 1] if name in argv else None
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(argv) + "\n")
run = Path(flag("--resume") or flag("--run-dir"))
if not flag("--resume"):
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": flag("--task"), "seed": int(flag("--seed"))}))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest.pt").write_bytes(b"x")
    with open(run / "eval.csv", "w") as f:
        f.write("env_step,episodes,episode_return,episode_return_std,episode_length,eval_seconds,elapsed\n")
if not flag("--resume") and flag("--seed") == os.environ.get("FAKE_STOP_SEED"):
    sys.exit(3)  # stopped by a signal before the end
if os.environ.get("FAKE_STARTUP"):  # still starting up (importing torch, say): no signal handler of its own yet
    import time
    open(os.environ["FAKE_EVENTS"], "a").write(f"starting {run.name}\n")
    time.sleep(float(os.environ["FAKE_STARTUP"]))
if os.environ.get("FAKE_SECONDS"):  # a run that takes a while: says when it runs, and stops on SIGTERM
    import signal, time
    events = lambda what: open(os.environ["FAKE_EVENTS"], "a").write(f"{what} {run.name}\n")
    signal.signal(signal.SIGTERM, lambda *_: (events("stopped"), sys.exit(3)))
    print(f"training {run.name} with --threads {flag('--threads')}", flush=True)
    events("start")
    time.sleep(float(os.environ["FAKE_SECONDS"]))
    events("end")
with open(run / "eval.csv", "a") as f:
    f.write(f"{flag('--steps')},2,-300,1,200,1,10\n")
'''


def test_runner_stops_on_exit_3_and_a_rerun_resumes_and_skips(tmp_path, monkeypatch, capsys):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setattr(reproduce, "TRAIN", [sys.executable, str(script)])
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_STOP_SEED", "1")
    root = tmp_path / "runs"
    cmd = ["--tasks", "Pendulum-v1", "--seeds", "1-2", "--steps", "400", "--runs-root", str(root), "--",
           "--device", "cpu"]

    assert main(cmd) == 3
    assert not (root / "Pendulum-v1/seed2").exists()  # the stop ended the whole command
    assert "rerun the same command" in capsys.readouterr().err

    monkeypatch.delenv("FAKE_STOP_SEED")
    assert main(cmd) == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[1][:4] == ["--resume", str(root / "Pendulum-v1/seed1"), "--steps", "400"]
    assert "--run-dir" in calls[2] and calls[2][calls[2].index("--seed") + 1] == "2"
    assert calls[2][-2:] == ["--device", "cpu"]
    rows = read_rows(root / "results.csv")  # gathered automatically
    assert [(r["task"], r["env_step"], r["seeds"]) for r in rows] == [("Pendulum-v1", "400", "2")]
    assert "Config: tdmpc.train's default here, " in (root / "results.md").read_text()

    capsys.readouterr()
    assert main(cmd) == 0  # everything finished: nothing runs again
    assert len(log.read_text().splitlines()) == 3
    assert capsys.readouterr().out.count(": skip ") == 2


def _fake_trainer(tmp_path, monkeypatch, seconds: float) -> Path:
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(reproduce, "TRAIN", [sys.executable, str(script)])
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path / "events.txt"))
    monkeypatch.setenv("FAKE_SECONDS", str(seconds))
    return tmp_path / "events.txt"


def test_jobs_run_side_by_side_each_with_its_log_and_share_of_the_cores(tmp_path, monkeypatch, capsys):
    events = _fake_trainer(tmp_path, monkeypatch, 3)  # long enough that the second starts before the first ends
    root = tmp_path / "runs"
    cmd = ["--tasks", "Pendulum-v1", "--seeds", "1-3", "--steps", "400", "--runs-root", str(root)]

    assert main([*cmd, "--jobs", "2"]) == 0
    seq = events.read_text().split()[::2]
    assert seq[:2] == ["start", "start"], events.read_text()  # two at once, then the third
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    for seed in (1, 2, 3):
        assert (root / f"Pendulum-v1/seed{seed}.log").read_text() == f"training seed{seed} with --threads {share}\n"
    out = capsys.readouterr().out
    assert f"each run gets --threads {share}" in out and out.count("finished in") == 3
    assert [r["seeds"] for r in read_rows(root / "results.csv")] == ["3"]  # gathered once all had finished

    events.unlink()  # one at a time (the default): each ends before the next starts
    monkeypatch.setenv("FAKE_SECONDS", "0.2")
    assert main([*cmd[:-1], str(tmp_path / "seq")]) == 0
    assert events.read_text().split()[::2] == ["start", "end"] * 3


def test_a_sigterm_stops_every_running_job_and_a_rerun_resumes_them(tmp_path, monkeypatch):
    events = _fake_trainer(tmp_path, monkeypatch, 60)
    root = tmp_path / "runs"
    cmd = [sys.executable, "-c", "import sys; from tdmpc.cli import reproduce; reproduce.TRAIN = sys.argv[1:3]; "
           "sys.exit(reproduce.main(sys.argv[3:]))", *reproduce.TRAIN, "--tasks", "Pendulum-v1", "--seeds", "1-3",
           "--steps", "400", "--runs-root", str(root), "--jobs", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while (events.read_text().count("start") if events.exists() else 0) < 2:
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert events.read_text().split()[::2][2:] == ["stopped", "stopped"]  # both got it; seed 3 never began
    assert "stopped during Pendulum-v1 seed 1, Pendulum-v1 seed 2" in err or \
        "stopped during Pendulum-v1 seed 2, Pendulum-v1 seed 1" in err, err
    assert not (root / "Pendulum-v1/seed3").exists()

    monkeypatch.setenv("FAKE_SECONDS", "0")
    assert main(cmd[5:]) == 0
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert sorted(c[1] for c in calls[2:4]) == [str(root / "Pendulum-v1/seed1"), str(root / "Pendulum-v1/seed2")]
    assert all(c[0] == "--resume" for c in calls[2:4]) and "--run-dir" in calls[4]


def _start_grid(root: Path, *argv: str, **popen) -> subprocess.Popen:
    """python -m tdmpc.reproduce with the fake trainer, as a process of its own."""
    cmd = [sys.executable, "-c", "import sys; from tdmpc.cli import reproduce; reproduce.TRAIN = sys.argv[1:3]; "
           "sys.exit(reproduce.main(sys.argv[3:]))", *reproduce.TRAIN, "--tasks", "Pendulum-v1", "--seeds", "1-2",
           "--steps", "400", "--runs-root", str(root), *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _wait_for_events(events: Path, what: str, n: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while (events.read_text().split().count(what) if events.exists() else 0) < n:
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)


def test_a_sigint_to_the_parent_alone_stops_every_job_as_sigterm_does(tmp_path, monkeypatch):
    """kill -INT of reproduce's pid (not of its process group): each run checkpoints (the fake trainer stops on
    the SIGTERM passed on) and the command exits 3, instead of letting the runs train to the end."""
    events = _fake_trainer(tmp_path, monkeypatch, 60)
    proc = _start_grid(tmp_path / "runs", "--jobs", "2")
    _wait_for_events(events, "start", 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert events.read_text().split()[::2][2:] == ["stopped", "stopped"], events.read_text()
    assert "stopped during" in err and "rerun the same command" in err


def test_ctrl_c_to_the_whole_group_leaves_one_line_in_the_log_of_a_run_still_starting(tmp_path, monkeypatch):
    """Ctrl-C at the terminal reaches reproduce and its runs: a run still starting up (no handler of its own yet)
    ignores it and is stopped by the SIGTERM reproduce passes on; its log says so in one line, no traceback."""
    events = _fake_trainer(tmp_path, monkeypatch, 60)
    monkeypatch.setenv("FAKE_STARTUP", "60")
    root = tmp_path / "runs"
    proc = _start_grid(root, "--jobs", "2", start_new_session=True)
    _wait_for_events(events, "starting", 2, proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    for seed in (1, 2):
        log = (root / f"Pendulum-v1/seed{seed}.log").read_text()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
        assert log.splitlines() == ["tdmpc.reproduce: the run was ended by SIGTERM in its start-up, before it "
                                    "trained (nothing to checkpoint yet)"], log


def test_a_live_run_is_never_set_aside_nor_written_by_a_second_reproduce(tmp_path, monkeypatch, capsys):
    """A run going on without a checkpoint yet (its lock is held, as its trainer holds it): a second reproduce on
    the same root refuses in one line before any run starts, and never moves it away, even when the run started
    between the decision and the move (the move takes the lock first)."""
    from tdmpc.training.run_dir import RunDirLock

    _fake_trainer(tmp_path, monkeypatch, 0)
    root = tmp_path / "runs"
    live = fake_run(root / "Pendulum-v1/seed1", "Pendulum-v1", 1, [(0, -900.0)], checkpoint=False)
    cmd = ["--tasks", "Pendulum-v1", "--seeds", "1-2", "--steps", "400", "--runs-root", str(root), "--jobs", "2"]
    lock = RunDirLock(live)
    lock.acquire()
    try:
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and f"in use by pid {os.getpid()}" in err, err
        lock.release()
        decide = reproduce.decide

        def decided_then_started(run_dir, *args):
            action = decide(run_dir, *args)
            if run_dir == live:
                lock.acquire()
            return action

        monkeypatch.setattr(reproduce, "decide", decided_then_started)
        assert main(cmd) == 2
        assert f"in use by pid {os.getpid()}" in capsys.readouterr().err
    finally:
        lock.release()
    assert not (tmp_path / "calls.jsonl").exists()
    assert sorted(p.name for p in live.parent.iterdir()) == ["seed1"] and (live / "eval.csv").is_file()


def test_a_file_where_a_run_directory_goes_is_refused_before_any_run_starts(tmp_path, monkeypatch, capsys):
    _fake_trainer(tmp_path, monkeypatch, 0)
    root = tmp_path / "runs"
    (root / "Pendulum-v1").mkdir(parents=True)
    (root / "Pendulum-v1/seed2").write_text("my notes\n")
    (tmp_path / "other").write_text("a file where the task folder goes\n")
    for runs_root, path in ((root, root / "Pendulum-v1/seed2"), (tmp_path / "other", tmp_path / "other")):
        assert main(["--tasks", "Pendulum-v1", "--seeds", "1-2", "--steps", "400", "--runs-root", str(runs_root),
                     "--jobs", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {path} is a file where the run directory") and "\n" not in err, err
    assert not (tmp_path / "calls.jsonl").exists() and not (root / "Pendulum-v1/seed1").exists()
    assert (root / "Pendulum-v1/seed2").read_text() == "my notes\n"


def test_a_folder_in_the_way_of_a_later_run_is_refused_before_any_run_starts(tmp_path, monkeypatch, capsys):
    """With --jobs the first runs would be training while a later cell is decided: every cell is decided first."""
    _fake_trainer(tmp_path, monkeypatch, 0)
    root = tmp_path / "runs"
    fake_run(root / "Pendulum-v1/seed2", "cup-catch", 2, [])
    assert main(["--tasks", "Pendulum-v1", "--seeds", "1-2", "--steps", "400", "--runs-root", str(root),
                 "--jobs", "2"]) == 2
    assert "holds a run of cup-catch seed 2" in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists() and not (root / "Pendulum-v1/seed1").exists()


def test_dry_run_prints_the_plan(tmp_path, capsys):
    fake_run(tmp_path / "Pendulum-v1/seed1", "Pendulum-v1", 1, [(400, -200.0)])
    assert main(["--tasks", "Pendulum-v1", "--seeds", "1,2", "--steps", "400", "--runs-root", str(tmp_path),
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seed 1: skip" in out and "seed 2: start" in out and "tdmpc.train" in out
    assert not (tmp_path / "Pendulum-v1/seed2").exists()
    # a run short of the target resumes with its own config: what of it stays its own is said
    assert main(["--tasks", "Pendulum-v1", "--seeds", "1,2", "--steps", "800", "--runs-root", str(tmp_path),
                 "--cfg", "cpu.json", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seed 1: resume" in out and "1 run(s) resume with their own config.json, which matches --cfg cpu.json " \
                                       "in what it learns; its eval, output and hardware settings stay its own" in out


def test_slurm_mode_calls_sweep_and_says_how_to_gather(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # sweep.sh's logs go under ./slurm/logs
    sweep = tmp_path / "sweep.sh"
    sweep.write_text('echo "sweep $* runs=$TDMPC_RUNS"\n')
    monkeypatch.setattr(reproduce, "sweep_script", lambda: sweep)
    root = tmp_path / "runs"
    assert main(["--slurm", "--tasks", "cartpole-swingup,cup-catch", "--seeds", "1-3", "--cfg", "a4000.json",
                 "--runs-root", str(root), "--", "--num-envs", "2"]) == 0
    out = capfd.readouterr().out
    assert (f"sweep --tasks cartpole-swingup,cup-catch --seeds 1-3 -- --cfg a4000.json --steps 100000 "
            f"--num-envs 2 runs={root}") in out
    assert f"--gather {root / 'slurm'}" in out


def test_a_slurm_submission_that_fails_is_one_line_and_leaves_no_log_folder(tmp_path, monkeypatch, capfd):
    """No cluster answers: sbatch's fatal lines and an empty ./slurm/logs were left behind, with exit 1."""
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep.sh"
    sweep.write_text('mkdir -p "$PWD/slurm/logs"\necho "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error" >&2\n'
                     'echo "sbatch: fatal: Could not establish a configuration source" >&2\nexit 1\n')
    monkeypatch.setattr(reproduce, "sweep_script", lambda: sweep)
    assert main(["--slurm", "--tasks", "cup-catch", "--seeds", "1", "--runs-root", str(tmp_path / "runs")]) == 1
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: nothing submitted: ") and "\n" not in err, err
    assert err.endswith("(sbatch: fatal: Could not establish a configuration source)"), err
    assert not (tmp_path / "slurm").exists() and not (tmp_path / "runs").exists()


# --- input ------------------------------------------------------------------------------

def test_seed_lists_and_ranges():
    assert parse_seeds("1-3") == parse_seeds("1,2,3") == [1, 2, 3]
    assert parse_seeds("1-3, 7,9") == [1, 2, 3, 7, 9]
    assert seeds_text([1, 2, 3, 7, 9, 10]) == "1-3,7,9-10"


@pytest.mark.parametrize("argv", [
    ["--tasks", "cup-catch", "--seeds", "a-b"],
    ["--tasks", "cup-catch", "--seeds", "3-1"],
    ["--tasks", "cup-catch", "--seeds", ""],
    ["--tasks", "cup-catch", "--seeds", "1,1", "--dry-run"],  # slurm/sweep.sh refuses these too; they were taken
    ["--tasks", "cup-catch", "--seeds", "1-3,2", "--dry-run"],
    ["--tasks", "Pendulum-v1,,cup-catch", "--dry-run"],
    ["--tasks", "cup-catch,", "--dry-run"],
    ["--tasks", "cup-catch,cup-catch", "--dry-run"],
    ["--tasks", ""],
    ["--tasks", " , "],
    [],
    ["--tasks", "cup-catch", "--", "--seed", "4"],
    ["--tasks", "cup-catch", "--dry-run", "--", "--run_dir", "x"],  # as tdmpc.train spells it too
    ["--tasks", "cup-catch", "--dry-run", "--", "--auto-resume=x"],
    ["--tasks", "cup-catch", "--dry-run", "--", "--tasks", "walker-walk"],
    ["--tasks", "cup-catch", "--steps", "0"],
    ["--tasks", "cup-catch,walker-wlak"],
    ["--gather", "--slurm"],
    ["--tasks", "cup-catch", "--jobs", "0"],
    ["--tasks", "cup-catch", "--jobs", "2", "--slurm"],
])
def test_bad_input_is_one_line_exit_2(argv, tmp_path, capsys):
    assert main([*argv, "--runs-root", str(tmp_path)] if "--" not in argv else argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err


def test_a_multitask_run_gathers_as_one_curve_per_task_at_its_own_env_steps(tmp_path):
    """A 2-task run's eval.csv has a row per task and the mean; each task is compared at its own env steps
    (half the run's), beside the single-task runs of the same task."""
    run = tmp_path / "mt" / "seed1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"task": "cup-catch,cartpole-swingup", "seed": 1,
                                                 "exp_name": "default"}))
    with open(run / "eval.csv", "w", newline="") as f:
        f.write("env_step,task,episodes,episode_return,episode_return_std,episode_length,eval_seconds,elapsed\n")
        for step, cup, cart in ((100_000, 400.0, 300.0), (200_000, 970.0, 850.0)):
            for task, ret in (("cup-catch", cup), ("cartpole-swingup", cart), ("mean", (cup + cart) / 2)):
                f.write(f"{step},{task},10,{ret},5.0,500,3.0,{step * 0.05}\n")
    single = fake_run(tmp_path / "single" / "cup-catch" / "seed1", "cup-catch", 1, [(50_000, 600.0), (100_000, 960.0)])
    rows = reproduce.gather([run, single], tmp_path / "out")
    checks = {(r.task, r.exp_name): r for r in rows if r.check}
    mt = checks[("cup-catch", "default, multi-task")]
    assert mt.env_step == 100_000 and mt.ours == 970.0 and mt.check == "PASS"  # 200k in all = 100k per task
    assert checks[("cartpole-swingup", "default, multi-task")].ours == 850.0
    assert checks[("cup-catch", "default")].ours == 960.0
    assert mt.sec_per_100k == pytest.approx(200_000 * 0.05 / 100_000 * 100_000)  # both tasks' steps took it


def test_an_offline_multitask_run_is_drawn_at_its_updates_not_divided_among_its_tasks(tmp_path, capsys):
    """An offline run's steps count updates, each over all its tasks: plot drew a 2-task offline run's 50 updates
    at 25 (the division an online multi-task run's env steps need)."""
    from tdmpc.report.curves import group_runs

    run = tmp_path / "offmt"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"task": "finger-spin,cartpole-swingup", "seed": 1,
                                                 "dataset": ["f.h5", "c.h5"]}))
    with open(run / "eval.csv", "w", newline="") as f:
        f.write("env_step,task,episodes,episode_return,episode_return_std,episode_length,eval_seconds,elapsed\n")
        for step in (0, 50):
            for task in ("finger-spin", "cartpole-swingup", "mean"):
                f.write(f"{step},{task},1,10.0,0.0,500,3.0,{step}\n")
    curves = group_runs([run])
    assert [c.steps.tolist() for c in curves] == [[0, 50], [0, 50]] and all(c.offline for c in curves)
    # gather leaves it out in one line (not one per task), and with nothing else says so, not "no evaluation yet"
    from tdmpc.errors import BadInput

    with pytest.raises(BadInput, match=r"^none of the run directories is an online run with an evaluation \(1 "
                                       r"offline, left out above\)$"):
        reproduce.gather([run], tmp_path / "out")
    assert capsys.readouterr().err.count("an offline run") == 1
    # nor does a grid train offline runs only to leave them all out at its end
    assert main(["--tasks", "finger-spin", "--seeds", "1", "--runs-root", str(tmp_path / "rr"), "--", "--dataset",
                 "f.h5"]) == 2
    assert "--dataset after --: reproduce compares runs with the published curves" in capsys.readouterr().err
    assert not (tmp_path / "rr").exists()


def test_a_seed_that_returned_nan_counts_in_the_mean_and_fails_the_check(tmp_path, capsys):
    """A diverged seed (NaN return at 100k) was dropped from the row, and the two others passed as '2 seeds'. Now
    the row is over all 3, its mean NaN and its verdict FAIL, with a note naming the seed and the step."""
    for seed, ret in ((1, 970.0), (2, float("nan")), (3, 890.0)):
        fake_run(tmp_path / f"n/{seed}", "cup-catch", seed, [(50_000, 500.0), (100_000, ret)])
    rows = reproduce.gather(reproduce.find_runs([tmp_path / "n"]), tmp_path / "out")
    (check,) = [r for r in rows if r.check]
    assert check.env_step == 100_000 and check.seeds == 3 and check.ours != check.ours and check.check == "FAIL"
    assert [r.seeds for r in rows] == [3, 3] and rows[0].ours == 500.0
    assert ("cup-catch (default): seed 2 has no finite return at step(s) 100,000 (an evaluation returned NaN): the "
            "mean there is NaN, a FAIL where it is the check step.") in (tmp_path / "out/results.md").read_text()
    assert "FAIL  cup-catch (default): ours nan at 100,000 env steps (3 seeds)" in capsys.readouterr().out


def test_gather_bar_sets_the_verdict(tmp_path, capsys):
    """--bar is the fraction of the published mean that passes: the same run fails at 0.9 and passes at 0.8."""
    cart = load_published()[("tdmpc2", "cartpole-swingup")].at(100_000)[0]
    fake_run(tmp_path / "runs/cartpole-swingup/seed1", "cartpole-swingup", 1, [(100_000, 0.85 * cart)])
    for bar, verdict in (("0.9", "FAIL"), ("0.8", "PASS")):
        out = tmp_path / f"out{bar}"
        assert main(["--gather", str(tmp_path / "runs"), "--out", str(out), "--bar", bar]) == 0
        (row,) = [r for r in read_rows(out / "results.csv") if r["check"]]
        assert row["check"] == verdict, (bar, row)
    assert main(["--gather", str(tmp_path / "runs"), "--bar", "0"]) == 2  # outside (0, 10]


def test_plot_command_draws_runs_grouped_as_seeds(tmp_path):
    """python -m tdmpc.plot: two seeds of one task become one curve in a PNG; a folder that is no run is one line."""
    from helpers import one_line_error, run_module

    runs = [fake_run(tmp_path / f"s{seed}", "cup-catch", seed, [(0, 10.0), (50_000, 400.0 + seed)]) for seed in (1, 2)]
    out = tmp_path / "cup.png"
    r = run_module("tdmpc.plot", *runs, "--out", out)
    assert r.returncode == 0 and f"wrote {out}" in r.stdout, r.stderr
    assert out.stat().st_size > 5_000
    assert "no eval.csv" in one_line_error(run_module("tdmpc.plot", tmp_path, "--out", tmp_path / "x.png"))


def test_plot_keeps_offline_runs_apart_and_says_when_runs_share_a_seed(tmp_path):
    from tdmpc.report.curves import group_runs

    runs = [fake_run(tmp_path / name, "cup-catch", 1, [(0, 10.0), (50_000, 400.0)]) for name in ("a", "b", "off")]
    cfg = json.loads((runs[2] / "config.json").read_text())
    (runs[2] / "config.json").write_text(json.dumps({**cfg, "dataset": ["data.h5"]}))
    labels = sorted(c.label for c in group_runs(runs))
    assert labels == ["cup-catch (default), 2 runs of 1 seed", "cup-catch (default, offline), 1 seed"], labels


def test_plot_averages_every_point_over_all_the_seeds_its_label_counts(tmp_path, monkeypatch, capsys):
    """Seeds that evaluated at different steps: each step averaged the seeds present there (one of '3 seeds' at
    40k), and the curve went on past a seed's end. Now each seed is read off the line between its evaluations,
    and the curve covers the steps all three reach, with a line saying what is left out."""
    import matplotlib.axes
    import numpy as np

    from tdmpc.report.curves import draw, group_runs

    runs = [fake_run(tmp_path / "s1", "cup-catch", 1, [(0, 0.0), (50_000, 100.0), (100_000, 300.0)]),
            fake_run(tmp_path / "s2", "cup-catch", 2, [(0, 0.0), (40_000, 80.0), (100_000, 200.0)]),
            fake_run(tmp_path / "s3", "cup-catch", 3, [(0, 30.0), (50_000, 130.0)])]
    drawn = []
    real_plot = matplotlib.axes.Axes.plot

    def plot(ax, x, y, **kw):
        drawn.append((list(x), list(y), kw["label"]))
        return real_plot(ax, x, y, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    draw(group_runs(runs), tmp_path / "p.png")
    ((steps, mean, label),) = drawn
    assert label == "cup-catch (default), 3 seeds" and steps == [0, 40_000, 50_000, 100_000]
    np.testing.assert_allclose(mean, [10.0, 90.0, 110.0, np.nan])  # s1 at 40k: 80, s2 at 50k: 100, s3 ends at 50k
    assert capsys.readouterr().err == ("note: cup-catch (default), 3 seeds: drawn over steps 0-50,000, which all 3 "
                                       "runs reach; their evaluations span steps 0-100,000\n")


def test_a_curve_with_no_step_all_its_seeds_reach_names_the_remedy_only_where_the_command_has_it(tmp_path, capsys):
    """Seeds evaluated over disjoint steps: nothing is drawn for them. tdmpc.plot's note names --no-group; the same
    note under reproduce (draw without a remedy) named a flag reproduce does not have."""
    from tdmpc.cli.plot import main as plot_main
    from tdmpc.report.curves import draw, group_runs

    runs = [fake_run(tmp_path / "s1", "cup-catch", 1, [(0, 0.0), (10_000, 100.0)]),
            fake_run(tmp_path / "s2", "cup-catch", 2, [(20_000, 80.0), (30_000, 200.0)])]
    assert plot_main([*map(str, runs), "--out", str(tmp_path / "p.png")]) == 0
    note = ("note: cup-catch (default), 2 seeds: no step lies within all 2 runs' evaluations (their evaluations span "
            "steps 0-30,000): nothing drawn")
    assert capsys.readouterr().err == note + "; --no-group draws each run\n"
    draw(group_runs(runs), tmp_path / "q.png")
    assert capsys.readouterr().err == note + "\n"


def test_plot_makes_the_missing_folders_of_out_as_every_command_does_and_says_so(tmp_path, capsys):
    """collect --out, evaluate --report and reproduce --gather --out make missing folders: plot does too, and its
    --help now says so (it made them unannounced)."""
    import re

    from tdmpc.cli.plot import main as plot_main

    run = fake_run(tmp_path / "s1", "cup-catch", 1, [(0, 10.0), (50_000, 400.0)])
    out = tmp_path / "new" / "figs" / "cup.png"
    assert plot_main([str(run), "--out", str(out)]) == 0 and out.stat().st_size > 5_000
    with pytest.raises(SystemExit):
        plot_main(["--help"])
    assert "Missing folders on its way are made" in " ".join(re.sub("[│|]", " ", capsys.readouterr().out).split())


def test_a_row_cut_short_at_the_end_of_eval_csv_is_left_out(tmp_path):
    """A crash as a row was written leaves a last line without its newline: it is no evaluation (nor garbage)."""
    from tdmpc.report.curves import group_runs

    run = fake_run(tmp_path / "run", "cup-catch", 1, [(0, 10.0), (50_000, 400.0)])
    with open(run / "eval.csv", "a") as f:
        f.write("100000,10,9")  # 100000,10,950.0,... cut short: it would read as a return of 9
    (curve,) = group_runs([run])
    assert curve.steps.tolist() == [0, 50_000] and curve.returns.tolist() == [[10.0, 400.0]]


def test_a_gymnasium_task_without_a_published_curve_is_judged_by_its_solved_threshold(tmp_path, capsys):
    fake_run(tmp_path / "runs/CartPole-v1/seed1", "CartPole-v1", 1, [(10_000, 300.0), (30_000, 490.0)])
    fake_run(tmp_path / "runs/Acrobot-v1/seed1", "Acrobot-v1", 1, [(50_000, -120.0)])
    fake_run(tmp_path / "runs/Pendulum-v1/seed1", "Pendulum-v1", 1, [(30_000, -200.0)])  # no threshold: n/a
    out = tmp_path / "out"
    assert main(["--gather", str(tmp_path / "runs"), "--out", str(out), "--at", "30000"]) == 0
    checks = {r["task"]: r["check"] for r in read_rows(out / "results.csv") if r["check"]}
    assert checks == {"CartPole-v1": "PASS", "Acrobot-v1": "FAIL", "Pendulum-v1": "n/a"}
    printed = capsys.readouterr().out
    assert "PASS  CartPole-v1" in printed and "gymnasium's solved threshold 475" in printed
    md = (out / "results.md").read_text()
    assert "gymnasium's solved threshold (`reward_threshold`), -100" in md
    assert ("TD-MPC2 mean at 30,000 env steps; a task without a published TD-MPC2 curve: gymnasium's solved "
            "threshold (notes at the end).") in md  # the header's bar is not 90% of a curve for these
