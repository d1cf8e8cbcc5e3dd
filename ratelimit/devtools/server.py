"""A private, throw-away redis-server on a free loopback port.

For notebooks that need a real Redis (memory figures) when none is configured, and for
tests that restart, stop or break a server without touching anyone else's:

    from ratelimit.devtools.server import RedisServer

    if RedisServer.available():                   # redis-server on PATH?
        with RedisServer() as server:             # started on enter, stopped on exit
            client = server.client()              # or redis.Redis.from_url(server.url)
            client.ping()

The server keeps nothing on disk (`--save '' --appendonly no`), listens on 127.0.0.1
only, and runs in a working directory of its own: a new temporary one (removed by
`close()` and on leaving the `with` block) unless `workdir` is given. `stop()` ends
exactly the process this object started, by its PID, and `restart()` brings it back
on the same port, empty. A server still running when the Python process exits is
stopped then too.

`tls=True` serves TLS only (`--port 0 --tls-port <port>`), with a throw-away CA and a
server certificate for 127.0.0.1 and localhost (subjectAltName) that `openssl` makes in
the working directory at every start (clients read the CA file again when they
reconnect, so a restart does not strand them). `url` is then
`rediss://127.0.0.1:<port>/0?ssl_ca_certs=<ca_path>`, which redis-py's `from_url` (and
`ratelimit.connect`) verify against that CA, hostname included. `tls_client_auth=True`
also makes the server require a client certificate signed by the same CA; `url` then
names the client's certificate and key (`ssl_certfile`, `ssl_keyfile`) too.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from .process import LocalProcess, free_port

__all__ = ["RedisServer", "TlsFiles", "free_port", "make_certificates"]

EXECUTABLE = "redis-server"
OPENSSL = "openssl"
TLS_HOSTS = ("127.0.0.1", "localhost")  # the names the server certificate is valid for
_START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it


class RedisServer(LocalProcess):
    """One redis-server process: start, wait until it answers, stop by PID, restart.

    - `workdir`: where the server runs and writes its log (`redis-<port>.log`); by
      default a temporary directory of its own, removed by `close()`.
    - `port`: default a free loopback port, chosen at the first `start()` and kept
      by `restart()` so that clients can reconnect to the same `url`.
    - `args`: extra `redis-server` options, e.g. `("--maxmemory", "10mb")`.
    - `tls`: serve TLS only, with certificates made on the fly (see the module's doc);
      `tls_client_auth`: also require client certificates; `tls_hosts`: the names
      (IP addresses, DNS names) the server certificate is valid for.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        port: int | None = None,
        *,
        args: tuple[str, ...] | list[str] = (),
        executable: str = EXECUTABLE,
        tls: bool = False,
        tls_client_auth: bool = False,
        tls_hosts: tuple[str, ...] = TLS_HOSTS,
    ) -> None:
        if not isinstance(tls, bool) or not isinstance(tls_client_auth, bool):
            raise ValueError("tls and tls_client_auth must be True or False")
        if tls_client_auth and not tls:
            raise ValueError("tls_client_auth needs tls=True")
        super().__init__(workdir, port if port is not None else free_port())
        self._fixed_port = port is not None
        self.args = tuple(args)
        self.executable = executable
        self.tls = tls
        self.tls_client_auth = tls_client_auth
        self.tls_hosts = tuple(tls_hosts)
        if not self.tls_hosts or not all(isinstance(h, str) and h for h in self.tls_hosts):
            raise ValueError(f"tls_hosts must be host names or addresses, got {tls_hosts!r}")

    # Queries -----------------------------------------------------------------------

    @staticmethod
    def available(executable: str = EXECUTABLE) -> bool:
        """True when `redis-server` (or `executable`) is on PATH."""
        return shutil.which(executable) is not None

    @staticmethod
    def tls_available(executable: str = EXECUTABLE) -> bool:
        """True when `redis-server` (or `executable`) and `openssl` are on PATH."""
        return shutil.which(executable) is not None and shutil.which(OPENSSL) is not None

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:<port>/0`; with TLS `rediss://` and the certificate options."""
        if not self.tls:
            return f"redis://127.0.0.1:{self.port}/0"
        files = self.tls_files
        options = {"ssl_ca_certs": str(files.ca_cert)}
        if self.tls_client_auth:
            options.update(ssl_certfile=str(files.client_cert), ssl_keyfile=str(files.client_key))
        return f"rediss://127.0.0.1:{self.port}/0?{urlencode(options, safe='/', quote_via=quote)}"

    @property
    def tls_files(self) -> TlsFiles:
        """Where this server's CA, certificates and keys are (made by `start()`)."""
        if not self.tls:
            raise RuntimeError("this server was made without tls=True")
        if self.workdir is None:
            raise RuntimeError("the certificates are made by start(): start the server first")
        return TlsFiles.under(self.workdir / "tls")

    @property
    def ca_path(self) -> Path:
        """The throw-away CA's certificate, for a client's `ssl_ca_certs`."""
        return self.tls_files.ca_cert

    def client(self, **kwargs: Any) -> redis.Redis:
        """A synchronous client for this server (keyword arguments go to `from_url`)."""
        return redis.Redis.from_url(self.url, **kwargs)

    def _probe_options(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        files = self.tls_files
        # The CA is checked; the name is the clients' business (see `tls_hosts`).
        options: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": str(files.ca_cert),
            "ssl_check_hostname": False,
        }
        if self.tls_client_auth:
            options.update(ssl_certfile=str(files.client_cert), ssl_keyfile=str(files.client_key))
        return options

    # Life cycle --------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and return once it answers (a no-op if it runs).

        Raises `FileNotFoundError` when the executable is missing and `RuntimeError`
        (with the end of the server's log) when it exits or stays silent.
        """
        if self.running:
            return self
        if not self.available(self.executable):
            raise FileNotFoundError(f"{self.executable} is not on PATH")
        workdir = self._workdir("ratelimit-redis-")
        if self.tls:  # new ones at every start: nothing stale or expired is ever served
            make_certificates(workdir / "tls", self.tls_hosts)
        # Only a port this object picked itself, and only before it was ever used, may
        # be swapped for another when someone else grabbed it first.
        attempts = 1 if self._fixed_port else _START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout)
                self._fixed_port = True  # from now on restarts keep this port and URL
                return self
            except _PortTaken:
                if attempt == attempts:
                    raise RuntimeError(self._failure("exited at start (port taken?)")) from None
                self.port = free_port()
        return self

    def _options(self) -> list[str]:
        options = {
            "port": str(self.port),
            "bind": "127.0.0.1",
            "save": "",  # no snapshots
            "appendonly": "no",  # no append-only file
            "dir": str(self.workdir),
            "enable-debug-command": "local",  # DEBUG SLEEP etc., from loopback only
        }
        if self.tls:  # TLS only: no plain-text port at all
            files = self.tls_files
            options.update(
                {
                    "port": "0",
                    "tls-port": str(self.port),
                    "tls-cert-file": str(files.server_cert),
                    "tls-key-file": str(files.server_key),
                    "tls-ca-cert-file": str(files.ca_cert),
                    "tls-auth-clients": "yes" if self.tls_client_auth else "no",
                }
            )
        return [part for name, value in options.items() for part in (f"--{name}", value)]

    def _start_once(self, timeout: float) -> None:
        process = self._spawn([self.executable, *self._options(), *self.args], self._log_path())
        deadline = time.monotonic() + timeout
        client = redis.Redis(  # no retries of its own: this loop is the retry
            host="127.0.0.1",
            port=self.port,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
            **self._probe_options(),
        )
        try:
            while True:
                if process.poll() is not None:
                    self.process = self._box[0] = None
                    if "Address already in use" in self._log_tail():
                        raise _PortTaken
                    raise RuntimeError(self._failure("exited at start"))
                try:
                    # Our process, not another server already listening on the port,
                    # and done loading any data set (until then it answers LOADING).
                    info = client.info()
                    if info.get("process_id") == process.pid and not info.get("loading"):
                        return
                except redis.exceptions.RedisError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(self._failure(f"did not answer within {timeout} s"))
                time.sleep(0.02)
        finally:
            client.close()

    def restart(self) -> None:
        """Stop and start again on the same port: the data set is gone afterwards."""
        self.stop()
        self.start()

    # Diagnostics -------------------------------------------------------------------

    def _log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / f"redis-{self.port}.log"

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self._log_path().read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        where = f"{self.executable} on 127.0.0.1:{self.port}"
        return f"{where} {what}; its log ends:\n{self._log_tail()}"


class _PortTaken(Exception):
    pass


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and the certificates it signed, as files (PEM)."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def under(cls, directory: Path) -> TlsFiles:
        names = ("ca.crt", "ca.key", "server.crt", "server.key", "client.crt", "client.key")
        return cls(*(directory / name for name in names))


def make_certificates(
    directory: str | Path, hosts: tuple[str, ...] = TLS_HOSTS, *, client: bool = True
) -> TlsFiles:
    """Make a new CA in `directory` and, signed by it, a server certificate valid for
    `hosts` (IP addresses and DNS names, in its subjectAltName) and, with `client`, a
    client certificate. Keys are P-256, valid for two days. FileNotFoundError without
    `openssl`; RuntimeError with its message when it fails."""
    if shutil.which(OPENSSL) is None:
        raise FileNotFoundError(f"{OPENSSL} is not on PATH")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles.under(folder)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req", "-x509", *key, "-keyout", files.ca_key, "-out", files.ca_cert, "-days", "2",
        "-subj", "/CN=ratelimit throw-away test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    names = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
    leaves = [("server", files.server_cert, files.server_key, "serverAuth", names)]
    if client:
        leaves.append(("client", files.client_cert, files.client_key, "clientAuth", ""))
    for name, cert, private, usage, alt in leaves:
        extensions = folder / f"{name}.ext"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
            "subjectKeyIdentifier=hash",
            "authorityKeyIdentifier=keyid",
        ]
        if alt:
            lines.append(f"subjectAltName={alt}")
        extensions.write_text("\n".join(lines) + "\n")
        request = folder / f"{name}.csr"
        _openssl("req", "-new", *key, "-keyout", private, "-out", request,
                 "-subj", f"/CN=ratelimit test {name}")  # fmt: skip
        _openssl("x509", "-req", "-in", request, "-CA", files.ca_cert, "-CAkey", files.ca_key,
                 "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", extensions)  # fmt: skip
    return files


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _openssl(*args: str | Path) -> None:
    done = subprocess.run(
        [OPENSSL, *map(str, args)], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")
