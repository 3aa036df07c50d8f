"""Task names: which family a name belongs to, checked before anything heavy is built.

Two families share one namespace:
- DeepMind Control, named ``domain-task`` as in the reference TD-MPC2 (``walker-walk``,
  ``cup-catch``, and its custom tasks such as ``cup-spin``); no version suffix.
- gymnasium ids (``Pendulum-v1``, ``HalfCheetah-v5``, ``my_module:MyEnv-v0``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
from dataclasses import dataclass

import gymnasium as gym

from tdmpc.errors import TaskError
from tdmpc.tasks.sets import gymnasium_form

# gymnasium's own tasks whose step() never returns terminated=True (read off gymnasium 1.4's
# source): they only end at their time limit, so a termination head would learn nothing. Every
# other gymnasium task can terminate; a user's env says so itself (metadata["episodic"]).
NEVER_TERMINATE = frozenset({"Pendulum", "HalfCheetah", "Swimmer", "Reacher", "Pusher", "HumanoidStandup"})
# Every dm_control suite task ends after 1000 control steps (lqr, which has no limit, gets one),
# and so does every custom task of dmc_custom.
DMC_EPISODE_STEPS = 1000
# Used for gymnasium tasks registered without max_episode_steps.
DEFAULT_EPISODE_STEPS = 1000

_HOW_TASKS_ARE_NAMED = (
    "use a DMC name like walker-walk, cheetah-run, cup-catch (domain-task), or a registered "
    "gymnasium id like Pendulum-v1, HalfCheetah-v5 or my_module:MyEnv-v0"
)
# The task name a run records for a user's env object or factory (custom:ClassName): no name rebuilds it.
CUSTOM_PREFIX = "custom:"


def custom_task_name(env: gym.Env | gym.vector.VectorEnv) -> str:
    return f"{CUSTOM_PREFIX}{type(env.unwrapped).__name__}"


class UnknownTaskError(TaskError):
    """A task name that is neither a DMC ``domain-task`` nor a registered gymnasium id."""


@dataclass(frozen=True)
class Task:
    """What building a task needs to know, found from its name alone."""

    name: str  # as the user wrote it; for gymnasium, what gymnasium.make gets
    dmc: tuple[str, str] | None  # (domain, task) for DeepMind Control, None for gymnasium
    env_steps: int  # environment steps per episode, before action repeat
    default_action_repeat: int
    episodic: bool | None  # whether an episode can end in a true terminal state; None: as the built env declares


def episode_length(task: str, action_repeat: int | None = None) -> int:
    """Agent steps per episode of `task` with this action repeat (None: the task's default)."""
    t = resolve_task(task)
    return t.env_steps // (action_repeat or t.default_action_repeat)


def resolve_task(name: str) -> Task:
    """Find ``name``'s family, or raise a one-line :class:`UnknownTaskError`."""
    if name.startswith(CUSTOM_PREFIX):
        raise UnknownTaskError(f"task {name!r} is a run's name for an env object it was given, which no name can "
                               f"rebuild: pass --task with the env's registered id (or module:id), or from Python "
                               f"give the env again (tdmpc.fit(env=..., resume=True), tdmpc.run_episodes(agent, env, "
                               f"...))")
    if ":" in name or name in gym.registry:
        return _gym_task(name)
    if "-" in name and not gymnasium_form(name):
        task = _dmc_task(name)
        if task is not None:
            return task
    raise UnknownTaskError(_unknown(name))


def _gym_task(name: str) -> Task:
    module, _, env_id = name.rpartition(":")
    if module:  # gymnasium.make would import it too; doing it here makes a typo a clear error
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UnknownTaskError(f"unknown task {name!r}: cannot import module {module!r} ({e})") from None
    spec = gym.registry.get(env_id)
    if spec is None:
        raise UnknownTaskError(_unknown(name))
    builtin = isinstance(spec.entry_point, str) and spec.entry_point.startswith("gymnasium.envs.")
    return Task(
        name=name,
        dmc=None,
        env_steps=spec.max_episode_steps or DEFAULT_EPISODE_STEPS,
        default_action_repeat=1,
        episodic=spec.name not in NEVER_TERMINATE if builtin else None,
    )


def _dmc_task(name: str) -> Task | None:
    if importlib.util.find_spec("dm_control") is None:
        raise TaskError(
            f"task {name!r} looks like a DeepMind Control task, which needs dm_control: "
            'pip install -e ".[dmc]"'
        )
    from tdmpc.envs import dmcontrol  # imports dm_control, an optional extra

    domain_task = dmcontrol.parse_task(name)
    if domain_task is None:
        return None
    return Task(name=name, dmc=domain_task, env_steps=DMC_EPISODE_STEPS, default_action_repeat=2, episodic=False)


def _unknown(name: str) -> str:
    candidates = list(gym.registry)
    if importlib.util.find_spec("dm_control") is not None:
        from tdmpc.envs import dmcontrol

        candidates += dmcontrol.task_names()
    close = difflib.get_close_matches(name.rpartition(":")[2], candidates, n=1, cutoff=0.75)  # not Nope -> Hopper
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown task {name!r}: {_HOW_TASKS_ARE_NAMED}{hint}"
