"""A site's egress for the tests, from real parts: Debian's tinyproxy (a maintained HTTP proxy
that tunnels https:// with CONNECT and can demand Basic credentials) on a loopback port, a
certificate authority of the test's own (openssl), and a node with no route out: a user and
network namespace (`unshare -rn`) with only its own loopback, whose one way out is the proxy,
bridged in by socat over a unix socket (the namespace's 127.0.0.1 is not the host's).

`make proxy-install` installs tinyproxy and socat as root, as `make slurm-install` installs
Slurm; without them, or where namespaces are not permitted, the tests skip, saying why."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "as root: make proxy-install (apt-get install tinyproxy socat)"
# Generous: a start on a loaded 2-core host takes well under a second; ten times that fails.
START_TIMEOUT_S = 30.0
# tinyproxy's line for each request it took, at LogLevel Connect and above
_REQUEST = re.compile(r"Request \(file descriptor \d+\): (\S+) (\S+) HTTP/1\.[01]")


@functools.cache
def missing_proxy() -> str | None:
    """Why no test through the site proxy can run here, or None when tinyproxy is installed."""
    if not shutil.which("tinyproxy"):
        return f"tinyproxy is not installed ({INSTALL_HINT})"
    if not shutil.which("openssl"):
        return "openssl is not installed (apt-get install openssl): no certificate to make"
    return None


@functools.cache
def missing_namespace() -> str | None:
    """Why no node without a route out can be made here, or None."""
    missing = missing_proxy()
    if missing:
        return missing
    if not shutil.which("socat"):
        return f"socat is not installed ({INSTALL_HINT})"
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        return "needs unshare and ip (util-linux, iproute2)"
    allowed = subprocess.run(
        [unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True, check=False
    )
    if allowed.returncode != 0:
        return f"user and network namespaces are not permitted here: {allowed.stderr!r}"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    """Until something accepts on 127.0.0.1:`port`; raises if `process` exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it listened")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in {START_TIMEOUT_S} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class Tinyproxy:
    """tinyproxy in the foreground on 127.0.0.1, its config and log in `folder`."""

    def __init__(
        self,
        folder: Path,
        *,
        auth: tuple[str, str] | None = None,
        connect_ports: Sequence[int] = (),
    ) -> None:
        self.folder = folder
        self.auth = auth
        self.connect_ports = connect_ports  # none: CONNECT to any port
        self.port = 0
        self.log_path = folder / "tinyproxy.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The proxy's URL, without credentials."""
        return f"http://127.0.0.1:{self.port}"

    def url_with_credentials(self) -> str:
        assert self.auth is not None
        return f"http://{self.auth[0]}:{self.auth[1]}@127.0.0.1:{self.port}"

    def start(self) -> Tinyproxy:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        lines = [
            f"Port {self.port}",
            "Listen 127.0.0.1",
            "Timeout 120",
            "MaxClients 50",
            "LogLevel Info",  # each connection and request, never a header
            f'LogFile "{self.log_path}"',
            f'PidFile "{self.folder / "tinyproxy.pid"}"',
            *(f"ConnectPort {port}" for port in self.connect_ports),
        ]
        if self.auth:
            lines.append(f"BasicAuth {self.auth[0]} {self.auth[1]}")
        config = self.folder / "tinyproxy.conf"
        config.write_text("\n".join(lines) + "\n")
        binary = shutil.which("tinyproxy")
        assert binary is not None, INSTALL_HINT
        with (self.folder / "tinyproxy.out").open("wb") as out:
            self._process = subprocess.Popen(  # -d: stay in the foreground, ours to stop
                [binary, "-d", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
            )
        wait_listening(self.port, self._process, "tinyproxy")
        return self

    def stop(self) -> None:
        if self._process is not None:
            stop(self._process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def requests(self) -> list[tuple[str, str]]:
        """(method, target) of every request tinyproxy took, from its log."""
        return [(m.group(1), m.group(2)) for m in _REQUEST.finditer(self.log())]


@contextmanager
def tinyproxy(
    folder: Path, *, auth: tuple[str, str] | None = None, connect_ports: Sequence[int] = ()
) -> Iterator[Tinyproxy]:
    proxy = Tinyproxy(folder, auth=auth, connect_ports=connect_ports).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@dataclass(frozen=True)
class Authority:
    """A certificate authority of the test's own and a server certificate it signed for
    `localhost`: what a site's CA is to its nodes (trusted through SSL_CERT_FILE)."""

    ca: Path
    cert: Path
    key: Path


def make_authority(folder: Path) -> Authority:
    openssl = shutil.which("openssl")
    assert openssl is not None
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    cert, key, request = folder / "cert.pem", folder / "key.pem", folder / "cert.csr"
    extensions = folder / "server.ext"
    extensions.write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
         "/CN=deepdive test site CA", "-keyout", ca_key, "-out", ca],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
         "-keyout", key, "-out", request],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-days", "2", "-extfile", extensions, "-out", cert],
    ]  # fmt: skip
    for step in steps:
        subprocess.run([openssl, *map(str, step)], capture_output=True, check=True)
    return Authority(ca, cert, key)


@contextmanager
def bridge(port: int) -> Iterator[Path]:
    """A unix socket whose every connection socat carries to 127.0.0.1:`port` on this host: a
    namespace without a route out reaches the proxy through it (see in_namespace). Under a
    short folder of its own: a socket's path holds at most 107 bytes, a tmp_path may not."""
    folder = Path(tempfile.mkdtemp(prefix="dd-proxy-"))
    path = folder / "proxy.sock"
    binary = shutil.which("socat")
    assert binary is not None, INSTALL_HINT
    process = subprocess.Popen(  # fixed arguments
        [binary, f"UNIX-LISTEN:{path},fork,mode=600", f"TCP:127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"socat did not listen on {path}")
            time.sleep(0.02)
        yield path
    finally:
        stop(process)
        shutil.rmtree(folder, ignore_errors=True)


# Run inside the namespace: loopback up, socat listening on 127.0.0.1:$2 and carrying each
# connection to the unix socket $1 (the host's proxy), then the Python script $3 with its
# arguments. The port is taken once socat answers on it.
_INSIDE = """
ip link set lo up || exit 90
socat TCP-LISTEN:"$2",bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:"$1" &
bridge=$!
tries=0
until "$0" -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$2" 2>/dev/null; do
  tries=$((tries + 1)); [ "$tries" -gt 600 ] && exit 91
  sleep 0.05
done
shift 2
"$0" "$@"
status=$?
kill "$bridge"
exit "$status"
"""


def in_namespace(
    python: str,
    socket_path: Path,
    port: int,
    script: str,
    *arguments: str,
    cwd: Path,
    environment: dict[str, str] | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`python -c script arguments` in a new user and network namespace with only loopback,
    the proxy behind `socket_path` at 127.0.0.1:`port` there. `environment`: added to this
    process's."""
    unshare = shutil.which("unshare")
    assert unshare is not None
    command = [unshare, "-rn", "sh", "-c", _INSIDE, python, str(socket_path), str(port)]
    return subprocess.run(
        [*command, "-c", script, *arguments],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(environment or {})},
        timeout=timeout_s,
        check=False,
    )
