"""python -m tdmpc.dataset: make, check and describe offline dataset files (the format: docs/offline.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Callable, Literal, Optional

import numpy as np
import tyro

from tdmpc.errors import EXIT_REQUEUE, ActionRangeError, DatasetError, run_cli, stop_signals
from tdmpc.runtime.args import one_line_parse_errors
from tdmpc.offline.format import DatasetFile, episode_blocks, open_dataset, open_h5


def convert(buffer: Annotated[Path, tyro.conf.Positional], task: str, out: Path,
            obs_type: Optional[Literal["state", "rgb"]] = None,
            action_repeat: Optional[int] = None) -> int:
    """Write a saved replay buffer's episodes to a dataset file (appended if it exists).

    Args:
        buffer: the replay buffer file a training run saved.
        task: the task the buffer was collected on.
        out: the dataset file.
        obs_type: state or rgb; default: rgb for a uint8 buffer, else state.
        action_repeat: what the run used; default: the task's default.
    """
    from tdmpc.offline.convert import convert_buffer

    if action_repeat is not None and action_repeat < 1:
        raise DatasetError(f"--action-repeat must be >= 1, got {action_repeat}")
    n = convert_buffer(buffer, out, task, obs_type, action_repeat)
    print(f"{out}: {n} episode{'s' * (n != 1)} written")
    return 0


def info(paths: Annotated[list[Path], tyro.conf.Positional]) -> int:
    """Check dataset files (every row) and describe them: episodes, rows, tasks, returns per task, size.

    Args:
        paths: dataset files.
    """
    if not paths:
        raise DatasetError("give one or more dataset files: python -m tdmpc.dataset info FILE [FILE ...]")
    for path in paths:  # one by one: unrelated files need not be readable together
        try:
            info = open_dataset(path, unit_actions=True)
        except ActionRangeError as e:  # readable, but not trainable as it is: said, then described
            print(f"warning: {e}; training refuses this file", file=sys.stderr)
            info = open_dataset(path)
        print(describe(info.files[0]))
    return 0


def describe(file: DatasetFile) -> str:
    s = file.schema
    size = file.path.stat().st_size
    raw = file.rows * s.row_bytes()
    lines = [f"{file.path}: {file.episodes:,} episodes, {file.rows:,} rows, {len(s.tasks)} task(s), "
             f"{size / 1e6:.1f} MB ({raw / max(size, 1):.1f}x compressed)",
             f"  obs {s.obs_type} {s.obs_shape} {s.obs_dtype}, action "
             f"{f'{s.action_dim} discrete' if s.discrete else s.action_dim}"
             f"{f' (the env takes {s.action_start}..{s.action_start + s.action_dim - 1})' if s.action_start else ''}, "
             f"action_repeat {s.action_repeat}"]
    returns = _returns(file)
    for t, name in enumerate(s.tasks):
        mine = file.episode_task == t
        r, length = returns[mine], file.episode_length[mine]
        stats = (f"return {r.mean():.1f} +- {r.std():.1f} (min {r.min():.1f}, max {r.max():.1f}), length "
                 f"{length.mean():.1f}" if mine.any() else "")
        dims = f", obs/action dims {s.task_obs_dims[t]}/{s.task_action_dims[t]}" if len(s.tasks) > 1 or s.padded(t) else ""
        lines.append(f"  task {name}: {int(mine.sum()):,} episodes{', ' + stats if stats else ''}{dims}")
    lines += [f"  source: {line}" for line in file.source.splitlines()]
    return "\n".join(lines)


def _returns(file: DatasetFile) -> np.ndarray:
    """Each episode's return, reading only the rewards."""
    out = np.zeros(file.episodes)
    with open_h5(file.path) as f:
        for e0, e1, lo, hi in episode_blocks(file):
            reward = f["reward"][lo:hi].astype(np.float64)
            firsts = file.episode_start[e0:e1] - lo  # reset rows: reward 0 by convention, not counted
            out[e0:e1] = np.add.reduceat(reward, firsts) - reward[firsts]
    return out


def to_minari(path: Annotated[Path, tyro.conf.Positional], dataset_id: str, author: Optional[str] = None,
              author_email: Optional[str] = None, code_permalink: Optional[str] = None) -> int:
    """Write a dataset file as a local Minari dataset (under $MINARI_DATASETS_PATH, default ~/.minari/datasets),
    whole or not at all: SIGTERM, SIGINT or SIGUSR1 stop it with nothing written, exit 3.

    Args:
        path: the dataset file.
        dataset_id: Minari id, (namespace/)name-vN.
    """
    from tdmpc.offline.minari import ExportStopped, to_minari as export

    with stop_signals() as stopped:
        try:
            directory = export(path, dataset_id, author, author_email, code_permalink, stop=lambda: bool(stopped))
        except ExportStopped:
            print(f"stopped by {stopped[0]} before Minari dataset {dataset_id!r} was complete: nothing was written "
                  f"(run the command again)", file=sys.stderr)
            return EXIT_REQUEUE
    print(f"{directory}: written")
    unset = [f"--{k.replace('_', '-')}" for k, v in (("author", author), ("author_email", author_email),
                                                     ("code_permalink", code_permalink)) if v is None]
    if unset:
        print(f"note: {', '.join(unset)} not given; Minari recommends them for a dataset you share")
    return 0




def from_minari(source: Annotated[str, tyro.conf.Positional], out: Path, task: Optional[str] = None) -> int:
    """Write a local Minari dataset (an id or a directory; nothing is downloaded) to a dataset file.

    Args:
        source: Minari dataset id or directory.
        out: the dataset file (appended if it exists).
        task: task name of a foreign dataset; default: its env id, else its dataset id.
    """
    from tdmpc.offline.minari import from_minari as import_

    print(f"{out}: {import_(source, out, task)} episodes written")
    return 0


def main(argv: list[str] | None = None) -> int:
    commands: dict[str, Callable[..., int]] = {"convert": convert, "info": info, "to-minari": to_minari,
                                               "from-minari": from_minari}
    def parse_and_run() -> int:
        with one_line_parse_errors("python -m tdmpc.dataset"):
            return tyro.extras.subcommand_cli_from_dict(commands, prog="python -m tdmpc.dataset", args=argv,
                                                        description=__doc__.splitlines()[0])

    return run_cli(parse_and_run)


if __name__ == "__main__":
    sys.exit(main())
