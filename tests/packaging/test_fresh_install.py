"""The package as a new user installs it, each time into a venv of its own: the library
alone (no fakeredis, a version, no Redis named refused) running the README's first
example on a real Redis, and the `lab` extra planning the lab's example log.

Installs from requirements.lock's versions (uv's cache makes that quick); every command
runs outside the source tree, so what is imported is what was installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _missing

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _env(**extra: str) -> dict[str, str]:
    """This environment without anything that would point at the source tree's venv,
    or name a Redis, unless `extra` does."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.pop("REDIS_URL", None)
    env.update(UV_LINK_MODE="copy", RATELIMIT_PROGRESS="0", **extra)
    return env


def _venv_with(tmp_path_factory: pytest.TempPathFactory, name: str, spec: str) -> Iterator[Path]:
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        _missing(f"uv is not installed beside {sys.executable}; `make setup` installs it")
    where = tmp_path_factory.mktemp(name)
    venv = where / "venv"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv], check=True, env=_env())
    python = venv / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", python,
         "--constraint", ROOT / "requirements.lock", spec],
        check=True, env=_env(),
    )  # fmt: skip
    yield python
    shutil.rmtree(where, ignore_errors=True)


def _run(python: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=_env(**env), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv holding the package and no extra."""
    yield from _venv_with(tmp_path_factory, "library", str(ROOT))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv holding the package with the `lab` extra."""
    yield from _venv_with(tmp_path_factory, "lab", f"{ROOT}[lab]")


def test_the_library_alone_has_no_fakeredis(library, tmp_path):
    code = "import importlib.util as u; print(u.find_spec('fakeredis'), u.find_spec('ratelimit'))"
    done = _run(library, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found_fakeredis, found_ratelimit = done.stdout.split(" ", 1)
    assert found_fakeredis == "None"
    assert str(library.parents[1]) in found_ratelimit  # the installed copy, not the source


def test_the_library_knows_its_version(library, tmp_path):
    done = _run(library, "-c", "import ratelimit; print(ratelimit.__version__)", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == VERSION
    cli = _run(library, "-m", "ratelimit", "--version", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == f"ratelimit-lab {VERSION}"


@pytest.mark.parametrize("redis_url", [None, ""], ids=["unset", "empty"])
def test_no_redis_named_is_refused_with_both_remedies(library, tmp_path, redis_url):
    code = (
        "import ratelimit\n"
        "for connect in (ratelimit.connect, ratelimit.connect_sync):\n"
        "    try:\n"
        "        connect()\n"
        "    except RuntimeError as exc:\n"
        "        print(exc)\n"
        "    else:\n"
        "        print('connected')\n"
    )
    env = {} if redis_url is None else {"REDIS_URL": redis_url}
    done = _run(library, "-c", code, cwd=tmp_path, **env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "connected" not in lines
    for line in lines:
        assert "no Redis named" in line and "fakeredis is not installed" in line
        assert "REDIS_URL" in line and "pip install 'ratelimit-lab[embedded]'" in line


@pytest.mark.real_redis
def test_the_readme_quick_start_runs_on_the_real_redis(library, tmp_path, real_redis_url):
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    source = re.search(r"```python\n(.*?)```", quick_start, re.S)
    assert source, "the README's Quick start has no Python example"
    done = _run(library, "-c", source.group(1), cwd=tmp_path, REDIS_URL=real_redis_url)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # a Redis was named: nothing to say
    lines = done.stdout.splitlines()
    # 12 checks at 10 per second on a real server: 10 admitted, then 2 rejected, each told
    # to come back in 1 s.
    assert [line.split()[0] for line in lines] == ["True"] * 10 + ["False"] * 2, lines
    assert [int(line.split()[1]) for line in lines[:10]] == list(range(9, -1, -1)), lines
    assert lines[10:] == ["False 0 1", "False 0 1"], lines


@pytest.mark.timeout(600)  # a cold venv: the planner's kernels compile on first use
def test_the_lab_extra_plans_the_example_log(lab, tmp_path):
    out = tmp_path / "plan.json"
    done = _run(
        lab, "-m", "ratelimit.lab", "plan", "--limit", "100/min", "--algorithm", "log",
        "--no-progress", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "planning the lab's example log" in text
    assert "Who is hurt" in text and "Redis plan" in text
    # Nobody named a Redis: nothing is measured, and the plan says so.
    assert "no Redis named" in text
    plan = json.loads(out.read_text())
    assert plan["server_time"]["kind"] in ("bench", "none")
    assert "no Redis named" in plan["server_time"]["note"]
    # The bytes per key come from the table shipped in the package (shown relative to
    # where it is installed).
    assert plan["memory_table"] == "ratelimit/lab/data/memory_per_key.csv"
    [candidate] = plan["candidates"]
    assert candidate["limit_text"] == "100/min" and candidate["algorithm"] == "log"
    assert candidate["requests"] > 10_000 and 0 < candidate["rejected"] < candidate["requests"]
    assert candidate["redis"]["memory_bytes"] > 0 and candidate["redis"]["keys"] > 0


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The python of a venv holding the package with the `http` extra (still no fakeredis)."""
    yield from _venv_with(tmp_path_factory, "http", f"{ROOT}[http]")


@pytest.mark.real_redis
def test_the_readme_first_example_protects_a_route(http, tmp_path, real_redis_url):
    """The README's first example, saved as app.py as a user would, answers 12 requests of
    one API key with 10 times 200, then 429s that say when to come back."""
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, re.S)
    assert first and "rate_limit(" in first.group(1), "the first example protects no route"
    (tmp_path / "app.py").write_text(first.group(1))
    client = (
        "import asyncio, httpx\n"
        "from app import app\n"
        "async def main():\n"
        "    transport = httpx.ASGITransport(app=app)\n"
        "    async with httpx.AsyncClient(transport=transport, base_url='http://app') as web:\n"
        "        for _ in range(12):\n"
        "            r = await web.get('/search', params={'q': 'x'},\n"
        "                              headers={'x-api-key': 'readme-%d' % id(web)})\n"
        "            print(r.status_code, r.headers.get('retry-after'), r.headers['ratelimit'])\n"
        "asyncio.run(main())\n"
    )
    done = _run(http, "-c", client, cwd=tmp_path, REDIS_URL=real_redis_url)
    assert done.returncode == 0, done.stderr
    lines = [line.split(" ", 2) for line in done.stdout.splitlines()]
    assert [status for status, _, _ in lines] == ["200"] * 10 + ["429"] * 2, lines
    assert all(retry == "None" for _, retry, _ in lines[:10])
    assert all(retry == "1" for _, retry, _ in lines[10:]), lines
    assert all(field.startswith('"search";r=0') for _, _, field in lines[10:]), lines
