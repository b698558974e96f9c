"""``python -m fedrepro.fl.deploy``: certificates, SuperNode keys, and one cell on a loopback
deployment (``run-cell``) or the outputs of a cell a real federation finished (``outputs``).

The command line lives apart from :mod:`fedrepro.fl.deploy` so that the deployment engine never
imports the cell runner (:mod:`fedrepro.fl.cell` imports the engine, this module imports both).
"""

from __future__ import annotations

import argparse
import logging
import sys

from fedrepro.fl import deploy
from fedrepro.fl.cell import run_cell
from fedrepro.fl.checkpoint import latest_round
from fedrepro.fl.deploy import (
    DEFAULT_APP_DIR,
    DeploymentOptions,
    deployment_options,
    make_node_key,
    make_test_ca,
)
from fedrepro.io import InputError, read_json

log = logging.getLogger("fedrepro.fl.deploy")


# -- command line ------------------------------------------------------------------------------
def _node_data_arg(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        client, sep, folder = item.partition("=")
        if not sep or not client or not folder:
            raise InputError(f"--node-data {item!r}: expected CLIENT=FOLDER")
        out[client] = folder
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedrepro.fl.deploy", description=deploy.__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("certs", help="a throwaway CA and a server certificate (tests and trials)")
    p.add_argument("out_dir")
    p.add_argument(
        "--host",
        action="append",
        help="the SuperLink's DNS name or IP address as SuperNodes reach it (repeatable); "
        "127.0.0.1 and localhost are always added",
    )
    p.add_argument("--days", type=int, default=7)
    p = sub.add_parser(
        "node-key", help="a SuperNode key pair (P-384 ECDSA, OpenSSH format): KEY and KEY.pub"
    )
    p.add_argument("private_key")
    p = sub.add_parser(
        "run-cell", help="run one cell on a loopback deployment and write run_cell's outputs"
    )
    p.add_argument("--cell", required=True, help="cell JSON")
    p.add_argument("--adapters", required=True)
    p.add_argument("--train-log", required=True)
    p.add_argument("--provenance", required=True)
    p.add_argument(
        "--node-data",
        action="append",
        default=[],
        metavar="CLIENT=FOLDER",
        help="the folder a client's SuperNode reads (default: the cell's client_data)",
    )
    p.add_argument(
        "--workdir",
        help="keep keys, FLWR_HOME and daemon logs here (default: a temp folder, removed)",
    )
    p.add_argument("--app-dir", help=f"the Flower app folder (default {DEFAULT_APP_DIR})")
    p.add_argument("--timeout", type=float, help="seconds for the whole run")
    p = sub.add_parser(
        "outputs",
        help="write run_cell's outputs for a cell whose rounds a real federation finished",
    )
    for name in ("--cell", "--adapters", "--train-log", "--provenance"):
        p.add_argument(name, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    if args.command == "certs":
        # the SuperLink's own SuperExec reaches it on loopback (a bind-all --host 0.0.0.0 becomes
        # 127.0.0.1), so the certificate always names 127.0.0.1 and localhost too
        hosts = tuple(dict.fromkeys([*(args.host or []), "127.0.0.1", "localhost"]))
        files = make_test_ca(args.out_dir, hosts, args.days)
        print(
            f"CA: {files.ca_cert}\nserver certificate: {files.server_cert}\nserver key: {files.server_key}"
        )
        return 0
    if args.command == "node-key":
        private, public = make_node_key(args.private_key)
        print(
            f"private key (SuperNode --auth-supernode-private-key): {private}\n"
            f"public key (flwr supernode register): {public}"
        )
        return 0

    cell = dict(read_json(args.cell), engine="deployment")
    if args.command == "outputs":
        done, rounds = latest_round(cell["out_dir"]), int(cell["train"]["rounds"])
        if done < rounds:
            raise InputError(
                f"{cell['out_dir']}: {done} of {rounds} rounds finished; run the cell with flwr run first"
            )
        run_cell(cell, args.adapters, args.train_log, args.provenance)
        return 0
    options = DeploymentOptions(
        workdir=args.workdir,
        node_data=_node_data_arg(args.node_data) or None,
        app_dir=args.app_dir,
        timeout_s=args.timeout,
    )
    with deployment_options(options):
        run_cell(cell, args.adapters, args.train_log, args.provenance)
    log.info(
        "deployment run %s: %s in %.1f s",
        options.report.get("run_id"),
        options.report.get("status"),
        options.report.get("seconds", 0.0),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
