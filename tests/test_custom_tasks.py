"""The reference TD-MPC2's 11 custom mt30 DMC tasks: names, specs, episodes, and what their rewards pay for."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import import_or_skip, skip_unless_ci

import_or_skip("dm_control")

from dm_control import suite  # noqa: E402
from test_envs import no_rendering_reason  # noqa: E402

from tdmpc.envs import UnknownTaskError, make_env, make_vector_env  # noqa: E402
from tdmpc.envs.dmcontrol import DMControlEnv, task_names  # noqa: E402
from tdmpc.envs.names import Task, resolve_task  # noqa: E402

# name: (dm_control (domain, task), obs dim, action dim); the dims are the reference's mt30 checkpoint's.
CUSTOM = {
    "walker-walk-backwards": (("walker", "walk_backwards"), 24, 6),
    "walker-run-backwards": (("walker", "run_backwards"), 24, 6),
    "cheetah-run-backwards": (("cheetah", "run_backwards"), 17, 6),
    "cheetah-run-front": (("cheetah", "run_front"), 17, 6),
    "cheetah-run-back": (("cheetah", "run_back"), 17, 6),
    "cheetah-jump": (("cheetah", "jump"), 17, 6),
    "hopper-hop-backwards": (("hopper", "hop_backwards"), 15, 4),
    "reacher-three-easy": (("reacher", "three_easy"), 8, 3),
    "reacher-three-hard": (("reacher", "three_hard"), 8, 3),
    "cup-spin": (("ball_in_cup", "spin"), 8, 2),
    "pendulum-spin": (("pendulum", "spin"), 3, 1),
}
# Sparse under random actions: hopping backwards needs standing first, reaching needs the target.
SPARSE = {"hopper-hop-backwards", "reacher-three-easy", "reacher-three-hard"}


def dm_env(task: str, seed: int = 0):
    """The dm_control environment behind ``make_env(task)``, after a reset."""
    env = DMControlEnv(*CUSTOM[task][0], seed=seed)
    env.reset()
    return env._env


def reward_at(env, qpos: dict[str, float] | None = None, qvel: dict[str, float] | None = None) -> float:
    """The task's reward in the model's default pose, with the named joints set."""
    physics = env.physics
    with physics.reset_context():
        for joint, value in (qpos or {}).items():
            physics.named.data.qpos[joint] = value
        for joint, value in (qvel or {}).items():
            physics.named.data.qvel[joint] = value
    return float(env.task.get_reward(physics))


# --- names, specs, episodes ----------------------------------------------------------------------


@pytest.mark.parametrize("task", CUSTOM)
def test_resolves_like_a_suite_task(task):
    expected = Task(task, CUSTOM[task][0], env_steps=1000, default_action_repeat=2, episodic=False)
    assert resolve_task(task) == expected
    assert task in task_names()


def test_unknown_task_suggests_a_custom_one():
    with pytest.raises(UnknownTaskError, match="did you mean 'walker-walk-backwards'"):
        make_env("walker-walk-backward")


@pytest.mark.parametrize("task", CUSTOM)
def test_spec_and_seeding(task):
    _, obs_dim, action_dim = CUSTOM[task]
    env, spec = make_env(task, seed=3)
    assert (spec.obs_shape, spec.action_dim) == ((obs_dim,), action_dim)
    assert (spec.episode_length, spec.action_repeat, spec.episodic) == (500, 2, False)
    first, _ = env.reset()
    assert first.shape == (obs_dim,) and first.dtype == np.float32
    np.testing.assert_array_equal(make_env(task, seed=3)[0].reset()[0], first)
    assert not np.array_equal(make_env(task, seed=4)[0].reset()[0], first)


@pytest.mark.parametrize("task", CUSTOM)
def test_episode_of_random_actions(task):
    """1000 env steps like every suite task, each rewarded in [0, 1], and not all alike but for sparse tasks."""
    env = DMControlEnv(*CUSTOM[task][0], seed=0)
    env.reset()
    env.action_space.seed(0)
    rewards = []
    for t in range(1, 1001):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert np.all(np.isfinite(obs)) and not terminated and truncated == (t == 1000)
        rewards.append(reward)
    assert 0.0 <= min(rewards) and max(rewards) <= 1.0
    assert task in SPARSE or len(set(rewards)) > 1


def test_vector_env_with_action_repeat():
    envs, spec = make_vector_env("cup-spin", 2, seed=0)
    assert spec.obs_shape == (8,) and spec.action_dim == 2
    obs, _ = envs.reset()
    assert obs.shape == (2, 8) and not np.array_equal(obs[0], obs[1])
    for _ in range(50):
        obs, reward, terminated, truncated, _ = envs.step(envs.action_space.sample())
        assert np.all((0.0 <= reward) & (reward <= 2.0)) and not (terminated.any() or truncated.any())
    envs.close()


def test_renders():
    if (reason := no_rendering_reason()) is not None:
        skip_unless_ci(reason)
    env, spec = make_env("reacher-three-easy", seed=0, obs="rgb")
    obs, _ = env.reset()
    assert spec.obs_shape == obs.shape == (9, 64, 64) and obs.std() > 0
    env.close()


# --- models: the suite's, edited where the reference edits them ------------------------------


@pytest.mark.parametrize(("task", "floor"), [("walker-run-backwards", "floor"), ("cheetah-jump", "ground")])
def test_backwards_domains_have_a_longer_floor(task, floor):
    custom, stock = dm_env(task), suite.load(CUSTOM[task][0][0], "run")  # named views need their physics alive
    ours, theirs = custom.physics.named.model, stock.physics.named.model
    assert ours.geom_size[floor][0] == 2 * theirs.geom_size[floor][0]
    np.testing.assert_array_equal(ours.geom_pos[floor], theirs.geom_pos[floor])
    np.testing.assert_array_equal(ours.body_mass, theirs.body_mass)
    np.testing.assert_array_equal(ours.jnt_range, theirs.jnt_range)


def test_reacher_has_three_links():
    physics = dm_env("reacher-three-hard").physics
    model = physics.named.model
    assert [physics.model.joint(i).name for i in range(physics.model.njnt)] == ["shoulder0", "shoulder1", "wrist"]
    assert [physics.model.actuator(i).name for i in range(physics.model.nu)] == ["shoulder0", "shoulder1", "wrist"]
    np.testing.assert_allclose(np.rad2deg(model.jnt_range[["shoulder1", "wrist"]]), [[-80, 80], [-80, 80]])
    with physics.reset_context():
        physics.data.qpos[:] = 0
    np.testing.assert_allclose(physics.named.data.geom_xpos["finger", :2], [0.27, 0.0], atol=1e-12)


# --- rewards: what each task pays for (a flipped sign or swapped foot fails) --------------------


@pytest.mark.parametrize(("task", "speed"), [("walker-walk-backwards", 1.0), ("walker-run-backwards", 8.0)])
def test_walker_backwards_pays_for_going_backwards(task, speed):
    env = dm_env(task)  # default pose: standing upright
    backwards, still, forwards = (reward_at(env, qvel={"rootx": v}) for v in (-speed, 0.0, speed))
    assert backwards == pytest.approx(1.0) and forwards == still == pytest.approx(1 / 6)
    assert reward_at(env, qvel={"rootx": -speed / 2}) < backwards


def test_cheetah_run_backwards():
    env = dm_env("cheetah-run-backwards")
    rewards = [reward_at(env, qvel={"rootx": v}) for v in (-8.0, -4.0, 0.0, 8.0)]
    assert rewards == pytest.approx([1.0, 0.5, 0.0, 0.0])


@pytest.mark.parametrize(("task", "raised_end"), [("cheetah-run-front", "back"), ("cheetah-run-back", "front")])
def test_cheetah_runs_on_one_foot(task, raised_end):
    """Reared up with the other end's foot high, running forwards at 6 m/s."""
    env = dm_env(task)
    pitch = {"back": 1.0, "front": -1.0}  # rooty: +1 lifts the back foot 1 m, -1 the front foot 0.9 m
    raised, lowered = pitch[raised_end], -pitch[raised_end]
    forwards = reward_at(env, qpos={"rootz": 0.8, "rooty": raised}, qvel={"rootx": 6.0})
    assert forwards == pytest.approx(1.0)
    assert reward_at(env, qpos={"rootz": 0.8, "rooty": raised}, qvel={"rootx": -6.0}) < forwards / 5
    assert reward_at(env, qpos={"rootz": 0.8, "rooty": lowered}, qvel={"rootx": 6.0}) < 0.75 * forwards


