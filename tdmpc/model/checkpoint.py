"""Our checkpoint format, and loading any checkpoint safely: ours, or a reference TD-MPC2 one (imported).

Every load uses `torch.load(weights_only=True)`: a checkpoint can never run code. Writes are atomic
(tdmpc.runtime.files).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tdmpc.config import Config, from_dict, validate
from tdmpc.errors import CheckpointError
from tdmpc.model.reference import REFERENCE_MODULES, reference_to_ours
from tdmpc.model.world_model import ModelDims, WorldModel
from tdmpc.runtime.files import atomic_write
from tdmpc.tasks.sets import TASK_SETS, expand

FORMAT = "tdmpc"
VERSION = 1

def save(obj: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def checkpoint_path(path: object) -> Path:
    """A checkpoint's path, or a one-line CheckpointError for anything that is not one (None, a number...). A
    run's directory (or its checkpoints/ folder) stands for its latest checkpoint, as --resume takes it."""
    if not isinstance(path, (str, Path)):
        raise CheckpointError(f"a checkpoint is a path to a .pt file or a run directory (str or Path), not "
                              f"{type(path).__name__}")
    path = Path(path)
    if path.is_dir():
        for latest in (path / "checkpoints" / "latest.pt", path / "latest.pt"):
            if latest.is_file():
                return latest
    return path


