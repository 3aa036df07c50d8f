"""Building envs: a task name (or an env factory) in, wrapped envs and their EnvSpec out (make_env, make_vector_env,
make_envs; make_task_envs for a multi-task run), and the checks and RNG state every env source shares."""

from __future__ import annotations

import copy
import functools
import multiprocessing
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import (AddRenderObservation, FlattenObservation, FrameStackObservation, TimeLimit,
                                TransformAction, TransformObservation)

from tdmpc.envs.names import DEFAULT_EPISODE_STEPS, Task, custom_task_name, resolve_task
from tdmpc.envs.wrappers import ActionRepeat, SeedAndRNGState
from tdmpc.errors import EXIT_BAD_INPUT, TaskError

OBS_TYPES = ("state", "rgb")
PIXELS, FRAME_STACK = 64, 3  # rgb observations: the last 3 frames of 64x64, channels first
RENDER_SIZE = (240, 320)  # (height, width) of rendered frames, for videos

# A task name (DMC 'domain-task' or a gymnasium id), a gymnasium env, or a zero-argument function making one.
EnvSource = Union[str, gym.Env, Callable[[], gym.Env]]

# What make_vector_env and make_task_envs build: gymnasium's two vector envs, which (unlike their base class,
# gym.vector.VectorEnv) have get_attr and set_attr.
VectorEnvs = Union[gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv]


@dataclass(frozen=True)
class EnvSpec:
    """What the agent needs to know about a task, with action repeat already applied."""

    task: str
    obs_shape: tuple[int, ...]  # (obs_dim,) for obs="state"; (3*frame_stack, 64, 64) uint8 for obs="rgb"
    action_dim: int  # continuous: the action vector's length; discrete: the number of actions, n
    episode_length: int  # agent steps per episode, after action repeat (DMC: 500)
    action_repeat: int  # DMC default 2, gymnasium tasks default 1
    episodic: bool  # whether the task can truly terminate (trains a termination head)
    discrete: bool = False  # Discrete(n) actions, taken as integers 0..n-1; else a vector in [-1, 1]^action_dim

    def random_actions(self, rng: np.random.Generator, num_envs: int) -> np.ndarray:
        """Uniform random actions for num_envs envs, as they take them (seeding): (num_envs,) integers or
        (num_envs, action_dim) float32."""
        if self.discrete:
            return rng.integers(0, self.action_dim, num_envs)
        return rng.uniform(-1, 1, (num_envs, self.action_dim)).astype(np.float32)


def make_env(
    env: EnvSource,
    *,
    seed: int | None = None,
    obs: str = "state",
    action_repeat: int | None = None,
    render: bool = False,
    render_size: tuple[int, int] = RENDER_SIZE,
) -> tuple[gym.Env, EnvSpec]:
    """Build one environment: ``env`` is a DMC ``domain-task``, a gymnasium id, or a factory.

    Actions are in [-1, 1]^A (mapped linearly onto the env's Box; a constant dimension held), or integers 0..n-1
    for a ``Discrete(n)`` action space (its ``start`` added); observations float32 vectors (``obs="state"``) or
    stacked uint8 frames (``obs="rgb"``, DMC only). Each episode truncates after
    ``spec.episode_length`` agent steps; ``terminated`` only marks true terminal states.
    ``seed`` takes effect at the first ``reset()``. ``render=True`` asks a gymnasium task for
    ``render_mode="rgb_array"`` (videos); ``render()`` then returns RGB uint8 frames of
    ``render_size`` (height, width) where the task supports it. DMC tasks always render.

    Bad input raises one-line errors: UnknownTaskError and ValueError (bad options) before
    anything is built, ImportError for a DMC task without dm_control, TaskError for a
    task whose action space is neither a Box nor a Discrete (known only once built).
    """
    task, repeat, first = _check(env, obs, action_repeat)
    built = _wrap(first or _make_named(task, obs, render, render_size), task, seed, obs, repeat)
    return built, _spec(task, built, built.observation_space, built.action_space, repeat)


