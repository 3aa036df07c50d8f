"""The environment layer: task names, wrappers, terminations vs truncations, vector envs, RNG state."""

from __future__ import annotations

import functools
import json
import importlib.util
import io
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env
from gymnasium.utils.passive_env_checker import env_render_passive_checker

from tdmpc.envs import TaskError, UnknownTaskError, env_rng_state, make_env, make_vector_env, set_env_rng_state

from helpers import import_or_skip, one_line_error, read_csv, run_train, skip_unless_ci, tiny_json

HAS_DMC = importlib.util.find_spec("dm_control") is not None
NEEDS_DMC = pytest.mark.skipif(not HAS_DMC, reason="dm_control is not installed (pip install -e '.[dmc]')")


class DictObsEnv(gym.Env):
    """A user env: Dict observations, float64 actions in [0, 4], no time limit, a success flag."""

    observation_space = spaces.Dict(
        {"a": spaces.Box(-1, 1, (2,), np.float64), "b": spaces.Box(-1, 1, (3,), np.float64)}
    )
    action_space = spaces.Box(0.0, 4.0, (2,), np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.last_action = action
        self.t += 1
        return self.observation_space.sample(), 1.0, False, False, {"success": self.t == 1}


gym.register("TdmpcTestDictObs-v0", entry_point=DictObsEnv)


def record_actions(env: gym.Env) -> list[np.ndarray]:
    """Actions as they reach the unwrapped env."""
    seen, step = [], env.unwrapped.step
    env.unwrapped.step = lambda action: (seen.append(np.array(action)), step(action))[1]
    return seen


@functools.cache
def no_rendering_reason() -> str | None:
    """None if MuJoCo can render here, else why not."""
    env, _ = make_env("Hopper-v5", render_size=(8, 8), render=True)
    env.reset()
    try:
        env.render()
    except Exception as e:  # noqa: BLE001 - any GL failure means: skip
        return f"no working MuJoCo GL backend (MUJOCO_GL={os.environ.get('MUJOCO_GL')}): {type(e).__name__}: {e}"
    finally:
        env.close()
    return None


# --- gymnasium API compliance ---------------------------------------------------------------


# check_env's render check would also build the env with render_mode="human", which needs a
# display, so gymnasium tasks check their rgb_array render() separately.


def test_check_env_pendulum():
    check_env(make_env("Pendulum-v1", seed=0)[0], skip_render_check=True)


def test_check_env_mujoco():
    env, _ = make_env("HalfCheetah-v5", seed=0, render_size=(48, 64), render=True)
    check_env(env, skip_render_check=True)
    env.close()


def test_mujoco_renders_at_the_asked_size():
    """Its own test, so that a machine without a GL backend shows a skip (a failure in CI) instead of passing."""
    if (reason := no_rendering_reason()) is not None:
        skip_unless_ci(reason)
    env, _ = make_env("HalfCheetah-v5", seed=0, render_size=(48, 64), render=True)
    env.reset()
    env_render_passive_checker(env)
    assert env.render().shape == (48, 64, 3)
    env.close()


def test_check_env_dmc():
    import_or_skip("dm_control")
    env, _ = make_env("cartpole-swingup", seed=0, render_size=(48, 64), render=True)
    check_env(env, skip_render_check=True)


def test_check_env_dmc_render():
    import_or_skip("dm_control")
    if (reason := no_rendering_reason()) is not None:
        skip_unless_ci(reason)
    env, _ = make_env("cartpole-swingup", seed=0, render_size=(48, 64), render=True)
    check_env(env)


# --- task names and specs ---------------------------------------------------------------------


def test_dmc_spec():
    import_or_skip("dm_control")
    env, spec = make_env("walker-walk", seed=0)
    assert spec.obs_shape == (24,) and spec.action_dim == 6
    assert (spec.episode_length, spec.action_repeat, spec.episodic) == (500, 2, False)
    assert env.observation_space.dtype == np.float32 and env.reset()[0].dtype == np.float32
    assert env.action_space == spaces.Box(-1.0, 1.0, (6,), np.float32)


def test_making_cheetah_logs_no_settotalmass_deprecation_but_other_absl_warnings_pass(caplog):
    """MuJoCo 3.3+ warns about the suite XML's 'settotalmass' at every env made; we drop that one line only."""
    import_or_skip("dm_control")
    import logging

    with caplog.at_level(logging.WARNING, logger="absl"):
        make_env("cheetah-run", seed=0)
        logging.getLogger("absl").warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["another warning"]


def test_cup_catch_is_ball_in_cup():
    import_or_skip("dm_control")
    from tdmpc.envs.dmcontrol import parse_task

    assert parse_task("cup-catch") == ("ball_in_cup", "catch")
    assert parse_task("finger-turn-easy") == parse_task("finger-turn_easy") == ("finger", "turn_easy")
    env, spec = make_env("cup-catch")
    assert type(env.unwrapped._env.task).__module__ == "dm_control.suite.ball_in_cup"
    assert spec.obs_shape == (8,) and spec.action_dim == 2


def test_gym_specs():
    assert make_env("Pendulum-v1")[1].episodic is False
    assert make_env("HalfCheetah-v5")[1].episodic is False
    _, spec = make_env("Hopper-v5")
    assert (spec.obs_shape, spec.action_dim, spec.episode_length) == ((11,), 3, 1000)
    assert (spec.action_repeat, spec.episodic) == (1, True)
    assert make_env("MountainCarContinuous-v0")[1].episodic is True
    assert make_env("Hopper-v5", action_repeat=2)[1].episode_length == 500


def test_a_built_in_env_object_terminates_as_its_name_would():
    """gym.make("CartPole-v1") passed as an object trained without a termination head (episodic off)."""
    assert make_env(gym.make("CartPole-v1"))[1].episodic is True
    assert make_env(gym.make("Pendulum-v1"))[1].episodic is False
    declared = gym.make("CartPole-v1")
    declared.unwrapped.metadata = {**declared.unwrapped.metadata, "episodic": False}
    assert make_env(declared)[1].episodic is False  # what the env declares wins


@pytest.mark.parametrize(
    ("task", "says"),
    [
        pytest.param("walkr-walk", "domain-task", marks=NEEDS_DMC),  # without dm_control: "pip install"
        ("NotAnEnv-v9", "domain-task"),
        ("Pendulum", "domain-task"),
        ("no_such_module:Foo-v0", "cannot import module"),
    ],
)
def test_unknown_task_is_one_line(task, says):
    with pytest.raises(UnknownTaskError, match=says) as err:
        make_env(task)
    assert "\n" not in str(err.value)


def test_unknown_task_suggests_close_match():
    with pytest.raises(UnknownTaskError, match="did you mean 'Pendulum-v1'"):
        make_vector_env("Pendulum", 2, seed=0)
    with pytest.raises(UnknownTaskError) as err:  # a name like no task's gets no suggestion (it got Hopper-v5)
        make_env("Nope-v0")
    assert "did you mean" not in str(err.value)
    if HAS_DMC:
        with pytest.raises(UnknownTaskError, match="did you mean 'walker-walk'"):
            make_env("walkr-walk")


def test_discrete_actions_are_integers():
    env, spec = make_env("CartPole-v1")
    assert spec.discrete and spec.action_dim == 2 and env.action_space == gym.spaces.Discrete(2)


def test_missing_dm_control_says_how_to_install(monkeypatch):
    find_spec = importlib.util.find_spec
    hide_dm_control = lambda name, *args: None if name == "dm_control" else find_spec(name, *args)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", hide_dm_control)
    with pytest.raises(TaskError, match=r'pip install -e "\.\[dmc\]"') as err:
        make_env("walker-walk")
    assert "\n" not in str(err.value)


def test_rgb_needs_dmc():
    with pytest.raises(TaskError, match="DMC tasks only"):
        make_env("Pendulum-v1", obs="rgb")


def test_module_prefixed_gym_id():
    env, spec = make_env("gymnasium.envs.classic_control:Pendulum-v1")
    assert spec.obs_shape == (3,) and spec.episode_length == 200


# --- actions, rewards, episode ends -------------------------------------------------------------


def test_actions_are_rescaled_to_env_bounds():
    env, _ = make_env("Pendulum-v1", seed=0)  # bounds [-2, 2]
    seen = record_actions(env)
    env.reset()
    for action in (1.0, -1.0, 0.0):
        env.step(np.array([action], np.float32))
    np.testing.assert_allclose(np.concatenate(seen), [2.0, -2.0, 0.0])


def test_user_env_dict_obs_float64_actions_success_and_repeat():
    env, spec = make_env("TdmpcTestDictObs-v0", seed=0, action_repeat=2)
    assert spec.obs_shape == (5,) and spec.action_dim == 2
    assert spec.episode_length == 500  # no registered limit -> 1000 env steps
    assert (env.action_space.low == -1).all() and (env.action_space.high == 1).all()  # gymnasium's RescaleAction
    obs, _ = env.reset()
    assert obs.shape == (5,) and obs.dtype == np.float32
    _, reward, _, _, info = env.step(np.ones(2, np.float32))
    assert reward == 2.0  # summed over the 2 repeated steps
    assert info["success"] is True  # the first repeated step succeeded, the last did not
    assert env.unwrapped.last_action.dtype == np.float64
    np.testing.assert_allclose(env.unwrapped.last_action, [4.0, 4.0])
    for _ in range(2, spec.episode_length + 1):
        _, _, terminated, truncated, _ = env.step(np.zeros(2, np.float32))
    assert truncated and not terminated


@pytest.mark.parametrize(("action_repeat", "episode_length"), [(None, 500), (3, 333)])
def test_dmc_episode_truncates_after_episode_length(action_repeat, episode_length):
    import_or_skip("dm_control")
    env, spec = make_env("cartpole-swingup", seed=0, action_repeat=action_repeat)
    assert spec.episode_length == episode_length
    env.reset()
    action = np.zeros(spec.action_dim, np.float32)
    for t in range(1, episode_length + 1):
        _, _, terminated, truncated, _ = env.step(action)
        assert not terminated
        assert truncated == (t == episode_length)


def test_gym_termination_and_truncation_are_kept_apart():
    env, _ = make_env("Hopper-v5", seed=0)
    env.reset()
    for _ in range(1000):  # a random policy makes the hopper fall within a few dozen steps
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert terminated and not truncated

    env, spec = make_env("Pendulum-v1", seed=0)
    env.reset()
    for t in range(1, spec.episode_length + 1):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not terminated and truncated == (t == spec.episode_length)


# --- vector envs --------------------------------------------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True])
def test_vector_env_same_step_autoreset(asynchronous):
    """Sub-envs match single envs seeded seed + i, resetting in the step that ends them."""
    envs, _ = make_vector_env("Hopper-v5", 2, seed=10, asynchronous=asynchronous)
    singles = [make_env("Hopper-v5", seed=10 + i)[0] for i in range(2)]
    try:
        assert envs.action_space == spaces.Box(-1.0, 1.0, (2, 3), np.float32)
        obs, _ = envs.reset()
        assert obs.dtype == np.float32
        np.testing.assert_array_equal(obs, [env.reset()[0] for env in singles])
        episodes_ended = 0
        for _ in range(150):  # random actions topple the hopper every few dozen steps
            actions = envs.action_space.sample()
            obs, _, terminated, truncated, infos = envs.step(actions)
            for i, (env, action) in enumerate(zip(singles, actions)):
                expected, _, single_terminated, single_truncated, _ = env.step(action)
                assert (terminated[i], truncated[i]) == (single_terminated, single_truncated)
                ended = single_terminated or single_truncated
                assert bool(infos.get("_final_obs", np.zeros(2, bool))[i]) == ended
                if ended:
                    episodes_ended += 1
                    np.testing.assert_array_equal(infos["final_obs"][i], expected)
                    expected, _ = env.reset()  # the returned obs is the next episode's first
                np.testing.assert_array_equal(obs[i], expected)
        assert episodes_ended >= 2
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("task", "asynchronous"),
    [
        pytest.param("cartpole-swingup", False, marks=NEEDS_DMC),  # np_random and the DMC task's RNG
        pytest.param("cartpole-swingup", True, marks=NEEDS_DMC),
        ("Hopper-v5", False),
        ("Hopper-v5", True),
    ],
)
def test_env_rng_state_round_trip(task, asynchronous):
    envs, _ = make_vector_env(task, 2, seed=3, asynchronous=asynchronous)
    try:
        envs.reset()
        envs.step(envs.action_space.sample())
        buffer = io.BytesIO()
        torch.save({"envs": env_rng_state(envs)}, buffer)
        buffer.seek(0)
        states = torch.load(buffer, weights_only=True)["envs"]

        first, _ = envs.reset()
        second, _ = envs.reset()
        assert not np.array_equal(first, second)  # resets draw from the RNGs
        set_env_rng_state(envs, states)
        np.testing.assert_array_equal(envs.reset()[0], first)
        np.testing.assert_array_equal(envs.reset()[0], second)
    finally:
        envs.close()


