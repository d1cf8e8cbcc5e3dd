"""`python -m ratelimit`: the command line, and the key it names for a route's client."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ratelimit
from ratelimit import identity, keys
from ratelimit.__main__ import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out.strip()


def test_key_names_the_key_the_demo_route_writes(capsys):
    pytest.importorskip("fastapi")
    from ratelimit.demo import create_app

    app = create_app(ratelimit.connect(embedded=True))
    # The demo keeps plain keys: the key is the one the seed types.
    printed = run(capsys, "key", "demo", "--scope", "geofence", "--window-ms", "1000",
                  "--plain-keys")  # fmt: skip
    assert printed == app.state.limits["geofence"].key_for("demo") == "rl:geofence:key:demo"
    assert printed == keys.route_key("demo", scope="geofence", window_ms=1000, plain=True)
    # Not the limiter's key for the bare API key, which no route ever writes.
    assert printed != app.state.limits["geofence"].limiter.key_for("demo")
    by_address = run(
        capsys, "key", "--address", "192.0.2.1", "--scope", "tiles", "--window-ms", "1000",
        "--plain-keys",
    )  # fmt: skip
    assert by_address == app.state.limits["tiles"].key_for(address="192.0.2.1")
    assert by_address == "rl:tiles:address:192.0.2.1"
    # Another prefix, another key: the prefix is the app's.
    hashed = create_app(ratelimit.connect(embedded=True), prefix="demo")
    assert hashed.state.limits["geofence"].key_for("demo") == "demo:geofence:key:demo"


@pytest.mark.parametrize("algorithm", ["log", "logc", "fw", "swc", "gcra"])
def test_key_matches_every_limiter_of_the_same_options(capsys, algorithm):
    spec = ratelimit.algorithms.get(algorithm)
    redis = ratelimit.connect_sync(embedded=True)
    for readable, window_s in [(False, 1), (True, 1), (False, 60)]:
        limiter = spec.build("sync", redis, window_s, 10, "svc", readable_keys=readable)
        flags = ["--readable-keys"] if readable else []
        printed = run(capsys, "key", "k-1", "--scope", "s", "--prefix", "svc",
                      "--algorithm", algorithm, "--window-ms", str(window_s * 1000),
                      *flags)  # fmt: skip
        assert printed == limiter.key_for(identity.route_identity("s", "key", "k-1"))
        assert printed.startswith(f"svc:{spec.name}:{window_s * 1000}:")


def test_the_route_identity_is_built_in_one_place():
    pytest.importorskip("fastapi")
    from ratelimit.http import ClientIdentity, rate_limit

    limiter = ratelimit.SlidingWindowLimiter(ratelimit.connect(embedded=True), 1, 10)
    route = rate_limit(limiter, scope="geofence")
    who = ClientIdentity("key", "demo")
    assert (
        route.limiter_identity(who)
        == "geofence:key:demo"
        == identity.route_identity("geofence", "key", "demo")
    )
    assert route.key_for("demo") == keys.route_key("demo", scope="geofence", window_ms=1000)
    with pytest.raises(ValueError, match="kind"):
        identity.route_identity("geofence", "user", "demo")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["key", "--window-ms", "1000"], "exactly one of api_key and address"),
        (["key", "k", "--address", "192.0.2.1", "--window-ms", "1000"],
         "exactly one of api_key and address"),
        (["key", "k", "--prefix", "a{b", "--window-ms", "1000"], "braces"),
        (["key", "k"], "--window-ms"),
        (["key", "k", "--algorithm", "leaky"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_python_dash_m_ratelimit_prints_the_key():
    out = subprocess.run(
        [sys.executable, "-m", "ratelimit", "key", "demo", "--scope", "geofence",
         "--prefix", "demo", "--window-ms", "1000"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    expected = keys.route_key("demo", scope="geofence", prefix="demo", window_ms=1000)
    assert out.stdout == expected + "\n"
    # The command line imports the library only: no web framework, no lab.
    code = (
        "import sys, ratelimit.__main__; "
        "print(sorted({'fastapi', 'numpy', 'pandas'} & set(sys.modules)))"
    )
    listed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert listed.stdout.strip() == "[]"


def test_version_is_the_distributions(capsys):
    from importlib.metadata import version

    assert ratelimit.__version__ == version("ratelimit-lab")
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"ratelimit-lab {ratelimit.__version__}\n"


def test_a_source_tree_without_an_install_reads_its_pyproject(monkeypatch):
    import importlib.metadata
    import tomllib
    from pathlib import Path

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(ratelimit._metadata, "version", not_installed)
    pyproject = Path(ratelimit.__file__).resolve().parents[1] / "pyproject.toml"
    with open(pyproject, "rb") as f:
        assert ratelimit._version() == tomllib.load(f)["project"]["version"]
