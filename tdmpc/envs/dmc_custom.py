"""The 11 custom DeepMind Control tasks of the reference TD-MPC2's mt30 set, built from dm_control's own parts.

Each is a suite domain (its Physics, initial states and observations, so the observation dims of its
suite tasks) with the reference's reward. Where the reference changes a model, the suite's XML is
edited the same way here rather than shipped as a copy. Episodes are timed as in the suite's own
tasks of the domain: 1000 control steps. ``TASKS`` maps dm_control names to factories that take the
task's ``random`` (a seed, a RandomState or None), as the suite's factories do.
"""

from __future__ import annotations

import copy
import functools
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
from dm_control.rl import control
from dm_control.suite import ball_in_cup, base, cheetah, hopper, pendulum, reacher, walker
from dm_control.utils import rewards

Random = int | np.random.RandomState | None
ModelEdit = Callable[[ET.Element], None]
INF = float("inf")


# --- models ------------------------------------------------------------------------------------


def _find(element: ET.Element, path: str) -> ET.Element:
    """``element.find(path)``, which the suite's XML always has."""
    found = element.find(path)
    assert found is not None, path
    return found


def _longer_floor(root: ET.Element, name: str) -> None:
    """Double the floor's half-length about the same centre, as the reference does.

    The suite's floor is drawn from 2 m behind the start, so a walker or cheetah going backwards
    leaves it within seconds. MuJoCo planes collide everywhere: only rendered frames change.
    """
    floor = _find(root, f".//geom[@name='{name}']")
    half_length, *rest = floor.attrib["size"].split()
    floor.set("size", " ".join([str(2 * float(half_length)), *rest]))


_LINK = ".09"  # m: each of the three links (the suite's two: .12), so the reach grows from .24 to .27 m


def _three_link_arm(root: ET.Element) -> None:
    """The reference's three-link reacher from the suite's two-link one.

    The upper link is split in two, ``arm0`` (free shoulder, like the suite's) and ``arm1`` (a second
    shoulder joint limited to +-80 deg, with its own motor); the wrist is limited to +-80 deg (suite:
    +-160), and the finger sits one link length past the wrist.
    """
    arm = _find(root, ".//body[@name='arm']")
    hand = _find(arm, "body[@name='hand']")
    arm.remove(hand)
    arm1 = copy.deepcopy(arm)
    arm.append(arm1)
    arm1.append(hand)
    for i, link in enumerate((arm, arm1)):
        link.set("name", f"arm{i}")
        _find(link, "geom").attrib.update(name=f"arm{i}", fromto=f"0 0 0 {_LINK} 0 0")
        _find(link, "joint").set("name", f"shoulder{i}")
    arm1.set("pos", f"{_LINK} 0 0")
    _find(arm1, "joint").attrib.update(limited="true", range="-80 80")
    hand.set("pos", f"{_LINK} 0 0")
    _find(hand, "joint").set("range", "-80 80")
    _find(hand, "body[@name='finger']").set("pos", f"{_LINK} 0 0")
    motors = _find(root, "actuator")
    _find(motors, "motor[@name='shoulder']").attrib.update(name="shoulder0", joint="shoulder0")
    motors.insert(1, ET.Element("motor", name="shoulder1", joint="shoulder1"))


def _model(domain: ModuleType, edit: ModelEdit | None = None) -> tuple[str | bytes, dict[str, bytes]]:
    """The suite's XML of ``domain`` after ``edit`` (in place), with the suite's shared assets."""
    xml, assets = domain.get_model_and_assets()
    if edit is None:
        return xml, assets
    root = ET.fromstring(xml)
    edit(root)
    return ET.tostring(root, encoding="unicode"), assets


# --- rewards -----------------------------------------------------------------------------------