def test_rng_state_before_first_reset_keeps_the_seed():
    envs, _ = make_vector_env("Pendulum-v1", 2, seed=5)
    states = env_rng_state(envs)
    first, _ = envs.reset()
    set_env_rng_state(envs, states)
    np.testing.assert_array_equal(envs.reset()[0], first)


def test_a_vector_env_without_a_seed_is_seeded_afresh_as_make_env_is():
    """make_vector_env(task, n) without seed= (or seed=None) was a raw TypeError (None + i)."""
    a, b = (make_vector_env("Pendulum-v1", 2)[0] for _ in range(2))
    try:
        first = a.reset()[0]
        assert (first[0] != first[1]).any() and (b.reset()[0] != first).any()
    finally:
        a.close()
        b.close()


# --- pixels -------------------------------------------------------------------------------------


def test_rgb_observations_and_render():
    import_or_skip("dm_control")
    if (reason := no_rendering_reason()) is not None:
        skip_unless_ci(reason)
    env, spec = make_env("cartpole-swingup", seed=0, obs="rgb", render=True)
    assert spec.obs_shape == (9, 64, 64)
    obs, _ = env.reset()
    assert obs.shape == (9, 64, 64) and obs.dtype == np.uint8 and obs in env.observation_space
    np.testing.assert_array_equal(obs[:3], obs[6:])  # the first frame fills the stack
    for _ in range(5):
        previous = obs
        obs, *_ = env.step(np.ones(1, np.float32))
    np.testing.assert_array_equal(obs[:6], previous[3:])  # frames shift by one each step
    assert not np.array_equal(obs[6:], previous[6:])  # the cart moved
    frame = env.render()  # a DMC task whose frames are the observations renders at their size
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    np.testing.assert_array_equal(frame.transpose(2, 0, 1), obs[6:])  # the newest frame of the stack
    env.close()


