"""The registry carries each algorithm's behaviour (`ratelimit.algorithms`): every entry
answers for its script's constants, its opener and its header rule; the library finds
the lab's models only once the lab has registered them; and no module outside the
registry asks which algorithm it has by comparing a name."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import fakeredis
import pytest

import ratelimit.sync
from ratelimit import algorithms, scripts
from ratelimit.clock import ManualClock
from ratelimit.decision import Decision

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = [*algorithms.ALGORITHMS, algorithms.COMPACT_LOG]
IDS = [a.name for a in ENTRIES]

# The registry itself: the only module that may compare a string to a tag.
ALLOWED = {ROOT / "ratelimit" / "algorithms.py"}


def sync_limiter(algorithm: algorithms.Algorithm, **options):
    clock = ManualClock(1_796_000_000.0)
    return algorithm.build("sync", fakeredis.FakeRedis(), 60, 100, clock=clock, **options)


@pytest.mark.parametrize("algorithm", ENTRIES, ids=IDS)
def test_every_algorithm_gives_its_script_constants_and_opener(algorithm):
    lim = sync_limiter(algorithm)
    constants = algorithm.constants(lim)
    # The shared constants the prelude and epilogue read, whatever the algorithm.
    assert {"window", "limit", "ttl_slack", "ttl", "L1", "R"} <= set(constants)
    assert constants["window"] == 60_000 and constants["limit"] == 100
    # Each constant is one the script reads (the prelude, its own file, the epilogue).
    body = scripts.source(algorithm.script)
    for name in constants:
        assert re.search(rf"\b{name}\b", body), name
    opener = algorithm.opener(lim)
    assert (opener is None) == (lim._opener is None)
    args = lim.script_args(1_796_000_000_000, 1)
    if opener is None:
        assert args == [1_796_000_000_000, 1]  # the script works the new state out
    else:
        assert args[2] == opener(1_796_000_000_000, 1) and isinstance(args[2], bytes)
    assert lim.check("a").allowed  # the script runs with these constants


@pytest.mark.parametrize("algorithm", ENTRIES, ids=IDS)
def test_every_algorithm_answers_the_header_rule(algorithm):
    lim = sync_limiter(algorithm)
    decision = lim.check("a", 3)
    t = algorithm.effective_window_ms(lim, decision)
    assert t is None or 0 < t <= 60_000
    if isinstance(algorithm, algorithms.FixedWindow):
        assert t == decision.reset_after_ms


def test_gcra_header_rule_counts_the_units_to_a_full_bucket():
    lim = algorithms.GCRA.build("sync", fakeredis.FakeRedis(), 10, 10, burst=5)
    decision = Decision(True, 10, 2, retry_after_ms=0, reset_after_ms=3000)
    # 3 units to full, one every 1000 ms: the next is due 2000 ms before full.
    assert algorithms.GCRA.effective_window_ms(lim, decision) == 1000


def test_the_opener_is_built_once_per_limiter():
    lim = sync_limiter(algorithms.FIXED_WINDOW)
    opener = lim._opener
    for _ in range(3):
        lim.check("a")
    assert lim._opener is opener


def test_the_library_imports_without_the_lab():
    code = (
        "import ratelimit, ratelimit.sync, ratelimit.http, ratelimit.algorithms, sys;"
        "assert not [m for m in sys.modules if m.startswith('ratelimit.lab')], sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_reference_models_come_from_the_lab_once_it_registers_them():
    code = (
        "from ratelimit import algorithms\n"
        "try:\n"
        "    algorithms.GCRA.limiter_class('reference')\n"
        "except LookupError as e:\n"
        "    assert 'lab' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('found a model before the lab was imported')\n"
        "import ratelimit.lab\n"
        "model = algorithms.GCRA.build('reference', 1, 10, burst=3)\n"
        "assert type(model).__module__.startswith('ratelimit.lab.'), type(model)\n"
        "assert model.burst == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_library_names_no_lab_module():
    for path in (ROOT / "ratelimit").glob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.startswith(("ratelimit.lab", "lab")) for n in names), path
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "ratelimit.lab" in node.value and not _is_docstring(tree, node):
                    pytest.fail(f"{path.name}: {node.value!r}")


def test_a_part_nobody_registered_is_a_clear_error():
    with pytest.raises(LookupError, match="no 'colour' is registered for algorithm 'fw'"):
        algorithms.FIXED_WINDOW.part("colour")
    with pytest.raises(ValueError, match="kind must be one of"):
        algorithms.FIXED_WINDOW.limiter_class("threaded")  # type: ignore[arg-type]
    assert algorithms.GCRA.limiter_class("sync") is ratelimit.sync.TokenBucketLimiter


def _is_docstring(tree: ast.AST, node: ast.Constant) -> bool:
    for parent in ast.walk(tree):
        body = getattr(parent, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if body[0].value is node:
                return True
    return False


TAGS = {*algorithms.NAMES, algorithms.COMPACT_LOG.name}


def _names_a_tag(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TAGS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_tag(e) for e in node.elts)
    return False


def name_comparisons(source: str) -> list[str]:
    """Each comparison in `source` of something with an algorithm's tag (==, !=, in)."""
    found = []
    ops = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(op, ops) for op in node.ops) and any(map(_names_a_tag, sides)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_a_comparison_with_a_tag():
    source = 'if name == "gcra":\n    pass\nok = tag in ("fw", "x")\nno = name == "other"\n'
    assert name_comparisons(source) == ["1: name == 'gcra'", "3: tag in ('fw', 'x')"]


def test_no_module_outside_the_registry_compares_an_algorithm_name():
    sources = [*(ROOT / "ratelimit").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    assert len(sources) > 40
    found = [
        f"{path.relative_to(ROOT)}:{hit}"
        for path in sorted(sources)
        if path not in ALLOWED
        for hit in name_comparisons(path.read_text("utf-8"))
    ]
    assert found == []