def test_cheetah_jump_pays_for_height_in_place():
    env = dm_env("cheetah-jump")
    on_ground, in_air, in_air_moving = (
        reward_at(env, qpos={"rootz": z}, qvel={"rootx": v}) for z, v in ((0.0, 0.0), (1.0, 0.0), (1.0, 3.0))
    )
    assert in_air == pytest.approx(1.0) and on_ground < 0.25 and in_air_moving < 0.9


def test_hopper_hop_backwards():
    env = dm_env("hopper-hop-backwards")  # default pose: upright on its foot
    assert [reward_at(env, qvel={"rootx": v}) for v in (-1.0, -0.75, 0.0, 2.0)] == pytest.approx([1.0, 0.75, 0.0, 0.0])


def test_pendulum_spin_pays_for_speed_either_way():
    env = dm_env("pendulum-spin")
    rewards = [reward_at(env, qvel={"hinge": w}) for w in (-10.0, -4.5, 0.0, 4.5, 9.0)]
    assert rewards == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0])


def test_cup_spin_pays_for_the_ball_swinging_out_of_the_cup():
    env = dm_env("cup-spin")
    # ball_x / ball_z are offsets from (0, .2); the cup's target is at (0, .55), the ball fits in it.
    in_cup_fast = reward_at(env, qpos={"ball_z": 0.35}, qvel={"ball_x": 6.0})
    assert env.physics.in_target() == 1.0
    out_near, out_far = (reward_at(env, qpos={"ball_x": x, "ball_z": 0.2}) for x in (0.2, 0.3))
    out_near_fast = reward_at(env, qpos={"ball_x": 0.2, "ball_z": 0.2}, qvel={"ball_z": 6.0})
    assert in_cup_fast == 0.0 < out_near < out_far < out_near_fast


def test_cup_spin_mostly_starts_with_the_ball_in_the_cup():
    env = DMControlEnv("ball_in_cup", "spin", seed=0)
    in_cup = [(env.reset(), env._env.physics.in_target())[1] for _ in range(20)]
    assert sum(in_cup) >= 15  # 9 in 10 expected; a ball started anywhere lands in the cup 1 time in 50


@pytest.mark.parametrize(("task", "tolerance"), [("reacher-three-easy", 0.05), ("reacher-three-hard", 0.015)])
def test_reacher_three_pays_for_the_finger_on_the_target(task, tolerance):
    env = dm_env(task)
    target = env.physics.named.model.geom_pos["target"]
    radii = tolerance + env.physics.named.model.geom_size["finger", 0]
    rewards = []
    for distance in (0.0, radii * 0.9, radii * 1.1):
        target[:2] = [0.27 - distance, 0.0]  # the finger is at (.27, 0) with the arm straight
        rewards.append(reward_at(env))
    assert rewards == [1.0, 1.0, 0.0]