def _without_libegl(tmp_path, **env) -> dict:
    """The environment of a subprocess whose PyOpenGL fails as it does on a machine without libEGL (the lent
    H200's image): importing OpenGL raises what PyOpenGL's EGL platform raised there."""
    fake = tmp_path / "fakegl" / "OpenGL"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise AttributeError(\"'NoneType' object has no attribute 'eglQueryString'\")")
    base = {k: v for k, v in os.environ.items() if k != "MUJOCO_GL"}
    return {**base, "PYTHONPATH": os.pathsep.join([str(fake.parent), base.get("PYTHONPATH", "")]), **env}


@NEEDS_DMC
def test_state_tasks_run_without_egl_when_egl_was_our_default(tmp_path):
    r = subprocess.run([sys.executable, "-c", "from tdmpc.envs import make_env; e, s = make_env('walker-walk', seed=0); "
                        "print(e.reset(seed=0)[0].shape, e.step(e.action_space.sample())[1])"],
                       capture_output=True, text=True, timeout=120, env=_without_libegl(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("(24,)")
    assert r.stderr.count("EGL rendering is not available here") == 1 and "Traceback" not in r.stderr


@NEEDS_DMC
@pytest.mark.parametrize("gl", ["egl", "osmesa"])
@pytest.mark.parametrize("make", ["'walker-walk', obs='rgb'", "'HalfCheetah-v5', render_size=(64, 64), render=True"])
def test_a_task_renders_and_then_torch_loads_triton(tmp_path, gl, make):
    """With Triton installed (the dev extra), its library segfaulted loading after Mesa's renderer: a DMC training
    run died as it built its optimiser (dynamo imports Triton), and so did a gymnasium MuJoCo env's frames. The env
    package loads Triton first."""
    import importlib.util

    assert importlib.util.find_spec("triton") is not None, "the dev extra installs triton"
    code = (f"from tdmpc.envs import make_env; e, s = make_env({make}, seed=0); e.reset(seed=0); "
            "import torch._dynamo, triton; print(e.render().shape); e.close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**{k: v for k, v in os.environ.items() if k != "PYOPENGL_PLATFORM"}, "MUJOCO_GL": gl})
    assert r.returncode == 0 and r.stdout.startswith("(64, 64, 3)"), (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]  # OSMesa's contexts, freed at exit, printed one each


@NEEDS_DMC
def test_a_renderer_the_user_chose_that_cannot_load_is_a_one_line_error(tmp_path):
    r = run_train("--task", "walker-walk", "--steps", "1000", "--dry-run", timeout=120,
                  env=_without_libegl(tmp_path, MUJOCO_GL="egl"), cwd=tmp_path)
    assert "MUJOCO_GL=egl" in one_line_error(r) and "MUJOCO_GL=disable" in one_line_error(r)


def test_a_simulator_that_is_not_installed_is_one_line_naming_the_extra(tmp_path):
    """LunarLander-v3 without Box2D (an import that fails, as on a machine without the extra): gymnasium's
    DependencyNotInstalled, whose advice builds box2d-py with swig, becomes one line naming tdmpc's extra."""
    (tmp_path / "Box2D.py").write_text("raise ImportError('No module named Box2D')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-m", "tdmpc.train", "--task", "LunarLander-v3", "--steps", "10",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120)
    line = one_line_error(r)
    assert "LunarLander-v3 needs a package that is not installed" in line and 'pip install "tdmpc[box2d]"' in line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a run or more of its own: the default suite keeps under 8 minutes (docs/testing.md)
def test_lunarlander_trains_and_evaluates_with_box2d_installed(tmp_path):
    """The Box2D extra installed (CI installs it): LunarLander-v3's 8-dim observations and 4 discrete actions train
    (random seeding, updates, planning over the discrete default horizon) and evaluate to eval.csv."""
    import_or_skip("Box2D", 'Box2D is not installed (pip install "tdmpc[box2d]")')
    r = run_train("--cfg", str(tiny_json(tmp_path, task="LunarLander-v3", steps=300, seed_steps=200, eval_freq=300,
                                         save_every=300, eval_episodes=1)), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "eval.csv")
    assert [int(float(row["env_step"])) for row in rows] == [0, 300]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["plan_horizon"] == 1


@NEEDS_DMC
def test_a_renderer_name_dm_control_does_not_know_is_a_one_line_error(tmp_path):
    r = run_train("--task", "walker-walk", "--steps", "1000", "--dry-run", timeout=120, cwd=tmp_path,
                  env={**os.environ, "MUJOCO_GL": "bogus"})  # dm_control's RuntimeError was a traceback, exit 1
    assert "MUJOCO_GL='bogus' names no renderer" in one_line_error(r)