def make_vector_env(
    env: EnvSource,
    num_envs: int,
    *,
    seed: int | None = None,
    obs: str = "state",
    action_repeat: int | None = None,
    asynchronous: bool = False,
    render: bool = False,
) -> tuple[VectorEnvs, EnvSpec]:
    """``num_envs`` copies of ``make_env(env)``; sub-env i is seeded with ``seed + i`` (None: each its own
    random seed, as ``make_env``).

    Sub-envs reset themselves in the step that ends their episode (``AutoresetMode.SAME_STEP``),
    so ``step()`` already returns the first observation of the next episode. For the ended
    ones, gymnasium 1.4 puts in ``infos``:

    - ``infos["final_obs"]``: object array (num_envs,), the last observation of sub-env i
      at the indices where ``infos["_final_obs"]`` (bool mask) is True, None elsewhere;
    - ``infos["final_info"]``: the ended episodes' step infos, batched the same way (each key
      with its own ``_key`` mask), and ``infos["_final_info"]``: the mask of ended sub-envs.

    ``terminated`` / ``truncated`` (returned by step) tell a true end from a time limit.
    An env object is sub-env 0 and deep copies of it are the others; a factory is called once per
    sub-env. ``asynchronous=True`` runs each sub-env in its own process (AsyncVectorEnv); a user env
    must then be named ``module:EnvName-v0`` (or be a picklable factory) so that those processes can
    build it.
    """
    task, repeat, first = _check(env, obs, action_repeat)
    seeds = [None if seed is None else seed + i for i in range(num_envs)]
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")

    def raw(i: int) -> gym.Env:
        if isinstance(env, str):
            return _make_named(task, obs, render, RENDER_SIZE)
        if i == 0 and first is not None:
            return first
        return copy.deepcopy(env) if isinstance(env, gym.Env) else env()

    if asynchronous:
        if isinstance(env, gym.Env):
            raise TaskError("an env object cannot be stepped in subprocesses; pass a picklable factory or use "
                            "vectorization 'sync'")
        if first is not None:
            first.close()
        first = None
        fns = [functools.partial(_wrap_built, env, task, seeds[i], obs, repeat, render) for i in range(num_envs)]
    else:
        fns = [functools.partial(lambda i: _wrap(raw(i), task, seeds[i], obs, repeat), i) for i in range(num_envs)]
    envs = _vector(fns, asynchronous, seed)
    if not asynchronous:
        assert isinstance(envs, gym.vector.SyncVectorEnv)
        first = envs.envs[0]
    if task.episodic is None and first is None:  # what an env declares is read off one built here
        first = _make_named(task, obs, False, RENDER_SIZE) if isinstance(env, str) else env()  # type: ignore[operator]
        first.close()
    return envs, _spec(task, first, envs.single_observation_space, envs.single_action_space, repeat)


def make_task_envs(
    tasks: Sequence[str],
    envs_per_task: int,
    *,
    seed: int,
    obs_dim: int,
    action_dim: int,
    action_repeat: int | None = None,
    asynchronous: bool = False,
    render: bool = False,
) -> tuple[VectorEnvs, list[EnvSpec]]:
    """Envs for the tasks of a multi-task model, in one vector env: envs_per_task of tasks[0] first, then
    of tasks[1], ... (sub-env i is seeded with seed + i). Every task's observations are zero-padded to
    obs_dim and it reads the first of its own action dims of an action_dim action (as the reference's
    multi-task wrapper). Returns the envs and each task's own (unpadded) spec."""
    checked = [_check(t, "state", action_repeat) for t in tasks]
    specs: list[EnvSpec] = []
    fns: list[Callable[[], gym.Env]] = []
    for t, (task, repeat, _) in zip(tasks, checked):
        probe = _wrap(_make_named(task, "state", False, RENDER_SIZE), task, None, "state", repeat)
        spec = _spec(task, probe, probe.observation_space, probe.action_space, repeat)
        probe.close()
        if spec.discrete:
            raise TaskError(f"task {t!r} has discrete actions; multi-task models are for continuous ones")
        if spec.obs_shape[0] > obs_dim or spec.action_dim > action_dim:
            raise TaskError(f"task {t!r} has obs dim {spec.obs_shape[0]} / action dim {spec.action_dim}, more than "
                            f"the model's {obs_dim} / {action_dim}")
        specs.append(spec)
        fns += [functools.partial(_wrap_built, t, task, seed + len(fns) + j, "state", repeat, render,
                                  (obs_dim, action_dim)) for j in range(envs_per_task)]
    return _vector(fns, asynchronous, seed), specs