def load_file(path: str | Path, mmap: bool = False) -> dict:
    """torch.load with weights_only=True, turning every failure into a one-line CheckpointError.

    `mmap=True` maps the tensors instead of reading them (cheap when only shapes are needed);
    it applies to zip-format files, which is what torch.save has written since torch 1.6.
    """
    path = checkpoint_path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint '{path}' is a directory without a run's checkpoints/latest.pt; pass a .pt "
                              f"file or a run directory")
    with open(path, "rb") as f:
        head = f.read(8)
    if not head:
        raise CheckpointError(f"cannot load '{path}': the file is empty")
    is_zip = head.startswith(b"PK\x03\x04")
    if not is_zip and head[0] != 0x80:  # neither torch's zip format nor a (legacy-format) pickle
        what = "a text file" if _looks_like_text(path) else "unknown binary data"
        raise CheckpointError(f"cannot load '{path}': not a torch checkpoint ({what}, not the zip archive "
                              f"torch.save writes)")
    if is_zip and not zipfile.is_zipfile(path):
        raise CheckpointError(f"cannot load '{path}': the file is truncated or corrupt (incomplete zip archive)")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise, not an error
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except Exception as e:  # noqa: BLE001 - whatever the unpickler trips on, the user gets one line
        raise CheckpointError(f"cannot load '{path}': {_load_failure(e)}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"cannot load '{path}': expected a dict, found {type(obj).__name__}")
    return obj


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        chunk = f.read(4096)
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in chunk


def _load_failure(e: Exception) -> str:
    """Why torch.load failed, in a few words."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(e).__name__
    if m := re.search(r"GLOBAL (\S+)", text):
        return (f"it holds a Python object ({m.group(1)}) that a safe weights-only load refuses to build; "
                f"only tensors and plain containers are accepted")
    if "Weights only load failed" in text:
        return "not a torch checkpoint (its pickle data is not what torch.save writes)"
    if isinstance(e, (EOFError, zipfile.BadZipFile)) or "EOF" in first or "central directory" in first:
        return "the file is truncated or corrupt"
    return f"not a readable torch checkpoint ({type(e).__name__}: {first[:120]})"


def is_reference(obj: dict) -> bool:
    """A reference TD-MPC2 file: {"model": state_dict} (what its save() writes) or a bare state dict."""
    if obj.get("format") == FORMAT:
        return False
    sd = obj.get("model", obj)
    return isinstance(sd, dict) and any(isinstance(k, str) and k.startswith(REFERENCE_MODULES) for k in sd)


def load_state_strict(model: torch.nn.Module, sd: dict, source: str) -> None:
    """load_state_dict with one-line errors listing the first few missing/unexpected keys or shapes."""
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:4]}{' ...' if len(missing) > 4 else ''} ({len(missing)} in all)")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''} "
                         f"({len(unexpected)} in all)")
        raise CheckpointError(f"{source}: state dict does not match the model: " + "; ".join(parts))
    for k, v in sd.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(f"{source}: '{k}' has shape {tuple(v.shape)}, the model expects "
                                  f"{tuple(own[k].shape)}")
    model.load_state_dict(sd)


def load_reference(path: str | Path, map_location: str | torch.device = "cpu",
                   tasks: tuple[str, ...] | None = None) -> WorldModel:
    """A reference TD-MPC2 checkpoint ({"model": state_dict}) as our WorldModel; `tasks` names a multi-task
    model's tasks in id order (default: mt30 or mt80, by its number of tasks)."""
    obj = load_file(path)
    sd = obj.get("model", obj)
    dims, ours = reference_to_ours(sd, source=str(path), tasks=tasks)
    model = WorldModel(dims)
    load_state_strict(model, ours, str(path))
    return model.to(map_location).eval()


# --- reading a checkpoint for use --------------------------------------------------------

@dataclass
class LoadedCheckpoint:
    cfg: Config
    dims: ModelDims
    state: dict  # our state-dict layout (model, and optimisers when present)
    episode_length: int | list[int] | None  # None for reference checkpoints: taken from the task(s)
    imported: bool  # a reference TD-MPC2 checkpoint


def read_checkpoint(path: str | Path, overrides: dict | None = None, mmap: bool = False) -> LoadedCheckpoint:
    """Our checkpoint or a reference one, as config + dims + state; `overrides` apply to the config.

    `mmap=True` maps the tensors rather than reading them: cheap when only the dims are needed."""
    path, overrides = checkpoint_path(path), overrides or {}
    obj = load_file(path, mmap=mmap)
    if is_reference(obj):
        named = overrides.get("task_set")  # --task-set a,b or a b: the file's tasks, which it does not name
        given = tuple(t for entry in named for t in expand(entry)) if named else None
        dims, state = reference_to_ours(obj.get("model", obj), str(path), given)
        base = Config(**dims.config_values())
        if dims.multitask:  # the task it plays is chosen later; until then it names its set
            base = dataclasses.replace(base, task=next((n for n, t in TASK_SETS.items() if t == dims.tasks),
                                                       ",".join(dims.tasks)))
        return LoadedCheckpoint(validate(from_dict(overrides, base=base)), dims, {"model": state}, None, True)
    if obj.get("format") != FORMAT or "dims" not in obj:
        keys = [str(k) for k in list(obj)[:4]]
        raise CheckpointError(f"{path}: neither a tdmpc checkpoint nor a TD-MPC2 state dict "
                              f"(it holds keys {keys}{' ...' if len(obj) > 4 else ''})")
    cfg = validate(from_dict(overrides, base=from_dict(obj["config"], source=str(path))))
    length = obj["episode_length"]
    return LoadedCheckpoint(cfg, ModelDims.from_dict(obj["dims"]), obj,
                            [int(n) for n in length] if isinstance(length, (list, tuple)) else int(length), False)


def reference_task_count(obj: dict) -> int:
    """How many task embeddings a reference file holds (0: a single-task model)."""
    emb = obj.get("model", obj).get("_task_emb.weight")
    return int(emb.shape[0]) if isinstance(emb, torch.Tensor) and emb.dim() == 2 else 0


def reference_task_set(path: Path, task_set: tuple[str, ...]) -> dict:
    """--task-set as a read_checkpoint override: the tasks of a reference multi-task file, which names none
    (ours name their own, and a single-task model has none: refused)."""
    if not task_set:
        return {}
    obj = load_file(path, mmap=True)
    if not is_reference(obj) or not reference_task_count(obj):
        what = "a tdmpc checkpoint, which names its own" if not is_reference(obj) else "a single-task model"
        raise CheckpointError(f"--task-set names a reference multi-task checkpoint's tasks; {path} is {what}")
    return {"task_set": task_set}


def check_dims_match(dims: ModelDims, obs_shape: tuple[int, ...], action_dim: int, discrete: bool, task: str,
                     source: str) -> None:
    """A model made for other observation or action sizes, or the other kind of actions, than the task's is a
    one-line error."""
    if (tuple(dims.obs_shape), dims.action_dim, dims.discrete) != (tuple(obs_shape), action_dim, discrete):
        model = describe_sizes(dims.obs_shape, dims.action_dim, dims.discrete)
        raise CheckpointError(f"{source}: model is for {model}, but task '{task}' has "
                              f"{describe_sizes(obs_shape, action_dim, discrete)}")


def describe_sizes(obs_shape: tuple[int, ...], action_dim: int, discrete: bool) -> str:
    """'obs (3,) / continuous actions of dim 1', as size-mismatch messages name them."""
    actions = f"{action_dim} discrete actions" if discrete else f"continuous actions of dim {action_dim}"
    return f"obs {tuple(obs_shape)} / {actions}"


