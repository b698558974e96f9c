"""A cell on Flower's deployment engine (fedrepro.fl.deploy): a SuperLink and one SuperNode per
client on loopback, TLS with a throwaway CA, SuperNode authentication, ``flwr run``.

* the deployed cell gives the same bytes as the in-process engine for the same seed (adapters and
  round log); the in-process engine gives the same bytes as Flower's simulation engine
  (tests/test_fedmcp_runner.py), so all three engines agree;
* a SuperNode whose key was not registered, or that has no key, is refused by the SuperLink and
  never becomes a node of the federation;
* no process of a run is left behind, after a finished run and after a failed one.

Each run spawns one ClientApp process per message (Flower 1.41's subprocess isolation), so a
2-round, 3-client cell takes about a minute here (docs/federation.md has the measured times).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import time
from pathlib import Path

import helpers
import pytest

from fedrepro.fl.cell import run_cell
from fedrepro.fl.deploy import (
    DeploymentOptions,
    FederationError,
    LocalFederation,
    deployment_options,
    processes_with_env,
    run_deployment,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]  # make test-e2e

CLIENT_SIZES = {"Academic": 6, "Committee": 3, "Product": 4}  # unequal |D_i|: a non-trivial eq. 2
FLOWER_TOOLS = (
    "flower-superlink",
    "flower-supernode",
    "flower-superexec",
    "flwr",
    "flwr-serverapp",
    "flwr-clientapp",
)


def _missing() -> str | None:
    if not Path("/proc/self/environ").exists():
        return "the deployment launcher finds its processes through /proc (Linux only)"
    bin_dir = str(Path(sys.executable).parent)
    path = bin_dir + os.pathsep + os.environ.get("PATH", "")
    absent = [t for t in FLOWER_TOOLS if shutil.which(t, path=path) is None]
    if absent:
        return f"Flower's deployment commands {absent} are not installed beside {sys.executable}"
    try:
        import cryptography  # noqa: F401 - makes the throwaway CA and the SuperNode keys
    except ImportError:
        return "the cryptography package (a flwr dependency) is missing"
    return None


if (_reason := _missing()) is not None:
    pytest.skip(_reason, allow_module_level=True)


def _outputs(out: Path) -> tuple[Path, Path, Path]:
    return out / "adapters.safetensors", out / "train_log.json", out / "provenance.json"


def _leftovers(report: dict) -> list[str]:
    """Processes of a run still alive: by its FLWR_HOME marker and by every PID it recorded."""
    alive = [
        f"{pid} ({report['processes'].get(pid, '?')})"
        for pid in processes_with_env("FLWR_HOME", report["flwr_home"])
    ]
    for pid, command in report["processes"].items():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue  # gone
        zombie = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z"
        if not zombie and f"FLWR_HOME={report['flwr_home']}".encode() in environ.split(b"\0"):
            alive.append(f"{pid} ({command})")
    return sorted(set(alive))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Three clients' partitions, a tiny BART backbone and the in-process reference run."""
    root = tmp_path_factory.mktemp("deploy")
    folders = {}
    for client, n_train in CLIENT_SIZES.items():
        folders.update(
            helpers.make_partitions(root / "data", clients=(client,), sizes=(n_train, 2, 2))
        )
    backbone = helpers.make_backbone(root)
    cell = helpers.make_cell(
        root, "AdaFedSelectKD", backbone, folders, rounds=2, out_name="inprocess"
    )
    cell["engine"] = "inprocess"
    t0 = time.monotonic()
    run_cell(cell, *_outputs(Path(cell["out_dir"])))
    return {"root": root, "folders": folders, "cell": cell, "inprocess_s": time.monotonic() - t0}


@pytest.fixture(scope="module")
def deployed(world):
    """The same cell through the deployment engine; each SuperNode gets a private copy of its own
    partition, and the folders the cell names are moved away first, so the run can only succeed
    if every node reads the folder its node config gives it."""
    root, cell = world["root"], world["cell"]
    node_data = {}
    for i, client in enumerate(cell["clients"]):
        node_data[client] = str(
            shutil.copytree(world["folders"][client], root / f"node{i}-disk" / client)
        )
    (root / "data").rename(root / "data-elsewhere")
    deployed = dict(cell, engine="deployment", out_dir=str(root / "deployment"))
    options = DeploymentOptions(workdir=str(root / "federation"), node_data=node_data)
    t0 = time.monotonic()
    try:
        with deployment_options(options):
            run_cell(deployed, *_outputs(Path(deployed["out_dir"])))
    finally:
        (root / "data-elsewhere").rename(root / "data")
    return {
        "cell": deployed,
        "report": options.report,
        "seconds": time.monotonic() - t0,
        "workdir": root / "federation",
    }