def check_observations(env: gym.Env, spec: EnvSpec, step: bool = True) -> None:
    """A reset and (unless step=False: a user's own env object is left unstepped) one random step: an observation
    of another shape than the env's observation_space declares is a one-line TaskError naming both, before a run
    starts (in a vector env it fails deep inside gymnasium)."""
    got = [np.shape(env.reset()[0])] + ([np.shape(env.step(env.action_space.sample())[0])] if step else [])
    for what, shape in zip(("reset()", "step()"), got):
        if tuple(shape) != tuple(spec.obs_shape):
            raise TaskError(f"task {spec.task!r}: {what} returned an observation of shape {tuple(shape)}, but its "
                            f"observation_space declares {tuple(spec.obs_shape)}")


def make_envs(env: EnvSource | Sequence[str], envs_per_task: int, *, seed: int, obs: str = "state",
              action_repeat: int | None = None, pad_to: tuple[int, int] | None = None, asynchronous: bool = False,
              render: bool = False) -> VectorEnvs:
    """The vector env a model plays, whoever asks (training, evaluation, collection): for a single-task model
    make_vector_env(env); for a multi-task one (pad_to: the model's obs and action dims) make_task_envs over
    `env`, a task name or several, envs_per_task of each."""
    if pad_to is None:
        return make_vector_env(cast(EnvSource, env), envs_per_task, seed=seed, obs=obs, action_repeat=action_repeat,
                               asynchronous=asynchronous, render=render)[0]
    tasks = [env] if isinstance(env, str) else list(cast(Sequence[str], env))
    return make_task_envs(tasks, envs_per_task, seed=seed, obs_dim=pad_to[0], action_dim=pad_to[1],
                          action_repeat=action_repeat, asynchronous=asynchronous, render=render)[0]


GUARD_MAIN = ("a script that steps envs with vectorization 'async' keeps its calls under `if __name__ == "
              "'__main__':`, as each env's process imports it (Python's forkserver)")


def importing_main_in_a_worker() -> bool:
    """Whether this process is a multiprocessing worker importing the main script: a call that starts a run or
    envs there is the script's own, unguarded, and must not run again."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _vector(fns: Sequence[Callable[[], gym.Env]], asynchronous: bool, seed: int | None) -> VectorEnvs:
    autoreset = gym.vector.AutoresetMode.SAME_STEP
    if asynchronous:
        if importing_main_in_a_worker():  # the script's own process says what to do: this one ends quietly
            raise SystemExit(EXIT_BAD_INPUT)
        # Workers start from a fresh forkserver process, not from a fork of this one: a forked
        # EGL context (after any render here) hangs them, and forked torch threads can too.
        try:
            envs: VectorEnvs = gym.vector.AsyncVectorEnv(fns, autoreset_mode=autoreset, context="forkserver")
        except (EOFError, ConnectionError) as e:  # a worker died before it answered: its error is printed above
            raise TaskError(f"the env processes of vectorization 'async' exited as they started ({type(e).__name__}): "
                            f"{GUARD_MAIN} (an error of their own, if any, is printed above)") from None
    else:
        envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=autoreset)
    envs.action_space.seed(seed)
    return envs


def env_rng_state(envs: VectorEnvs) -> list[dict[str, Any]]:
    """Every sub-env's RNG state as plain data (safe for ``torch.load(weights_only=True)``)."""
    return list(envs.get_attr("rng_state"))


def set_env_rng_state(envs: VectorEnvs, states: list[dict[str, Any]]) -> None:
    """Restore what :func:`env_rng_state` returned: the next ``reset()`` draws the same initial states."""
    envs.set_attr("rng_state", list(states))


def _check(env: EnvSource, obs: str, action_repeat: int | None) -> tuple[Task, int, gym.Env | None]:
    """Validate everything that can be checked before building anything. A user's env (an object, or the
    first one a factory makes) is returned too, to be used rather than built again."""
    task, first = (resolve_task(env), None) if isinstance(env, str) else _user_env(env)
    if obs not in OBS_TYPES:
        raise ValueError(f"obs must be one of {OBS_TYPES}, got {obs!r}")
    if obs == "rgb" and task.dmc is None:
        raise TaskError(f"obs='rgb' is supported for DMC tasks only; use obs='state' for {task.name!r}")
    repeat = task.default_action_repeat if action_repeat is None else action_repeat
    if repeat < 1:
        raise ValueError(f"action_repeat must be at least 1, got {repeat}")
    return task, repeat, first


