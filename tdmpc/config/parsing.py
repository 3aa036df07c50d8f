"""A Config from JSON (a --cfg file, a run's config.json, fit()'s keywords) and from the command line (tyro)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal, TypeVar

import tyro

from tdmpc.config.checks import validate
from tdmpc.config.fields import FIELD_NAMES, SIZE_FIELDS, Config, field_types
from tdmpc.errors import ConfigError
from tdmpc.runtime.args import normalized_argv, one_line_parse_errors
from tdmpc.runtime.files import shipped_dir, write_text_atomic

CPU_CONFIG = "cpu.json"  # what a machine without a GPU starts from when no --cfg is given
CONFIG_DIR = shipped_dir("configs")  # the repository's configs/, packaged with the code


def _check_type(name: str, value: object) -> object:
    """Coerce a JSON value to the field's type, or raise ConfigError."""
    hint = field_types()[name]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for opt in options:
        if opt is type(None) and value is None:
            return None
        if typing.get_origin(opt) is Literal and value in typing.get_args(opt):
            return value
        if typing.get_origin(opt) is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if opt is bool and isinstance(value, bool):
            return value
        if opt is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)  # numpy's integers too (fit(seed=np.int64(3)))
        if opt is int and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
                and float(value).is_integer():
            return int(float(value))  # a whole number written 1e6 (JSON and Python read it as a float)
        if opt is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if opt is str and isinstance(value, str):
            return value
    expected = " or ".join(
        "null" if o is type(None) else "one of " + str(list(typing.get_args(o))) if typing.get_origin(o) is Literal
        else "a list of strings" if typing.get_origin(o) is tuple else getattr(o, "__name__", str(o)) for o in options)
    raise ConfigError(f"config field '{name}' = {value!r}: expected {expected}")


