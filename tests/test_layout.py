"""The architecture's import rules, checked on the source so they cannot break silently.

docs/architecture.md draws the map these rules keep true: the contract at the bottom, shared
plumbing above it, the three components as peers above both, and the CLI, the local stack,
benchmarks and manifests on top, free to wire anything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The parts under the one top-level package, gpuaware; the rest of it (cli, local, config) is the wiring on top.
PARTS = {"contract", "plumbing", "agent", "stream", "scheduler", "dashboards", "bench", "deploy"}

# part -> parts it may import (besides itself)
ALLOWED = {
    "contract": set(),
    "plumbing": {"contract"},
    "agent": {"contract", "plumbing"},
    "stream": {"contract", "plumbing"},
    "scheduler": {"contract", "plumbing"},
    "dashboards": {"contract"},  # the DCGM metric contract the queries are written against
}
# The scheduling core is pure: the contract's plain data and itself, no I/O libraries.
CORE = "gpuaware.scheduler.core"
CORE_ALLOWED_FIRST_PARTY = {"gpuaware.contract.events", "gpuaware.contract.annotations", "gpuaware.scheduler.core"}
CORE_FORBIDDEN_THIRD_PARTY = {"aiokafka", "faust", "kubernetes", "urllib3", "prometheus_client", "pathlib", "socket",
                              "asyncio", "subprocess", "requests", "yaml"}
# What the contract may import at all: the standard library and the Avro codec.
CONTRACT_THIRD_PARTY = {"fastavro"}


def _part(name: str) -> str | None:
    """The part a dotted module name belongs to (gpuaware.agent.core -> agent); None outside gpuaware."""
    parts = name.split(".")
    if parts[0] != "gpuaware":
        return None
    return parts[1] if len(parts) > 1 else "gpuaware"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names, at any depth (imports inside functions count)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from gpuaware.contract import events` names gpuaware.contract.events
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _sources(package: str) -> list[Path]:
    """The files of a part ("agent") or of a dotted package ("gpuaware.scheduler.core")."""
    dotted = package if package.startswith("gpuaware") else f"gpuaware.{package}"
    return sorted((REPO / dotted.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_the_map_allows(package):
    problems = []
    for path in _sources(package):
        for line, name in _imports(path):
            part = _part(name)
            if part is not None and part != package and part not in ALLOWED[package]:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    allowed = sorted(ALLOWED[package]) or "nothing first-party"
    assert not problems, f"{package} may import only {allowed}:\n" + "\n".join(problems)


def test_the_scheduling_core_imports_only_the_contracts_plain_data_and_does_no_io():
    problems = []
    for path in _sources(CORE):
        for line, name in _imports(path):
            top = name.split(".")[0]
            allowed = any(name == a or name.startswith(a + ".") for a in CORE_ALLOWED_FIRST_PARTY)
            # `from gpuaware.contract import events` also names the bare packages
            bare = name in {"gpuaware", "gpuaware.contract", "gpuaware.scheduler"}
            if top == "gpuaware" and not allowed and not bare:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {name}")
            if top in CORE_FORBIDDEN_THIRD_PARTY:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {name} (I/O)")
        text = path.read_text()
        for call in ("open(", ".read_text(", ".read_bytes(", ".write_text("):
            if call in text:
                problems.append(f"{path.relative_to(REPO)} calls {call}")
    assert not problems, "\n".join(problems)


def test_the_contract_needs_only_the_standard_library_and_avro():
    stdlib = sys.stdlib_module_names
    problems = []
    for path in _sources("contract"):
        for line, name in _imports(path):
            top = name.split(".")[0]
            if top not in stdlib and top not in CONTRACT_THIRD_PARTY and _part(name) != "contract" \
                    and name != "gpuaware":
                problems.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not problems, "\n".join(problems)


def test_importing_the_contract_loads_no_client_and_reads_no_file():
    code = (
        "import sys\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == 'open' else None)\n"
        "import gpuaware.contract, gpuaware.contract.events, gpuaware.contract.topics, gpuaware.contract.annotations\n"
        "loaded = {'faust', 'aiokafka', 'kubernetes'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        "reads = [p for p in opened if not p.endswith(('.py', '.pyc')) and '__pycache__' not in p\n"
        "         and 'site-packages' not in p and 'contract' in p]\n"
        "assert not reads, reads\n"
        "from gpuaware.contract import events\n"
        "assert events.record_type(events.GpuState).latest >= 1  # schemas load on first use\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_test_doubles_live_outside_the_component_packages():
    doubles = [p for pkg in ("agent", "stream", "scheduler", "plumbing", "contract") for p in _sources(pkg)
               if "fake" in p.name]
    assert not doubles, doubles


def test_an_install_adds_one_top_level_package():
    """`pip install` puts only `gpuaware` in site-packages: no `agent` or `scheduler` to collide with another's."""
    import tomllib

    from setuptools import find_packages

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(REPO), include=found["include"], exclude=found.get("exclude", ()))
    assert {name.split(".")[0] for name in packages} == {"gpuaware"}
    assert {f"gpuaware.{part}" for part in PARTS} <= set(packages)


MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120  # from its ``def`` line to its last, nested functions counted on their own as well


def _sizes() -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Lines per module of gpuaware/, and per function (by module and name)."""
    modules, functions = {}, {}
    for path in sorted((REPO / "gpuaware").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        text = path.read_text()
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = (name, node.name)
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
    return modules, functions


def test_no_module_over_600_lines_and_no_function_over_120():
    modules, functions = _sizes()
    problems = [f"{m}: {n} lines (at most {MAX_MODULE_LINES})" for m, n in modules.items() if n > MAX_MODULE_LINES]
    problems += [f"{m}: {f}() {n} lines (at most {MAX_FUNCTION_LINES})" for (m, f), n in functions.items()
                 if n > MAX_FUNCTION_LINES]
    assert not problems, "\n".join(problems)


def test_no_three_scheduler_modules_in_one_folder_share_a_prefix():
    """Three modules named ``x_*`` in one folder are a room of their own (``kube/dra/``, ``kube/extender/``)."""
    crowded = []
    for folder in sorted({p.parent for p in (REPO / "gpuaware" / "scheduler").rglob("*.py")}):
        prefixes: dict[str, list[str]] = {}
        for p in folder.glob("*.py"):
            if p.stem != "__init__":
                prefixes.setdefault(p.stem.split("_")[0], []).append(p.name)
        crowded += [f"{folder.relative_to(REPO)}: {sorted(names)}" for names in prefixes.values() if len(names) >= 3]
    assert not crowded, "\n".join(crowded)