def _user_env(env: gym.Env | Callable[[], gym.Env]) -> tuple[Task, gym.Env]:
    """A user's env (or the first its factory makes): its episode length from its registered spec, if
    any; whether it terminates is what it declares (metadata["episodic"], read in _spec), else, for a gymnasium
    built-in (gym.make("CartPole-v1")), what the named task would say: without it such an env trained no
    termination head."""
    built = env if isinstance(env, gym.Env) else env() if callable(env) else None
    if not isinstance(built, gym.Env):
        what = type(env).__name__ if built is None else f"a function returning a {type(built).__name__}"
        raise TaskError(f"env must be a task name, a gymnasium env or a zero-argument function making one, "
                        f"not {what}")
    steps = built.spec.max_episode_steps if built.spec is not None else None
    episodic = None
    if built.spec is not None and built.spec.id in gym.registry and "episodic" not in built.unwrapped.metadata:
        episodic = resolve_task(built.spec.id).episodic
    return Task(name=custom_task_name(built), dmc=None, env_steps=steps or DEFAULT_EPISODE_STEPS,
                default_action_repeat=1, episodic=episodic), built


def _make_named(task: Task, obs: str, render: bool, render_size: tuple[int, int]) -> gym.Env:
    """The raw env of a named task (DMC renders at 64x64 when its frames are the observations)."""
    if task.dmc:
        return _dmc_env(task, (PIXELS, PIXELS) if obs == "rgb" else render_size)
    return _gym_env(task.name, render, render_size)


def _wrap_built(env: EnvSource, task: Task, seed: int | None, obs: str, repeat: int, render: bool,
                pad_to: tuple[int, int] | None = None) -> gym.Env:
    """A sub-env built where it runs (in this process, or an async worker)."""
    raw = _make_named(task, obs, render, RENDER_SIZE) if isinstance(env, str) else env()  # type: ignore[operator]
    return _wrap(raw, task, seed, obs, repeat, pad_to)


def _wrap(built: gym.Env, task: Task, seed: int | None, obs: str, repeat: int,
          pad_to: tuple[int, int] | None = None) -> gym.Env:
    """Our wrappers around a raw env, innermost first; pad_to: (obs dim, action dim) of a multi-task model."""
    pixels = obs == "rgb"
    problem = _action_space_problem(task.name, built.action_space)
    if problem:
        built.close()
        raise TaskError(problem)
    if not pixels:
        built = _flat_float32(built)
    built = _from_zero(built) if isinstance(built.action_space, spaces.Discrete) else _rescaled(built)
    if repeat > 1:
        built = ActionRepeat(built, repeat)
    # In agent steps, so that every episode is exactly episode_length long even when the
    # repeat does not divide the env's own limit.
    built = TimeLimit(built, task.env_steps // repeat)
    if pixels:
        built = _stacked_frames(built)
    if pad_to is not None:
        built = _padded(built, *pad_to)
    built = SeedAndRNGState(built, seed)
    built.action_space.seed(seed)
    return built


def _rescaled(env: gym.Env) -> gym.Env:
    """Actions in [-1, 1]^A mapped linearly onto the env's Box, clipped to it. A dimension whose low equals its high
    is held at that value: gymnasium's RescaleAction divides by zero there and sends NaN to the env."""
    space = env.action_space
    assert isinstance(space, spaces.Box)
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)

    def rescale(action: np.ndarray) -> np.ndarray:
        return np.clip(low + (high - low) * (np.asarray(action, np.float64) + 1) / 2, low, high).astype(space.dtype)

    return TransformAction(env, rescale, spaces.Box(-1.0, 1.0, space.shape, np.float32))


def _from_zero(env: gym.Env) -> gym.Env:
    """A Discrete(n, start) env takes the agent's 0..n-1 (its start added)."""
    space = env.action_space
    assert isinstance(space, spaces.Discrete)
    if space.start == 0:
        return env
    return TransformAction(env, lambda a: int(a) + int(space.start), spaces.Discrete(int(space.n)))


def _padded(env: gym.Env, obs_dim: int, action_dim: int) -> gym.Env:
    """Observations zero-padded at the end to obs_dim; of an action_dim action, the env reads its own first dims."""
    own_obs, own_action = env.observation_space.shape[0], env.action_space.shape[0]  # type: ignore[index]
    obs_space = spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    env = TransformObservation(env, lambda o: np.pad(o, (0, obs_dim - own_obs)), obs_space)
    action_space = spaces.Box(-1.0, 1.0, (action_dim,), np.float32)
    return TransformAction(env, lambda a: a[:own_action], action_space)


