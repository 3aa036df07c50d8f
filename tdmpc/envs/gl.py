"""Rendering backends: MuJoCo's OpenGL one, which dm_control picks when it is first imported, from MUJOCO_GL;
and pygame's (SDL's), for gymnasium's classic-control frames.

EGL renders headless (clusters, CI), so it is the default on Linux; an explicit MUJOCO_GL (osmesa, glfw) wins.
A machine without libEGL fails dm_control's import inside PyOpenGL; state
tasks need no renderer, so with the default they run without one, said once, and only pixels and videos fail.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from tdmpc.errors import TaskError

_DEFAULTED = False  # whether MUJOCO_GL=egl is ours (set_default) rather than the user's


def set_default() -> None:
    global _DEFAULTED
    if sys.platform == "linux" and "MUJOCO_GL" not in os.environ:
        os.environ["MUJOCO_GL"], _DEFAULTED = "egl", True
    # pygame (classic-control frames) never opens a window here: without a display SDL's probing printed
    # "error: XDG_RUNTIME_DIR is invalid" on every video that succeeded.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def load_triton_first() -> None:
    """Triton's compiler library segfaults when it loads after Mesa's (EGL's or OSMesa's llvmpipe, with its own
    LLVM), and torch loads it lazily wherever it is installed (the first optimiser or compile imports dynamo, which
    imports it): the training run of a DMC task died at building its agent, and a gymnasium MuJoCo env's frames
    (mujoco's EGL) did the same. Loaded first, both work."""
    if importlib.util.find_spec("triton") is not None:
        importlib.import_module("triton")


def import_suite() -> ModuleType:
    """dm_control.suite, falling back to no renderer when our default EGL cannot load; a backend the user chose
    that cannot load is a one-line error."""
    try:
        from dm_control import suite
        return suite
    except RuntimeError as e:  # dm_control's own check of the name, a traceback otherwise
        if "MUJOCO_GL" not in str(e):
            raise
        raise TaskError(f"MUJOCO_GL={os.environ.get('MUJOCO_GL')!r} names no renderer dm_control knows: use egl, "
                        f"osmesa or glfw, or disable for state tasks, which need no renderer") from None
    except (ImportError, AttributeError, OSError) as e:
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        chosen = os.environ.get("MUJOCO_GL")
        if not (_DEFAULTED and chosen == "egl"):
            raise TaskError(f"dm_control could not load its MUJOCO_GL={chosen} renderer ({why}); install it (EGL: "
                            f"libegl1), choose another (MUJOCO_GL=osmesa), or MUJOCO_GL=disable for state tasks, "
                            f"which need no renderer") from None
    for name in [m for m in sys.modules if m.split(".")[0] in ("dm_control", "OpenGL")]:
        del sys.modules[name]  # the half-imported renderer, so that the import runs again from the start
    os.environ["MUJOCO_GL"] = "disable"
    print(f"MuJoCo: EGL rendering is not available here ({why}); state tasks run without a renderer, and pixel "
          f"observations and videos need libEGL (libegl1) or MUJOCO_GL=osmesa", file=sys.stderr)
    from dm_control import suite
    return suite