def test_deployed_cell_gives_the_same_bytes_as_the_inprocess_engine(world, deployed):
    ref_adapters, ref_log, ref_prov = _outputs(Path(world["cell"]["out_dir"]))
    adapters, train_log, provenance = _outputs(Path(deployed["cell"]["out_dir"]))
    report = deployed["report"]
    print(
        f"\ndeployment run: {deployed['seconds']:.1f} s (Flower run {report['seconds']:.1f} s), "
        f"in-process: {world['inprocess_s']:.1f} s"
    )
    assert report["status"] == "finished:completed"
    assert adapters.read_bytes() == ref_adapters.read_bytes()
    assert train_log.read_bytes() == ref_log.read_bytes()
    log = json.loads(train_log.read_text())["rounds"]
    assert [[c["partition_id"] for c in r["clients"]] for r in log] == [[0, 1, 2], [0, 1, 2]]
    assert [c["num_examples"] for c in log[0]["clients"]] == list(CLIENT_SIZES.values())
    prov, ref = json.loads(provenance.read_text()), json.loads(ref_prov.read_text())
    assert prov["engine"] == "deployment" and ref["engine"] == "inprocess"
    assert (
        prov["config_hash"] == ref["config_hash"]
    )  # the engine is not part of what a cell computes


def test_the_federation_ran_with_tls_node_auth_and_one_partition_per_node(world, deployed):
    logs = deployed["workdir"] / "logs"
    superlink = (logs / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:" in superlink  # TLS on the one SuperLink port
    assert superlink.count("[ControlServicer.RegisterNode] Created node_id=") == 3
    assert "SuperNode authentication is disabled" not in superlink
    assert "Successfully installed fedrepro-cell" in (logs / "flwr-run.log").read_text()
    commands = set(deployed["report"]["processes"].values())
    assert {
        "flower-superlink",
        "flower-supernode",
        "flower-superexec",
        "flwr-serverapp",
        "flwr-clientapp",
    } <= commands
    # no runtime dependency installation anywhere (Flower logs "Installing application
    # dependencies..." before a `uv sync`; "Successfully installed fedrepro-cell" is the FAB unpacked)
    for path in logs.glob("*.log"):
        text = path.read_text(errors="replace")
        assert "Installing application dependencies" not in text and "uv sync" not in text, (
            path.name
        )


def test_no_process_is_left_behind_after_a_run(deployed):
    assert _leftovers(deployed["report"]) == []


def test_unregistered_or_keyless_supernode_is_refused(tmp_path):
    """SuperLink with --enable-supernode-auth: a SuperNode is admitted only with a key registered
    through `flwr supernode register`; the others exit, and the SuperLink logs why."""
    from cryptography.hazmat.primitives import serialization

    with LocalFederation(tmp_path / "federation") as fed:
        fed.start_superlink()
        member = fed.add_node("member", 0, None)
        intruder = fed.add_node("intruder", 0, None)  # claims the member's partition
        keyless = fed.add_node("keyless", 1, None)
        keyless.private_key = None  # Flower makes itself a throwaway key and asks to register it
        ids = fed.register([member])
        for node in (member, intruder, keyless):
            fed.start_node(node)
        codes = {n.name: n.proc.wait(timeout=90) for n in (intruder, keyless)}
        nodes = fed.node_list()
        member_alive = member.proc.poll() is None
        intruder_log = fed.log_tail("supernode-intruder", 100_000)
        keyless_log = fed.log_tail("supernode-keyless", 100_000)
        superlink_log = fed.log_tail("superlink", 1_000_000)
        report = {"processes": dict(fed.seen), "flwr_home": str(fed.flwr_home)}
    assert codes["intruder"] != 0 and codes["keyless"] != 0
    assert (
        "Exit Code: 305" in intruder_log
        and "[code: 2004] Failed to activate SuperNode." in intruder_log
    )
    assert "[code: 2001] SuperNode authentication is enabled" in keyless_log
    # the SuperLink refused exactly the intruder's public key
    public = serialization.load_ssh_public_key(intruder.public_key.read_bytes())
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    body = base64.b64encode(
        public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    ).decode()
    refused = [
        line
        for line in superlink_log.splitlines()
        if "No SuperNode found with the given public key" in line
    ]
    assert len(refused) == 1 and body[:60] in refused[0].replace("\\n", ""), pem.decode()
    assert '"POST /v1/fleet/register-node HTTP/1.1" 412' in superlink_log
    # the federation holds the registered member only, and it is online
    assert member_alive
    assert [(int(n["node-id"]), n["status"]) for n in nodes] == [(ids["member"], "online")]
    assert _leftovers(report) == []


def test_a_failed_run_stops_every_process_it_started(world, tmp_path):
    """A run cut off mid-round (here by its time limit) raises, and leaves nothing running --
    neither the daemons nor the ServerApp/ClientApp processes they spawned."""
    cell = dict(world["cell"], engine="deployment", out_dir=str(tmp_path / "cut"))
    options = DeploymentOptions(workdir=str(tmp_path / "federation"), timeout_s=15)
    with pytest.raises(FederationError, match="did not finish within 15 s"):
        run_deployment(cell, options)
    report = options.report
    assert "flwr-serverapp" in report["processes"].values()  # it was mid-run
    assert _leftovers(report) == []