def _stacked_frames(env: gym.Env) -> gym.Env:
    """Observations: the last FRAME_STACK rendered frames, channels first, (3 x FRAME_STACK, 64, 64) uint8;
    after a reset the first frame fills the stack."""
    env = AddRenderObservation(env, render_only=True)
    chw = spaces.Box(0, 255, (3, PIXELS, PIXELS), np.uint8)
    env = TransformObservation(env, lambda frame: np.ascontiguousarray(frame.transpose(2, 0, 1)), chw)
    env = FrameStackObservation(env, FRAME_STACK, padding_type="reset")
    stacked = spaces.Box(0, 255, (3 * FRAME_STACK, PIXELS, PIXELS), np.uint8)
    return TransformObservation(env, lambda frames: np.asarray(frames).reshape(stacked.shape), stacked)


def _dmc_env(task: Task, render_size: tuple[int, int]) -> gym.Env:
    from tdmpc.envs.dmcontrol import DMControlEnv  # dm_control is an optional extra

    assert task.dmc is not None
    return DMControlEnv(*task.dmc, render_size=render_size)


def _gym_env(env_id: str, render: bool, render_size: tuple[int, int]) -> gym.Env:
    """gymnasium.make; with render, rgb_array rendering at render_size as far as the env's constructor allows. A
    simulator that is not installed (Box2D, MuJoCo, pygame) is a one-line TaskError saying what to install."""
    try:
        if not render:
            return gym.make(env_id)
        height, width = render_size
        try:
            return gym.make(env_id, render_mode="rgb_array", width=width, height=height)
        except TypeError:  # no render size (e.g. classic control)
            return gym.make(env_id, render_mode="rgb_array")
    except gym.error.DependencyNotInstalled as e:
        extra = next((x for key, x in MISSING_EXTRAS.items() if key in str(e)), None)
        how = f'pip install "tdmpc[{extra}]"' if extra else str(e).strip().splitlines()[0]
        raise TaskError(f"{env_id} needs a package that is not installed ({type(e).__name__}): {how}") from None


# What gymnasium's DependencyNotInstalled message names -> the extra of this package that installs it.
MISSING_EXTRAS = {"Box2D": "box2d", "pygame": "video"}


def _flat_float32(env: gym.Env) -> gym.Env:
    """State observations as one float32 vector (Dict, Tuple, float64 MuJoCo obs...)."""
    space = env.observation_space
    if not (isinstance(space, spaces.Box) and len(space.shape) == 1):
        env = FlattenObservation(env)
    space = env.observation_space
    if space.dtype != np.float32:  # DtypeObservation would warn about the bounds
        assert isinstance(space, spaces.Box)
        float32_space = spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32)
        env = TransformObservation(env, functools.partial(np.asarray, dtype=np.float32), float32_space)
    return env


def _action_space_problem(task: str, space: gym.Space) -> str | None:
    """Why the agent cannot act in ``space`` (a one-line message), or None if it can."""
    if isinstance(space, spaces.Discrete):
        return None if space.n >= 2 else f"task {task!r} has a Discrete action space of {space.n} action(s): nothing to choose"
    if not isinstance(space, spaces.Box):
        return (f"task {task!r} has a {type(space).__name__} action space ({space}); supported are Box (continuous) "
                f"and Discrete(n)")
    if len(space.shape) != 1 or not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        return f"task {task!r} needs a 1-D action Box with finite bounds, got {space}"
    if space.shape[0] == 0:
        return f"task {task!r} has an action Box of no dimensions ({space}): nothing to choose"
    return None


def _spec(task: Task, env: gym.Env | None, obs_space: gym.Space, action_space: gym.Space, repeat: int) -> EnvSpec:
    """The task's spec; whether it terminates comes from the task or, for user envs, from what the env
    declares (metadata["episodic"], default False: no termination head unless the env says it ends)."""
    episodic = task.episodic
    if episodic is None:
        episodic = bool(env is not None and env.unwrapped.metadata.get("episodic", False))
    assert obs_space.shape is not None and action_space.shape is not None
    discrete = isinstance(action_space, spaces.Discrete)
    return EnvSpec(task=task.name, obs_shape=tuple(obs_space.shape),
                   action_dim=int(action_space.n) if discrete else int(action_space.shape[0]),  # type: ignore[attr-defined]
                   episode_length=task.env_steps // repeat, action_repeat=repeat, episodic=episodic, discrete=discrete)