def unknown_key_error(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, FIELD_NAMES, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{key}' in {source}{hint}")


def from_dict(data: dict, source: str = "config", base: Config | None = None) -> Config:
    """Build a Config from a plain dict (JSON), checking keys and types."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key.startswith("_"):  # "_comment" and the like
            continue
        if key not in FIELD_NAMES:
            raise unknown_key_error(key, source)
        values[key] = _check_type(key, value)
    return dataclasses.replace(base or Config(), **values)


def available_configs() -> list[str]:
    return sorted(p.name for p in CONFIG_DIR.glob("*.json"))


def find_config_file(name: str) -> Path:
    """`--cfg a4000.json` finds ./configs/a4000.json or the packaged one; a path works as given; '.json' is optional."""
    if not name or Path(name).is_dir():
        raise ConfigError(f"--cfg {name!r}: give a config file (available: {', '.join(available_configs())})")
    names = [name] if name.endswith(".json") else [name, name + ".json"]
    for candidate in [d / n for d in (Path("."), Path("configs"), CONFIG_DIR) for n in names]:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config file '{name}' not found (looked in ., ./configs and {CONFIG_DIR}; "
                      f"available: {', '.join(available_configs())})")


def read_json(path: Path, what: str = "config file") -> dict:
    """A JSON object from `path`, or a one-line ConfigError saying what is wrong with the file."""
    def no_repeats(pairs: list[tuple[str, Any]]) -> dict:
        keys = [k for k, _ in pairs]
        if len(set(keys)) < len(keys):
            raise ConfigError(f"{what} '{path}' sets '{next(k for k in keys if keys.count(k) > 1)}' twice")
        return dict(pairs)

    try:
        data = json.loads(path.read_text(), object_pairs_hook=no_repeats)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} '{path}' is not valid JSON: {e.msg} at line {e.lineno}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} '{path}' cannot be read: {e}") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise ConfigError(f"{what} '{path}' must hold a JSON object, not {kind}")
    return data


def load_json(name: str, base: Config | None = None) -> Config:
    path = find_config_file(name)
    return from_dict(read_json(path), source=str(path), base=base)


def save_json(cfg: Config, path: Path) -> None:
    write_text_atomic(path, json.dumps(cfg.to_dict(), indent=2) + "\n")  # a resume reads it: never half of one


T = TypeVar("T")


def parse_cli(run_args: type[T], argv: list[str], base_for: Callable[[T], Config], prog: str | None = None,
              description: str | None = None, checked: bool = True) -> tuple[T, Config, Config, set[str]]:
    """Two tyro passes over argv: `run_args` first (its flags may choose the base config: --cfg, --resume),
    then every Config field as a flat kebab-case flag over `base_for(run)`. Returns the run args, the
    config (validated unless not `checked`: the caller's own checks come first), the base, and the names of the
    Config fields given on the command line."""
    argv = normalized_argv(argv, run_args, Config)
    with one_line_parse_errors(prog or "python -m tdmpc.train"):
        run, _ = tyro.cli(run_args, args=argv, return_unknown_args=True, add_help=False, prog=prog)
    base = base_for(run)
    args_cls = dataclasses.make_dataclass("Args", [
        ("run", run_args, dataclasses.field(default_factory=run_args)),
        ("config", Config, dataclasses.field(default_factory=Config))])

    def parse(defaults: Config) -> Config:
        with one_line_parse_errors(prog or "python -m tdmpc.train"):
            # run_args' own defaults: a flag such as --no-buffer over run's True would read as --no-no-buffer
            return tyro.cli(args_cls, default=args_cls(run_args(), defaults), args=argv, prog=prog,
                            description=description, config=(tyro.conf.OmitArgPrefixes,)).config

    cfg = parse(base)
    # A field given on the command line parses to the same value over any base; one that was not given
    # takes the base's. So a second parse over a base whose every field differs tells them apart.
    shadow = parse(Config(**{name: _another(name, getattr(base, name)) for name in FIELD_NAMES}))
    given = {name for name in FIELD_NAMES if getattr(cfg, name) == getattr(shadow, name)}
    return run, validate(cfg) if checked else cfg, base, given


def _another(name: str, value: object) -> Any:
    """A value of field `name`'s type other than `value`."""
    hint = field_types()[name]
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kind = next(o for o in options if o is not type(None))
    if typing.get_origin(kind) is Literal:
        return next(v for v in typing.get_args(kind) if v != value)
    if value is None:
        return {bool: True, int: -1, float: -1.0, str: "~"}[kind] if typing.get_origin(kind) is not tuple else ("~",)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    return value + ("~",) if isinstance(value, tuple) else f"{value}~"


def changed_fields(base: Config, cfg: Config) -> dict[str, tuple[object, object]]:
    """Fields whose value differs between two configs: name -> (old, new)."""
    return {n: (getattr(base, n), getattr(cfg, n)) for n in FIELD_NAMES if getattr(base, n) != getattr(cfg, n)}


# Settings two runs being compared (one grid's seeds, the seeds a curve averages) may differ in: each run's own, and
# those that say where and how a run executes or what it writes, not what it learns (a rerun may pass other ones,
# and a resume takes them). model_size is compared through the sizes it stands for.
NOT_COMPARED = frozenset({
    "task", "seed", "steps", "run_dir", "model_size",
    "device", "threads", "compile", "cuda_graphs", "plan_chunk_envs", "buffer_device", "vectorization",
    "dataset_stream", "update_stream", "debug",
    "eval_freq", "eval_episodes", "save_video", "save_every", "save_buffer", "log_every", "save_data", "progress",
    "tensorboard", "wandb", "wandb_project", "wandb_entity", "wandb_group", "wandb_tags"})


def learning_differences(saved: dict, cfg: Config, source: str) -> dict[str, tuple[object, object]]:
    """The settings that change what a run learns in which a run's config.json (`saved`, read from `source`)
    differs from `cfg`: name -> (the run's, cfg's). Not compared: NOT_COMPARED, settings cfg leaves to the task or
    the machine (None: seed_steps, episodic, ...), and settings the run's config.json lacks (added to tdmpc since;
    its model_size stands for the sizes)."""
    theirs, mine = ({**c.to_dict(), **c.sizes()} for c in (from_dict(saved, source), cfg))
    return {n: (theirs[n], mine[n]) for n in FIELD_NAMES
            if (n in saved or n in SIZE_FIELDS and "model_size" in saved) and n not in NOT_COMPARED
            and mine[n] is not None and theirs[n] != mine[n]}
