"""Flower deployment engine for one federated cell: a SuperLink, one SuperNode per client, ``flwr run``.

The same ClientApp (:mod:`fedrepro.fl.client_app`) and server procedure
(:func:`fedrepro.fl.server_app.run_server`) that the ``simulation`` and ``inprocess`` engines
use, run as separate Flower processes talking HTTPS:

* ``server_app`` (below) is the ServerApp that ``flwr run`` starts on the SuperLink's machine.  It
  reads the cell from the JSON file named by the run config key ``cell-file``, finds where the
  cell stands (last finished round, as :func:`fedrepro.fl.cell.run_federated` does) and runs the
  remaining rounds.  The app's ``pyproject.toml`` (the FAB ``flwr run`` builds) is ``deploy/`` at
  the repository root; it names ``fedrepro.fl.deploy:server_app`` and
  ``fedrepro.fl.client_app:app``, so ``fedrepro`` must be installed wherever the apps run --
  nothing is installed at run time.
* :class:`LocalFederation` starts the daemons on this machine (loopback): ``flower-superlink``
  with TLS and SuperNode authentication, registers each SuperNode's public key with
  ``flwr supernode register``, starts one ``flower-supernode`` per client that is given only its
  own partition (``--node-config "partition-id=<i> data-dir='<folder>'"``), submits the run with
  ``flwr run`` and stops every process it started, by PID, also on failure.
* :func:`run_deployment` is the ``deployment`` engine of :func:`fedrepro.fl.cell.run_federated`;
  ``python -m fedrepro.fl.deploy run-cell`` (:mod:`fedrepro.fl.deploy.__main__`) runs a cell this way and writes the same outputs as
  :func:`fedrepro.fl.cell.run_cell` (adapters, round log, provenance).

TLS material for tests comes from :func:`make_test_ca` (a throwaway CA and a server certificate
for the given host names / IP addresses) and :func:`make_node_key` (a P-384 ECDSA key pair in
OpenSSH format, the kind ``flwr supernode register`` accepts).  docs/federation.md shows the same
steps across machines.

Every run gets its own ``FLWR_HOME`` (inside the run's work folder) and
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``; the SuperLink is also started with
``--disable-runtime-dependency-installation``.  Linux only (processes are found through /proc).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedrepro.host_memory import one_arena_environment
from fedrepro.io import InputError, read_json, write_json_atomic

log = logging.getLogger(__name__)

#: the Flower app folder (``pyproject.toml`` with ``[tool.flwr.app.components]``) in a source checkout
DEFAULT_APP_DIR = Path(__file__).resolve().parents[4] / "deploy"
#: name of the SuperLink connection written to the run's ``$FLWR_HOME/config.toml``
CONNECTION = "fedrepro"


# -- the ServerApp ------------------------------------------------------------------------------
def read_cell_file(path: str) -> dict:
    if not path:
        raise InputError(
            "the ServerApp needs the cell file: flwr run <app> <connection> --run-config 'cell-file=\"/abs/cell.json\"'"
        )
    if not Path(path).is_file():
        raise InputError(
            f"cell file {path} (run config cell-file) not found on the SuperLink's machine"
        )
    cell = read_json(path)
    for key in ("clients", "train", "out_dir", "seed"):
        if key not in cell:
            raise InputError(f"{path}: not a federated cell (no {key!r} key)")
    return cell


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    from fedrepro.fl.server_app import run_server, start_point

    # our own INFO lines only: a root handler at INFO would also log every HTTP request Flower's
    # log forwarding makes, which is forwarded again, and so on
    ours = logging.getLogger("fedrepro")
    if not ours.handlers:
        ours.addHandler(logging.StreamHandler())
        ours.setLevel(logging.INFO)
    cell = read_cell_file(str(context.run_config.get("cell-file", "")))
    done, initial = start_point(cell)
    if initial is None:
        log.info("%s: all %d rounds already finished", cell["out_dir"], done)
        return
    run_server(grid, cell, initial, done)


# -- TLS certificates and SuperNode keys ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """The SuperLink's TLS files: ``ca_cert`` goes to every SuperNode (``--root-certificates``)
    and to the flwr CLI (``root-certificates`` in ``$FLWR_HOME/config.toml``); the SuperLink
    takes all three (``--ssl-ca-certfile``, ``--ssl-certfile``, ``--ssl-keyfile``)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_test_ca(
    out_dir: str | os.PathLike, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 7
) -> TLSFiles:
    """A throwaway CA (``ca.crt``/``ca.key``) and a server certificate (``server.pem``/``server.key``)
    valid for ``hosts`` (DNS names or IP addresses, all put in the subjectAltName).  For tests and
    trials only: a real federation's server certificate comes from the site's own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise InputError(
            "make_test_ca: give at least one host name or IP address for the server certificate"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedrepro throwaway test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    pem = serialization.Encoding.PEM
    files = TLSFiles(out / "ca.crt", out / "server.pem", out / "server.key")
    _write_private(
        out / "ca.key",
        ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    _write_private(
        files.server_key,
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    files.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    files.server_cert.write_bytes(server_cert.public_bytes(pem))
    return files


def make_node_key(private_path: str | os.PathLike) -> tuple[Path, Path]:
    """A SuperNode key pair: P-384 ECDSA in OpenSSH format (what ``ssh-keygen -t ecdsa -b 384 -N ''``
    writes); the SuperNode gets the private key (``--auth-supernode-private-key``), the SuperLink's
    operator registers the public one (``flwr supernode register KEY.pub <connection>``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_path = Path(private_path)
    private_path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    public_path = private_path.with_name(private_path.name + ".pub")
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return private_path, public_path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


# -- processes ---------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name (field 2) may hold spaces and parentheses: split after the last ')'
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pids: list[int]) -> set[int]:
    """Every live process below ``pids`` (children, grandchildren, ...)."""
    tree, seen, todo = _children(), set(), list(pids)
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def processes_with_env(name: str, value: str) -> set[int]:
    """Live processes whose environment holds ``name=value`` exactly -- a run's own ``FLWR_HOME``
    marks every process it started, including ones re-parented after their parent died."""
    marker = f"{name}={value}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in env and _alive(int(entry.name)):
            found.add(int(entry.name))
    return found


