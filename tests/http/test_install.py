"""The library a service installs needs neither numpy, pandas nor matplotlib: importing it
loads none of them, and the demo API runs from a fresh venv with only the `http` extra and
the embedded Redis (`embedded`), and says which Redis it uses."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ratelimit.devtools.process import free_port, pid_alive
from tests.conftest import _missing

ROOT = Path(__file__).resolve().parents[2]
LAB_STACK = ("numpy", "pandas", "matplotlib")
LIBRARY = ("ratelimit", "ratelimit.sync", "ratelimit.http", "ratelimit.demo", "ratelimit.costs")


def _loaded_after(imports: tuple[str, ...], python: str = sys.executable) -> list[str]:
    code = (
        "import importlib, sys\n"
        f"for name in {list(imports)!r}: importlib.import_module(name)\n"
        f"print(' '.join(m for m in {list(LAB_STACK)!r} if m in sys.modules))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_the_library_imports_without_the_lab_stack():
    assert _loaded_after(LIBRARY) == []
    # The control: the lab does load it, so the check above can tell.
    assert set(_loaded_after(("ratelimit.lab",))) >= {"numpy", "pandas"}


@pytest.fixture(scope="module")
def http_only_python(tmp_path_factory) -> str:
    """A new venv holding this project with the `http` and `embedded` extras and nothing
    else, at the versions of requirements.lock."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        _missing(f"uv is not installed beside {sys.executable}; `make setup` installs it")
    venv = tmp_path_factory.mktemp("http-only") / "venv"
    env = {**os.environ, "UV_LINK_MODE": "copy"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv], check=True, env=env)
    python = str(venv / "bin" / "python")
    install = [uv, "pip", "install", "-q", "--python", python]
    subprocess.run(
        [*install, "--constraint", ROOT / "requirements.lock", f"{ROOT}[http,embedded]"],
        check=True,
        env=env,
    )
    return python


def test_the_http_and_embedded_extras_install_no_lab_stack(http_only_python):
    code = f"import importlib.util as u; print([m for m in {LAB_STACK!r} if u.find_spec(m)])"
    out = subprocess.run([http_only_python, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    assert _loaded_after(LIBRARY, http_only_python) == []


def test_the_demo_runs_from_a_venv_with_only_the_http_extra(http_only_python, tmp_path):
    """On the embedded Redis, which its log names (and no warning: the demo asks for it)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # the embedded backend
    log = open(tmp_path / "demo.log", "wb")
    server = subprocess.Popen(
        [http_only_python, "-m", "ratelimit.demo", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, (tmp_path / "demo.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the demo did not answer within 30 s"
                time.sleep(0.1)
        params = {"lng": 13.4, "lat": 52.5, "radius": 500}
        start = time.monotonic()
        with httpx.Client(base_url=url, headers={"x-api-key": "k"}) as client:
            statuses = [client.get("/within", params=params).status_code for _ in range(12)]
        elapsed = time.monotonic() - start
        # 10 per rolling second: twelve requests inside one second get exactly ten through;
        # on a machine slow enough to spread them wider, the window lets more in, never
        # more than 10 per second they took.
        assert statuses[:10] == [200] * 10 and set(statuses) <= {200, 429}
        if elapsed < 1:
            assert statuses == [200] * 10 + [429] * 2
        else:
            assert statuses.count(200) <= 10 * math.ceil(elapsed), (statuses, elapsed)
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
    assert not pid_alive(server.pid)
    logged = (tmp_path / "demo.log").read_text()
    assert "rate limits in the embedded fakeredis (REDIS_URL unset)" in logged
    assert "EmbeddedRedisWarning" not in logged
