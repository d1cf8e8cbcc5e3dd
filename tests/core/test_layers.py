"""The import layering the README states, as `import-linter` contracts (pyproject.toml's
[tool.importlinter]): the contracts hold, they catch each kind of forbidden import, and the
imports by name that import-linter cannot see are caught here."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}

# What the library must not import, by name as well as by statement.
FORBIDDEN = re.compile(r"(ratelimit\.(lab|devtools)|numpy|pandas|matplotlib)(\.\w+)*")
# What the lab must not import.
LAB_FORBIDDEN = re.compile(r"(bench|tools)(\.\w+)*")


def lint_imports(cwd: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def library_modules() -> list[str]:
    """Every module of the library: ratelimit/*.py (the lab and devtools are packages)."""
    names = sorted(p.stem for p in (ROOT / "ratelimit").glob("*.py"))
    return ["ratelimit" if n == "__init__" else f"ratelimit.{n}" for n in names]


def test_the_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


def test_the_library_contract_names_every_module_of_the_library() -> None:
    # A new library module is checked only once the contract names it.
    assert sorted(CONTRACTS["library"]["source_modules"]) == library_modules()


def _names_imported_by_name(
    path: Path, forbidden: re.Pattern[str], root: Path = ROOT
) -> list[str]:
    """Module names `path` may import by name: where the file calls
    importlib.import_module or __import__ at all, every string that is a forbidden
    module's dotted name, or an f-string that starts with one (the name can reach the
    call through a table, as a registry's does)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
        )
    ]
    if not calls:
        return []
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str):
                text = head.value.rstrip(".")
        if text is not None and forbidden.fullmatch(text):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {text}")
    return found


def test_the_library_imports_nothing_forbidden_by_name() -> None:
    found = [
        hit
        for path in sorted((ROOT / "ratelimit").glob("*.py"))
        for hit in _names_imported_by_name(path, FORBIDDEN)
    ]
    assert not found, found


def test_the_lab_and_devtools_import_nothing_forbidden_by_name() -> None:
    lab = sorted((ROOT / "ratelimit" / "lab").rglob("*.py"))
    found = [hit for path in lab for hit in _names_imported_by_name(path, LAB_FORBIDDEN)]
    devtools = sorted((ROOT / "ratelimit" / "devtools").rglob("*.py"))
    lab_by_name = re.compile(r"ratelimit\.lab(\.\w+)*")
    found += [hit for path in devtools for hit in _names_imported_by_name(path, lab_by_name)]
    assert not found, found


def test_the_scan_finds_a_name_that_reaches_import_module_through_a_table(tmp_path) -> None:
    module = tmp_path / "registry.py"
    module.write_text(
        "import importlib\n"
        "KINDS = {'model': 'ratelimit.lab.reference'}\n"
        "def load(kind):\n"
        "    return importlib.import_module(KINDS[kind])\n"
        "def chapter(name):\n"
        "    return __import__(f'ratelimit.lab.chapters.{name}')\n"
    )
    assert _names_imported_by_name(module, FORBIDDEN, tmp_path) == [
        "registry.py:2: ratelimit.lab.reference",
        "registry.py:6: ratelimit.lab.chapters",
    ]


# --- the contracts catch what they forbid ------------------------------------------------

# One forbidden import per contract, each in a copy of the project's shape (every module
# the contracts name, empty) with the project's own [tool.importlinter] section.
VIOLATIONS = [
    ("library", "ratelimit/keys.py", "import numpy\n"),
    ("library", "ratelimit/__init__.py", "from ratelimit.lab import traffic\n"),
    ("library", "ratelimit/http.py", "from ratelimit.devtools import server\n"),
    ("library", "ratelimit/sync.py", "from ratelimit import keys\n"),  # indirect: keys above
    ("lab", "ratelimit/lab/traffic.py", "import bench.suite\n"),
    ("chapters", "ratelimit/lab/traffic.py", "from ratelimit.lab.chapters import one\n"),
    ("devtools", "ratelimit/devtools/server.py", "import ratelimit.lab.traffic\n"),
    ("bench", "bench/suite.py", "def later():\n    from . import part\n"),
]


def _project(root: Path) -> None:
    files = [m.replace(".", "/") for m in library_modules()]
    files = [("ratelimit/__init__" if f == "ratelimit" else f) + ".py" for f in files]
    files += [
        "ratelimit/lab/__init__.py",
        "ratelimit/lab/traffic.py",
        "ratelimit/lab/chapters/__init__.py",
        "ratelimit/lab/chapters/one.py",
        "ratelimit/devtools/__init__.py",
        "ratelimit/devtools/server.py",
        "bench/__init__.py",
        "bench/suite.py",
        "bench/part.py",
    ]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    # What the layering allows: chapters import the lab, bench imports both, devtools the library.
    (root / "ratelimit/lab/chapters/one.py").write_text("from ratelimit.lab import traffic\n")
    (root / "bench/part.py").write_text(
        "from ratelimit.lab.chapters import one\nfrom . import suite\n"
    )
    (root / "ratelimit/devtools/server.py").write_text("from ratelimit import demo\n")
    (root / "pyproject.toml").write_text(_toml(CONFIG))


def _toml(config: dict) -> str:
    """The [tool.importlinter] tables as TOML (strings, booleans, lists of them)."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    out = ["[tool.importlinter]"]
    out += [f"{k} = {value(v)}" for k, v in config.items() if k != "contracts"]
    for contract in config["contracts"]:
        out += ["", "[[tool.importlinter.contracts]]"]
        out += [f"{k} = {value(v)}" for k, v in contract.items()]
    return "\n".join(out) + "\n"


def _env(root: Path) -> dict[str, str]:
    # The copy, not the project, is what `ratelimit` and `bench` name for import-linter.
    return {**os.environ, "PYTHONPATH": str(root)}


def test_the_copy_of_the_project_keeps_every_contract(tmp_path) -> None:
    _project(tmp_path)
    result = lint_imports(tmp_path, env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("contract", "where", "line"), VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(tmp_path, contract, where, line) -> None:
    _project(tmp_path)
    if contract == "library" and where == "ratelimit/sync.py":
        (tmp_path / "ratelimit/keys.py").write_text("import pandas\n")
    with (tmp_path / where).open("a") as f:
        f.write(line)
    result = lint_imports(tmp_path, env=_env(tmp_path))
    assert result.returncode != 0, result.stdout
    # The report wraps long names: any run of spaces may be a line break.
    name = r"\s+".join(map(re.escape, CONTRACTS[contract]["name"].split()))
    assert re.search(rf"{name}\s+BROKEN", result.stdout), result.stdout
    assert f"Contracts: {len(CONTRACTS) - 1} kept, 1 broken." in result.stdout


def test_only_the_readme_renderer_imports_a_chapter_by_name() -> None:
    # The README's texts live in the chapter modules; rendering them is the one place the
    # lab reaches up to a chapter, by name and only when `make refresh` renders.
    lab = ROOT / "ratelimit" / "lab"
    chapters = re.compile(r"ratelimit\.lab\.chapters(\.\w+)*")
    outside = [p for p in sorted(lab.rglob("*.py")) if "chapters" not in p.relative_to(lab).parts]
    found = {hit.split(":")[0] for p in outside for hit in _names_imported_by_name(p, chapters)}
    assert found == {"ratelimit/lab/readme.py"}
