"""Flower ServerApp for one federated cell: the server procedure (AdaFedSelecKD Algorithm 1,
lines 1–10; FedMCP Algorithm 1, server side): FedAvg of the shared tensors weighted by |D_i|."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedrepro.devices import cell_device
from fedrepro.fl.checkpoint import checkpoint_paths, load_state, prepare_checkpoints
from fedrepro.fl.strategy import SortedCheckpointFedAvg
from fedrepro.fl.tasks import strategy_factory, task_for

log = logging.getLogger(__name__)


def start_point(cell: dict) -> tuple[int, OrderedDict[str, torch.Tensor] | None]:
    """``(finished rounds, state to start from)``: where a cell stands, for every engine.

    A checkpoint made under another cell config is discarded, a finished round is resumed from;
    the state is ``None`` when every round is already done."""
    done = prepare_checkpoints(cell)
    if done >= int(cell["train"]["rounds"]):
        return done, None
    if done:
        log.info("resuming %s from round %d", cell["out_dir"], done)
        return done, load_state(checkpoint_paths(cell["out_dir"], done)[0])
    return done, task_for(cell).initial_state(cell)


def run_server(grid: Grid, cell: dict, initial_state: OrderedDict[str, torch.Tensor], round_offset: int) -> None:
    """Run rounds ``round_offset+1 … rounds`` on ``grid`` starting from ``initial_state``.

    All clients take part in every round (participation 100%: AdaFedSelecKD §IV-D, FedMCP §V-A);
    ``clients_per_round`` in the cell config lowers it (AdaFedSelecKD's client sampling, Fig. 10).
    """
    n_clients = len(cell["clients"])
    per_round = int(cell.get("clients_per_round") or n_clients)
    kwargs = dict(
        out_dir=cell["out_dir"],
        round_offset=round_offset,
        expected_clients=per_round,
        seed=int(cell["seed"]),
        timeout=float(cell.get("round_timeout_s", 3600)),
        fraction_train=per_round / n_clients,
        fraction_evaluate=0.0,
        min_train_nodes=per_round,
        min_evaluate_nodes=0,
        min_available_nodes=n_clients,
        weighted_by_key="num-examples",
        check_device=str(cell_device(cell)),  # the server-step check on the cell's GPU, if any
    )
    # a paper whose server does more than FedAvg supplies its own strategy (a subclass)
    make = strategy_factory(cell)
    strategy = make(cell, **kwargs) if make else SortedCheckpointFedAvg(**kwargs)
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_state),
        num_rounds=int(cell["train"]["rounds"]) - round_offset,
        timeout=float(cell.get("round_timeout_s", 3600)),
        train_config=ConfigRecord({"cell": json.dumps(cell), "round-offset": round_offset}),
    )


def make_server_app(cell: dict, initial_state: OrderedDict[str, torch.Tensor], round_offset: int) -> ServerApp:
    """A ServerApp running :func:`run_server` (simulation and deployment engines)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, cell, initial_state, round_offset)

    return app