def _command(pid: int) -> str:
    """A short name for a process: the Flower command it runs (``flwr-clientapp``, ...)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return "?"
    names = [Path(a).name for a in argv[:3]]
    flower = [n for n in names if n.startswith(("flwr", "flower"))]
    return flower[0] if flower else (names[0] if names else "?")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"  # a zombie is gone


class FederationError(RuntimeError):
    """The deployment could not start, or the run did not finish; the message names the process
    and quotes the end of its log."""


@dataclasses.dataclass
class Node:
    name: str
    partition_id: int
    private_key: Path | None
    public_key: Path | None
    data_dir: str | None
    port: int
    proc: subprocess.Popen | None = None


class LocalFederation:
    """A SuperLink and SuperNodes on this machine, with TLS and SuperNode authentication.

    Use as a context manager: on exit every process started here (the daemons, the processes they
    spawned -- SuperExec, ServerApp, ClientApps -- and the ``flwr`` CLI calls) is stopped by PID,
    whatever happened.  ``workdir`` holds ``flwr-home/`` (this run's ``FLWR_HOME``), ``tls/``,
    ``keys/`` and one log per process in ``logs/``.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        host: str = "127.0.0.1",
        node_auth: bool = True,
        startup_timeout_s: float = 60.0,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.host = host
        self.node_auth = node_auth
        self.startup_timeout_s = startup_timeout_s
        # every process runs in the caller's folder, so the relative paths of a cell (out_dir,
        # backbone_dir, client_data, as the workflow writes them) mean the same in all of them
        self.cwd = Path.cwd()
        self.flwr_home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self.tls: TLSFiles | None = None
        self.superlink_port: int | None = None
        self.superlink: subprocess.Popen | None = None
        self.nodes: list[Node] = []
        self._started: list[subprocess.Popen] = []
        #: every process of this federation ever observed: PID -> command
        self.seen: dict[int, str] = {}
        self._ports: set[int] = set()
        bin_dir = str(Path(sys.executable).parent)
        self.env = dict(os.environ)
        self.env.update(
            {
                "FLWR_HOME": str(self.flwr_home),
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1",
                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        # glibc's malloc limited to one arena in the SuperLink, SuperNodes and the apps they start
        # (fedrepro.host_memory: read when a process starts; a user's own value wins)
        one_arena_environment(self.env)
        for tool in (
            "flower-superlink",
            "flower-supernode",
            "flower-superexec",
            "flwr",
            "flwr-serverapp",
            "flwr-clientapp",
        ):
            if shutil.which(tool, path=self.env["PATH"]) is None:
                raise FederationError(
                    f"{tool} not found beside {sys.executable} or on PATH: install flwr==1.41.0"
                )

    # -- lifecycle
    def __enter__(self) -> Self:
        for sub in ("flwr-home", "logs"):  # a fresh FLWR_HOME and fresh logs for every run
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        for sub in ("flwr-home", "logs", "tls", "keys"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except FederationError:
            if exc_type is None:
                raise
            log.exception("while stopping %s after: %s", self.workdir, exc)  # keep the first error

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        logfile = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed by the child's exit
        try:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.cwd,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            logfile.close()
        self._started.append(proc)
        self.seen[proc.pid] = Path(argv[0]).name
        log.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
        return proc

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def our_processes(self) -> set[int]:
        pids = descendants([p.pid for p in self._started if p.poll() is None])
        pids |= {p.pid for p in self._started if p.poll() is None}
        pids |= processes_with_env("FLWR_HOME", str(self.flwr_home))
        for pid in pids - set(self.seen):
            self.seen[pid] = _command(pid)
        return pids

    def port(self) -> int:
        """A free TCP port on this machine not yet handed out to this federation."""
        while (port := free_port(self.host)) in self._ports:
            pass
        self._ports.add(port)
        return port

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process of this federation, SIGKILL what is left after ``grace_s``."""
        pids = self.our_processes()
        for pid in sorted(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for p in self._started:
                p.poll()  # reap our own children
            pids = {pid for pid in pids | self.our_processes() if _alive(pid)}
            if not pids:
                break
            time.sleep(0.1)
        for pid in sorted(pids):
            log.warning("process %d did not stop on SIGTERM within %.0f s: SIGKILL", pid, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        left = {pid for pid in self.our_processes() if _alive(pid)}
        if left:
            raise FederationError(f"processes {sorted(left)} of {self.workdir} survived SIGKILL")

    # -- the SuperLink
    def start_superlink(self, tls: TLSFiles | None = None) -> None:
        self.tls = tls or make_test_ca(self.workdir / "tls", hosts=(self.host, "localhost"))
        self.superlink_port = self.port()
        argv = [
            "flower-superlink",
            "--host",
            self.host,
            "--port",
            str(self.superlink_port),
            "--ssl-ca-certfile",
            str(self.tls.ca_cert),
            "--ssl-certfile",
            str(self.tls.server_cert),
            "--ssl-keyfile",
            str(self.tls.server_key),
            "--disable-runtime-dependency-installation",
            "--isolation",
            "subprocess",
        ]
        if self.node_auth:
            argv.append("--enable-supernode-auth")
        self.superlink = self._spawn("superlink", argv)
        self._write_connection()
        self._wait_listening("superlink", self.superlink, self.superlink_port)

    def _write_connection(self) -> None:
        """This run's ``$FLWR_HOME/config.toml``: one TLS connection to the SuperLink (no
        ``[tool.flwr.federations]`` in the app's pyproject: Flower 1.41 would migrate and
        comment it out)."""
        assert self.tls is not None
        text = (
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "{self.host}:{self.superlink_port}"\n'
            f'root-certificates = "{self.tls.ca_cert}"\n'
        )
        (self.flwr_home / "config.toml").write_text(text)

    def _wait_listening(self, name: str, proc: subprocess.Popen, port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise FederationError(
                    f"{name} exited with status {proc.returncode} while starting:\n"
                    f"{self.log_tail(name)}"
                )
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((self.host, port)) == 0:
                    return
            time.sleep(0.2)
        raise FederationError(
            f"{name} not listening on {self.host}:{port} after {self.startup_timeout_s:.0f} s:\n"
            f"{self.log_tail(name)}"
        )

    # -- the flwr CLI
    def flwr_start(self, name: str, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["flwr", *args],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._started.append(proc)
        self.seen[proc.pid] = "flwr " + args[0]
        proc.fedrepro_name = name  # type: ignore[attr-defined]
        return proc

    def flwr_finish(
        self, proc: subprocess.Popen, timeout_s: float = 120.0
    ) -> subprocess.CompletedProcess:
        """Wait for a ``flwr`` CLI call; its output goes to ``logs/<name>.log`` and is returned."""
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise FederationError(
                f"`{' '.join(proc.args)}` did not finish in {timeout_s:.0f} s:\n"
                f"{out.decode(errors='replace')[-3000:]}"
            ) from None
        text = out.decode(errors="replace")
        with open(self.logs / f"{proc.fedrepro_name}.log", "a") as fh:  # type: ignore[attr-defined]
            fh.write(text)
        return subprocess.CompletedProcess(proc.args, proc.returncode, text, "")

    def flwr(self, name: str, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """Run one ``flwr`` CLI command against this federation (its own FLWR_HOME)."""
        return self.flwr_finish(self.flwr_start(name, *args), timeout_s)

    @staticmethod
    def _json_out(result: subprocess.CompletedProcess, what: str) -> dict:
        """The JSON object a ``flwr ... --format json`` call printed (the last one)."""
        start = result.stdout.rfind('{\n  "success"')
        if start < 0:
            start = result.stdout.rfind('{"success"')
        try:
            if result.returncode != 0 or start < 0:
                raise ValueError(f"status {result.returncode}")
            return json.JSONDecoder().raw_decode(result.stdout[start:])[0]
        except ValueError as err:
            raise FederationError(f"{what} failed ({err}):\n{result.stdout[-3000:]}") from None

    def register_start(self, nodes: list[Node]) -> list[tuple[Node, subprocess.Popen]]:
        """Start ``flwr supernode register KEY.pub <connection>`` for each node, in parallel."""
        return [
            (
                n,
                self.flwr_start(
                    f"register-{n.name}",
                    "supernode",
                    "register",
                    str(n.public_key),
                    CONNECTION,
                    "--name",
                    n.name,
                    "--format",
                    "json",
                ),
            )
            for n in nodes
        ]

    def register_finish(self, calls: list[tuple[Node, subprocess.Popen]]) -> dict[str, int]:
        """Wait for :meth:`register_start`'s calls; ``{node name: node id the SuperLink gave it}``."""
        return {
            n.name: int(
                self._json_out(self.flwr_finish(proc), f"registering {n.public_key}")["node-id"]
            )
            for n, proc in calls
        }

    def register(self, nodes: list[Node]) -> dict[str, int]:
        """Register the nodes' public keys with the SuperLink (``flwr supernode register``)."""
        return self.register_finish(self.register_start(nodes))

    def node_list(self) -> list[dict]:
        """The SuperLink's nodes as ``flwr supernode ls --format json`` reports them
        (``node-id``, ``status``: registered / online / offline / unregistered, ...)."""
        return self._json_out(
            self.flwr("supernode-ls", "supernode", "ls", CONNECTION, "--format", "json"),
            "flwr supernode ls",
        )["nodes"]

    # -- SuperNodes
    def add_node(self, name: str, partition_id: int, data_dir: str | None) -> Node:
        """A SuperNode-to-be with its own key pair (register it with :meth:`register`)."""
        private, public = (
            make_node_key(self.workdir / "keys" / name) if self.node_auth else (None, None)
        )
        node = Node(name, partition_id, private, public, data_dir, self.port())
        self.nodes.append(node)
        return node

    def start_node(self, node: Node) -> subprocess.Popen:
        assert self.tls is not None and self.superlink_port is not None
        config = f"partition-id={node.partition_id}"
        if node.data_dir is not None:
            if "'" in node.data_dir:
                raise InputError(
                    f"data folder {node.data_dir!r}: a single quote cannot be passed in --node-config"
                )
            config += f" data-dir='{node.data_dir}'"
        argv = [
            "flower-supernode",
            "--superlink",
            f"{self.host}:{self.superlink_port}",
            "--root-certificates",
            str(self.tls.ca_cert),
            "--port",
            str(node.port),
            "--node-config",
            config,
            "--max-wait-time",
            str(self.startup_timeout_s),
        ]
        if node.private_key is not None:
            argv += ["--auth-supernode-private-key", str(node.private_key)]
        node.proc = self._spawn(f"supernode-{node.name}", argv)
        return node.proc

    # -- a run
    def submit(self, app_dir: Path, run_config: str) -> subprocess.Popen:
        """Start ``flwr run APP fedrepro --run-config ... --stream`` (it returns when the run
        ends); wait for it with :meth:`wait_run`."""
        return self._spawn(
            "flwr-run",
            ["flwr", "run", str(app_dir), CONNECTION, "--run-config", run_config, "--stream"],
        )

    def wait_run(self, proc: subprocess.Popen, timeout_s: float) -> int:
        """Wait for :meth:`submit`'s ``flwr run`` to end; fail at once if a daemon dies, or after
        ``timeout_s``; returns the run id."""
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            dead = [
                (f"supernode-{n.name}", n.proc.returncode)
                for n in self.nodes
                if n.proc is not None and n.proc.poll() is not None
            ]
            if self.superlink is not None and self.superlink.poll() is not None:
                dead.append(("superlink", self.superlink.returncode))
            if dead or time.monotonic() > deadline:
                what = (
                    ", ".join(f"{n} exited with status {rc}" for n, rc in dead)
                    if dead
                    else f"the run did not finish within {timeout_s:.0f} s"
                )
                tails = "\n".join(f"--- {n} ---\n{self.log_tail(n)}" for n, _ in dead)
                raise FederationError(
                    f"deployment run failed: {what}\n{tails}\n--- flwr run ---\n"
                    f"{self.log_tail('flwr-run')}"
                )
            self.our_processes()  # note the ServerApp/ClientApp PIDs while they live
            time.sleep(0.5)
        text = self.log_tail("flwr-run", 1_000_000)
        found = re.findall(r"Successfully started run (\d+)", text)
        if proc.returncode != 0 or not found:
            raise FederationError(f"flwr run failed (status {proc.returncode}):\n{text[-4000:]}")
        return int(found[-1])

    def run_status(self, run_id: int) -> str:
        """``finished:completed``, ``finished:failed``, ... as ``flwr ls --run-id`` reports it."""
        out = self.flwr("flwr-ls", "ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
        return str(self._json_out(out, f"flwr ls --run-id {run_id}")["runs"][0]["status"])


# -- the engine ----------------------------------------------------------------------------------
@dataclasses.dataclass
class DeploymentOptions:
    """How :func:`run_deployment` lays the federation out on this machine."""

    #: kept when given (logs, keys, FLWR_HOME); otherwise a temp folder, removed after the run
    workdir: str | None = None
    #: client -> the folder its SuperNode reads; default: the cell's client_data
    node_data: dict[str, str] | None = None
    #: the Flower app folder; default: deploy/ of this checkout
    app_dir: str | None = None
    #: limit for the whole run; default: (rounds + 1) x the cell's round_timeout_s
    timeout_s: float | None = None
    #: SuperLink with --enable-supernode-auth and registered SuperNode keys
    node_auth: bool = True
    #: filled in by run_deployment: run id, status, processes seen, seconds
    report: dict = dataclasses.field(default_factory=dict)


_OPTIONS: DeploymentOptions | None = None


@contextlib.contextmanager
def deployment_options(options: DeploymentOptions) -> Iterator[DeploymentOptions]:
    """Options for the ``deployment`` engine while :func:`fedrepro.fl.cell.run_cell` runs (the
    cell dict carries no deployment settings: they do not change what a cell computes)."""
    global _OPTIONS
    saved, _OPTIONS = _OPTIONS, options
    try:
        yield options
    finally:
        _OPTIONS = saved


def app_dir(options: DeploymentOptions) -> Path:
    path = Path(options.app_dir) if options.app_dir else DEFAULT_APP_DIR
    if not (path / "pyproject.toml").is_file():
        raise InputError(
            f"{path}/pyproject.toml not found: the Flower app folder (deploy/ in the fedrepro "
            "checkout); pass app_dir / --app-dir"
        )
    return path


def run_deployment(cell: dict, options: DeploymentOptions | None = None) -> dict:
    """Run the cell's remaining rounds on a loopback deployment: SuperLink (TLS, SuperNode auth),
    one authenticated SuperNode per client holding only its own data folder, ``flwr run``.
    Checkpoints land in ``cell['out_dir']`` as with the other engines; returns a report (run id,
    status, PIDs, seconds)."""
    options = options or _OPTIONS or DeploymentOptions()
    app = app_dir(options)
    node_data = options.node_data or cell["client_data"]
    missing = [c for c in cell["clients"] if c not in node_data]
    if missing:
        raise InputError(
            f"no data folder for client(s) {missing} (node_data / --node-data CLIENT=DIR)"
        )
    rounds = int(cell["train"]["rounds"])
    timeout = options.timeout_s or (rounds + 1) * float(cell.get("round_timeout_s", 3600))
    keep = options.workdir is not None
    workdir = (
        Path(options.workdir) if keep else Path(tempfile.mkdtemp(prefix="fr-deploy-", dir="/tmp"))
    )
    t0 = time.monotonic()
    report = options.report
    report.clear()
    report.update({"workdir": str(workdir), "clients": list(cell["clients"])})
    fed = LocalFederation(workdir, node_auth=options.node_auth)
    try:
        with fed:
            cell_file = workdir / "cell.json"
            write_json_atomic(cell_file, cell)
            fed.start_superlink()
            report["superlink_port"] = fed.superlink_port
            nodes = [
                fed.add_node(f"node{i}", i, str(Path(node_data[c]).resolve()))
                for i, c in enumerate(cell["clients"])
            ]
            registering = fed.register_start(nodes) if options.node_auth else []
            # submitted at once: the ServerApp waits for every client's SuperNode to come online
            run = fed.submit(app, f'cell-file="{cell_file}"')
            fed.register_finish(registering)
            for node in nodes:
                fed.start_node(node)
            run_id = fed.wait_run(run, timeout)
            status = fed.run_status(run_id)
            report.update({"run_id": run_id, "status": status})
            if status != "finished:completed":
                from fedrepro.fl.checkpoint import read_failure

                raise FederationError(
                    f"run {run_id} ended {status}: "
                    f"{read_failure(cell['out_dir']) or 'see the ServerApp log below'}\n"
                    f"--- flwr run (ServerApp log) ---\n{fed.log_tail('flwr-run')}"
                )
    finally:
        report["processes"] = dict(sorted(fed.seen.items()))
        report["flwr_home"] = str(fed.flwr_home)
        report["seconds"] = round(time.monotonic() - t0, 3)
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return report