class _WalkerBackwards(walker.PlanarWalker):
    """The suite's walk/run reward mirrored: standing tall and upright while going backwards at ``move_speed``+."""

    def get_reward(self, physics: walker.Physics) -> float:
        standing = rewards.tolerance(
            physics.torso_height(), bounds=(walker._STAND_HEIGHT, INF), margin=walker._STAND_HEIGHT / 2
        )
        upright = (1 + physics.torso_upright()) / 2
        backwards = rewards.tolerance(
            physics.horizontal_velocity(),
            bounds=(-INF, -self._move_speed),
            margin=self._move_speed / 2,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return (3 * standing + upright) / 4 * (5 * backwards + 1) / 6


_CHEETAH_UP = 1.2  # m: the height of a body part reared up


def _cheetah_up(height: float) -> float:
    return rewards.tolerance(height, bounds=(_CHEETAH_UP, INF), margin=_CHEETAH_UP / 2)


def _cheetah_run_backwards(physics: cheetah.Physics) -> float:
    """Linear in speed from 0 when still to 1 at 8 m/s backwards (forwards, the suite's run asks 10)."""
    speed = cheetah._RUN_SPEED * 0.8
    return rewards.tolerance(physics.speed(), bounds=(-INF, -speed), margin=speed, value_at_margin=0, sigmoid="linear")


def _cheetah_run_on_one_foot(physics: cheetah.Physics, raised: str) -> float:
    """Reared up on one foot, ``raised`` (weight 3) and torso (weight 2) high, and running forwards at 6 m/s+.

    Running only counts when reared up: ``up * (5 * fast + 1) / 6``.
    """
    xpos = physics.named.data.xpos
    up = (3 * _cheetah_up(xpos[raised, "z"]) + 2 * _cheetah_up(xpos["torso", "z"])) / 5
    speed = cheetah._RUN_SPEED * 0.6
    fast = rewards.tolerance(physics.speed(), bounds=(speed, INF), margin=speed, value_at_margin=0, sigmoid="linear")
    return up * (5 * fast + 1) / 6


def _cheetah_jump(physics: cheetah.Physics) -> float:
    """The mean of standing on the front foot and on the back foot, in place (under 0.5 m/s either way).

    Each pays for its raised foot and the torso being 1.2 m high on average; both at once ask for the
    whole body high: a jump.
    """
    xpos = physics.named.data.xpos
    still = rewards.tolerance(physics.speed(), bounds=(-0.5, 0.5), margin=0.5, value_at_margin=0, sigmoid="linear")
    stand_front, stand_back = (
        (5 * _cheetah_up((xpos["torso", "z"] + xpos[raised, "z"]) / 2) + still) / 6 for raised in ("bfoot", "ffoot")
    )
    return (stand_front + stand_back) / 2


class _Cheetah(cheetah.Cheetah):
    """The suite's cheetah, rewarded by ``reward``: the four custom cheetah tasks differ in that alone."""

    def __init__(self, reward: Callable[[cheetah.Physics], float], random: Random = None):
        super().__init__(random=random)
        self._reward = reward

    def get_reward(self, physics: cheetah.Physics) -> float:
        return self._reward(physics)


class _HopBackwards(hopper.Hopper):
    """The suite's hop reward mirrored, at half the speed: torso above the foot, hopping backwards at 1 m/s+."""

    def __init__(self, random: Random = None):
        super().__init__(hopping=True, random=random)

    def get_reward(self, physics: hopper.Physics) -> float:
        standing = rewards.tolerance(physics.height(), (hopper._STAND_HEIGHT, 2))
        backwards = rewards.tolerance(
            physics.speed(),
            bounds=(-INF, -hopper._HOP_SPEED / 2),
            margin=hopper._HOP_SPEED / 4,
            value_at_margin=0.5,
            sigmoid="linear",
        )
        return standing * backwards


class _CupSpin(ball_in_cup.BallInCup):
    """Swinging the ball round the cup: out of it, 0.5 m+ from its target and at 6 m/s+ (speed weighs double).

    Nine episodes in ten (or more) start with the ball in the cup, where the suite's catch starts it
    anywhere, so the task begins by throwing it out.
    """

    def initialize_episode(self, physics: ball_in_cup.Physics) -> None:
        may_start_out = self.random.uniform() < 0.1
        while True:  # a random ball position that penetrates nothing (and is in the cup, mostly)
            physics.named.data.qpos["ball_x"] = self.random.uniform(-0.2, 0.2)
            physics.named.data.qpos["ball_z"] = self.random.uniform(0.2, 0.5)
            physics.after_reset()
            if physics.data.ncon == 0 and (may_start_out or physics.in_target()):
                break
        base.Task.initialize_episode(self, physics)  # the suite's BallInCup would draw its own position

    def get_reward(self, physics: ball_in_cup.Physics) -> float:
        distance = np.linalg.norm(physics.ball_to_target())
        far = rewards.tolerance(distance, bounds=(0.5, INF), margin=0.25, value_at_margin=0.5, sigmoid="linear")
        speed = np.linalg.norm(physics.named.data.qvel[["ball_x", "ball_z"]])
        fast = rewards.tolerance(speed, bounds=(6.0, INF), margin=3.0, value_at_margin=0.5, sigmoid="linear")
        return (1 - physics.in_target()) * (far + 2 * fast) / 3


class _PendulumSpin(pendulum.SwingUp):
    """Spinning the pole either way at 9 rad/s+, from the swingup task's random initial angles."""

    def get_reward(self, physics: pendulum.Physics) -> float:
        speed = np.linalg.norm(physics.angular_velocity())
        return rewards.tolerance(speed, bounds=(9.0, INF), margin=4.5, value_at_margin=0.5, sigmoid="linear")


# --- tasks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CustomTask:
    """A suite domain's Physics on its (optionally edited) XML, with ``task``; timed as the suite's own tasks."""

    domain: ModuleType
    task: Callable[[Random], base.Task]
    edit: ModelEdit | None = None

    def __call__(self, random: Random = None) -> control.Environment:
        physics = self.domain.Physics.from_xml_string(*_model(self.domain, self.edit))
        # The suite's own time limit and control timestep of the domain (none: one physics step), 1000 steps each.
        control_timestep = getattr(self.domain, "_CONTROL_TIMESTEP", None)
        return control.Environment(
            physics, self.task(random), time_limit=self.domain._DEFAULT_TIME_LIMIT, control_timestep=control_timestep
        )


def _cheetah_rewarded_by(reward: Callable[[cheetah.Physics], float]) -> CustomTask:
    return CustomTask(cheetah, functools.partial(_Cheetah, reward), functools.partial(_longer_floor, name="ground"))


def _three_link_reacher(target_size: float) -> CustomTask:
    """The suite's reacher task (sparse reward, random target) with the three-link arm."""
    return CustomTask(reacher, functools.partial(reacher.Reacher, target_size), _three_link_arm)


def _walker_backwards(move_speed: float) -> CustomTask:
    return CustomTask(
        walker, functools.partial(_WalkerBackwards, move_speed), functools.partial(_longer_floor, name="floor")
    )


TASKS: dict[tuple[str, str], CustomTask] = {
    ("walker", "walk_backwards"): _walker_backwards(walker._WALK_SPEED),
    ("walker", "run_backwards"): _walker_backwards(walker._RUN_SPEED),
    ("cheetah", "run_backwards"): _cheetah_rewarded_by(_cheetah_run_backwards),
    ("cheetah", "run_front"): _cheetah_rewarded_by(functools.partial(_cheetah_run_on_one_foot, raised="bfoot")),
    ("cheetah", "run_back"): _cheetah_rewarded_by(functools.partial(_cheetah_run_on_one_foot, raised="ffoot")),
    ("cheetah", "jump"): _cheetah_rewarded_by(_cheetah_jump),
    ("hopper", "hop_backwards"): CustomTask(hopper, _HopBackwards),
    ("reacher", "three_easy"): _three_link_reacher(reacher._BIG_TARGET),
    ("reacher", "three_hard"): _three_link_reacher(reacher._SMALL_TARGET),
    ("ball_in_cup", "spin"): CustomTask(ball_in_cup, _CupSpin),
    ("pendulum", "spin"): CustomTask(pendulum, _PendulumSpin),
}
