"""The package's layout: folders by job, no import cycles between modules or between packages, every import going
down LAYERS (errors and the runtime at the bottom, the commands on top), and every package listed for the build
(pyproject.toml maps planners/, configs/ and slurm/ into it; no links)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
CLI = ("train", "evaluate", "dataset", "collect", "reproduce", "plot", "slurm_scripts", "parity")
# The commands, imported by nothing else: tdmpc.cli.<name>, and tdmpc.bench, a package whose modules only it imports.
COMMANDS = {*(f"tdmpc.cli.{c}" for c in CLI), "tdmpc.bench"}
# python -m tdmpc.<name> needs a module of that name: a thin one that imports its command and runs it.
ENTRY_POINTS = {f"tdmpc.{c}": f"tdmpc.cli.{c}" for c in CLI}

# What a planner may import besides its own package: its settings (declared in the config layer), the one-line
# errors, and of the model the policy prior's output and the random source (no networks).
PLANNER_INTERFACE = {"tdmpc.config.planner", "tdmpc.errors", "tdmpc.model", "tdmpc.model.policy", "tdmpc.model.random"}

# The layers, bottom to top, as docs/layout.md lists them. A package (a folder of tdmpc/, or a module at its top)
# imports from its own layer and the ones below, never from one above, and no two packages import each other.
LAYERS: tuple[set[str], ...] = (
    {"tdmpc.errors"},
    {"tdmpc.runtime"},
    {"tdmpc.tasks", "tdmpc.envs"},  # data and simulators: the reference task sets, envs by name
    {"tdmpc.config"},  # pure settings: Config, the planner's settings, validation, JSON and CLI parsing
    {"tdmpc.model", "tdmpc.buffer", "tdmpc.multitask"},
    {"tdmpc.planners"},
    {"tdmpc.losses", "tdmpc.learner", "tdmpc.actor", "tdmpc.agent"},
    {"tdmpc.memory", "tdmpc.offline", "tdmpc.episodes"},
    {"tdmpc.training"},
    {"tdmpc.report"},
    {"tdmpc", "tdmpc.cli", "tdmpc.bench", *ENTRY_POINTS},  # the Python API (names imported on first use), the commands
)


def _modules() -> dict[str, Path]:
    """Module name -> file, for tdmpc/ and planners/ (which is tdmpc.planners once installed)."""
    found = {}
    for path in [*(ROOT / "tdmpc").rglob("*.py"), *(ROOT / "planners").glob("*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[0] == "planners":
            parts = ["tdmpc", *parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The tdmpc modules `name` imports, at the top or inside functions; not those for type checking only."""
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                 for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in modules else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in modules and m != name}


def _command(module: str) -> str | None:
    """The command `module` is (or is part of, inside a command's package, or the entry point of); None for the
    library."""
    module = ENTRY_POINTS.get(module, module)
    return next((c for c in COMMANDS if module == c or module.startswith(c + ".")), None)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _package(module: str) -> str:
    """What LAYERS lists: tdmpc.model.world_model -> tdmpc.model, tdmpc.agent -> tdmpc.agent."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    """Package -> the other packages its modules import (inside functions too)."""
    out: dict[str, set[str]] = {}
    for name, deps in _graph().items():
        out.setdefault(_package(name), set()).update(_package(d) for d in deps if _package(d) != _package(name))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, cycles


def test_no_package_imports_one_that_imports_it():
    cycles = _cycles(_package_graph())
    assert not cycles, f"packages that import each other, in a circle: {cycles}"


def test_imports_go_down_the_layers():
    graph, layer = _graph(), {p: i for i, names in enumerate(LAYERS) for p in names}
    packages = {_package(name) for name in graph}
    assert not packages - set(layer), f"place {sorted(packages - set(layer))} in LAYERS (and docs/layout.md)"
    upward = sorted(f"{name} imports {dep}" for name, deps in graph.items() for dep in deps
                    if layer[_package(dep)] > layer[_package(name)])
    assert not upward, f"imports from a lower layer to a higher one: {upward}"
    assert not set(layer) - packages, f"LAYERS names {sorted(set(layer) - packages)}, which are not there"


def test_errors_and_runtime_are_the_bottom_and_commands_the_top():
    graph = _graph()
    assert graph["tdmpc.errors"] == set(), "errors.py imports nothing of tdmpc"
    for name, deps in graph.items():
        if name.startswith("tdmpc.runtime"):
            assert deps <= {"tdmpc.errors"} | {d for d in deps if d.startswith("tdmpc.runtime")}, (name, deps)
        if name.startswith("tdmpc.planners"):  # a planner needs only its protocol and the model's side of it
            assert all(d.startswith("tdmpc.planners") or d in PLANNER_INTERFACE for d in deps), (name, deps)
        if name.startswith("tdmpc.model"):
            assert not any(d.startswith("tdmpc.planners") for d in deps), f"{name}: the model imports no planner"
        commands = {d for d in deps if _command(d) not in (None, _command(name))}
        assert not commands, f"{name} imports the command module(s) {commands}"


def test_every_package_is_built_and_nothing_is_a_link():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tdmpc").rglob("__init__.py")}
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"] == {"tdmpc.planners": "planners", "tdmpc.configs": "configs", "tdmpc.slurm": "slurm"}
    links = [str(p) for p in [*ROOT.glob("tdmpc/**/*"), *ROOT.glob("planners/*")] if p.is_symlink()]
    assert not links, links


def test_each_entry_point_only_runs_its_command():
    """The modules that python -m needs at the package's top hold no code of their own (the command lives in
    tdmpc.cli), and every command has one."""
    graph, modules = _graph(), _modules()
    assert {f"tdmpc.cli.{c}" for c in CLI} == {m for m in modules if m.startswith("tdmpc.cli.")}
    for entry, command in ENTRY_POINTS.items():
        assert graph[entry] == {command}, (entry, graph[entry])
        code = [line for line in modules[entry].read_text().splitlines() if line.strip()]
        assert len(code) <= 6, f"{entry} is an entry point: keep the command in {command}"
