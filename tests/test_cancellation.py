"""A client call given up on stops (:mod:`fedrepro.cancellation`): a stalled or slow client's
worker thread must not go on training -- re-seeding and drawing from the process's torch
generator -- beside what the process runs next.  CI once failed on exactly that: the stalled
client of tests/test_no_hang.py woke from its failpoint sleep in the middle of the next test
file's run (tests/test_waves.py) and changed its bits."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import torch
from flwr.app import RecordDict
from test_fedsumm_runner import _cell, _run, world  # noqa: F401 (fixture)
from test_no_hang import _cell as _stall_cell
from test_no_hang import _fails_within
from test_no_hang import world as nohang_world  # noqa: F401 (fixture)

from fedrepro import cancellation
from fedrepro.cancellation import Cancelled, Token
from fedrepro.devices import StepTimer
from fedrepro.fl import checkpoint as ckpt
from fedrepro.fl import engine, failpoints
from fedrepro.fl.client_app import ClientError, _bounded


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["out"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _sleeping_worker(token: Token, seconds: float) -> tuple[threading.Thread, dict]:
    """A thread sleeping ``seconds`` under ``token`` (cancellable)."""

    def sleeper():
        with cancellation.cancellable(token):
            cancellation.sleep(seconds)

    return _in_thread(sleeper)


# -- the tokens ----------------------------------------------------------------------------------
def test_safe_points_do_nothing_outside_a_cancellable_block_or_before_a_cancel():
    cancellation.check()
    assert not cancellation.cancelled() and cancellation.current() is None
    token = Token("work")
    with cancellation.cancellable(token) as t:
        assert t is token and cancellation.current() is token
        cancellation.check()
    assert cancellation.current() is None

    def short_sleeps():
        cancellation.sleep(0.01)  # no token: time.sleep
        with cancellation.cancellable(Token("work")):
            cancellation.sleep(0.01)  # a token never cancelled: the full (short) sleep, no error
        return "slept"

    th, box = _in_thread(short_sleeps)
    th.join(5)  # a sleep that never ends fails here, not by hanging the test
    assert not th.is_alive() and box == {"out": "slept"}


def test_a_cancelled_token_raises_at_the_safe_points_of_its_thread_only():
    token = Token("client X's train of round 2")
    token.cancel()
    with cancellation.cancellable(token):
        assert cancellation.cancelled()
        with pytest.raises(Cancelled, match="client X's train of round 2 was given up on"):
            cancellation.check()
        with pytest.raises(Cancelled):
            cancellation.sleep(600)  # returns at once
        t, box = _in_thread(cancellation.check)  # another thread: not this token's work
        t.join(10)
        assert "exc" not in box
    cancellation.check()  # the block restored "no token"


def test_cancelling_a_parent_cancels_its_children_made_before_or_after():
    parent = Token("grid message")
    before = Token("bounded call", parent=parent)
    unrelated = Token("other")
    assert not before.cancelled
    parent.cancel()
    assert before.cancelled and not unrelated.cancelled
    after = Token("late bounded call", parent=parent)
    assert after.cancelled
    child = Token("child", parent=Token("p2"))
    child.cancel()  # a child's cancel leaves its parent alone
    assert child.cancelled


def test_cancellation_wakes_a_sleeping_worker_at_once():
    token = Token("sleeper")
    t, box = _sleeping_worker(token, 600)
    time.sleep(0.2)
    assert t.is_alive()
    token.cancel()
    t.join(5)  # far below the 600 s sleep
    assert not t.is_alive() and isinstance(box["exc"], Cancelled)


def test_giving_up_waits_for_the_worker_and_logs_one_it_cannot_stop(caplog):
    cancellable_work = Token("cancellable work")
    t, _ = _sleeping_worker(cancellable_work, 60)
    time.sleep(0.1)
    assert cancellation.give_up(cancellable_work, t, grace=5) and not t.is_alive()
    stuck_work = Token("client Z's train of round 1")
    stuck, _ = _in_thread(lambda: time.sleep(1.0))  # inside one call: no safe point reached
    with caplog.at_level(logging.WARNING, logger="fedrepro.cancellation"):
        assert not cancellation.give_up(stuck_work, stuck, grace=0.05)
    assert stuck_work.cancelled
    assert "client Z's train of round 1 was given up on and is still running" in caplog.text
    stuck.join(5)


# -- the safe points --------------------------------------------------------------------------
def test_a_training_step_and_a_checkpoint_write_are_safe_points(tmp_path):
    timer = StepTimer()
    token = Token("work")
    with cancellation.cancellable(token):
        with timer.step():
            pass
        ckpt.save_state(tmp_path / "a.safetensors", {"w": torch.ones(2)})
        token.cancel()
        with pytest.raises(Cancelled):
            with timer.step():
                raise AssertionError("the step's body must not run")
        with pytest.raises(Cancelled):
            ckpt.save_state(tmp_path / "b.safetensors", {"w": torch.ones(2)})
    assert timer.steps == 1
    assert (tmp_path / "a.safetensors").exists() and not (tmp_path / "b.safetensors").exists()


def test_the_failpoint_sleep_is_cancellable(monkeypatch):
    monkeypatch.setenv(failpoints.ENV, json.dumps({"client_train": {"Committee": "sleep:60"}}))
    token = Token("work")

    def stalled():
        with cancellation.cancellable(token):
            failpoints.hit("client_train", "Committee")

    t, box = _in_thread(stalled)
    time.sleep(0.2)
    token.cancel()
    t.join(5)  # far below the 60 s sleep
    assert not t.is_alive() and isinstance(box.get("exc"), Cancelled)


def test_the_in_process_grid_cancels_a_client_that_misses_its_deadline():
    """The grid's own deadline (the whole round's) can pass before the ClientApp's bound (which
    starts with the client's call): the grid cancels the call's work itself and waits for it."""
    seen: dict = {}

    def app(msg, context):  # a stalled ClientApp, as far as the grid can tell
        seen["token"] = cancellation.current()
        cancellation.sleep(60)
        return msg

    grid = engine.InProcessGrid(app, 1, client_names=["Committee"])
    with engine.server_identity():
        msg = grid.create_message(RecordDict(), "train", 1, "1")
        t0 = time.monotonic()
        (reply,) = grid.send_and_receive([msg], timeout=0.3)
    assert time.monotonic() - t0 < 10  # not the 60 s sleep
    assert reply.has_error() and "did not reply within the round's time limit" in reply.error.reason
    assert seen["token"].cancelled and "client Committee (partition 0)" in seen["token"].what
    assert not [t for t in threading.enumerate() if t.name == "client-node-1" and t.is_alive()]


def test_a_bounded_call_that_gives_up_stops_its_worker_after_at_most_the_step_it_is_in():
    steps_after_cancel: list[int] = []
    started = threading.Event()

    def work():  # a slow client: steps of 0.05 s, far more than the limit allows
        timer = StepTimer()
        started.set()
        for _ in range(10_000):
            with timer.step():
                time.sleep(0.05)
                if cancellation.cancelled():
                    steps_after_cancel.append(1)
        return "finished"

    cell = {"round_timeout_s": 0.5}
    with pytest.raises(ClientError, match="did not finish its train of round 3 within the round's time limit"):
        _bounded(cell, "Committee", 1, 3, "train", work)
    assert started.is_set()
    assert not [t for t in threading.enumerate() if t.name == "fedrepro-client-Committee"]
    assert len(steps_after_cancel) <= 1  # the step it was in, none after


def test_a_bounded_call_inside_a_cancelled_caller_is_cancelled_too():
    grid = Token("grid message")
    ran: list[str] = []

    def work():
        ran.append("work")
        return "done"

    grid.cancel()
    with cancellation.cancellable(grid), pytest.raises(ClientError, match="Cancelled"):
        _bounded({"round_timeout_s": 60}, "Academic", 0, 1, "train", work)
    assert ran == []  # stopped before the work started


# -- the runner: a stalled in-process client is gone when the cell has failed ------------------------
def test_a_stalled_in_process_client_is_stopped_when_its_cell_fails_and_the_next_run_keeps_its_bits(
    nohang_world, world, tmp_path, monkeypatch  # noqa: F811
):
    reference = _run(_cell(world, tmp_path, "ct", "FedSUMM", "reference", rounds=2))
    monkeypatch.setenv(failpoints.ENV, json.dumps({"client_train": {"Committee": "sleep:60"}}))
    _fails_within(_stall_cell(nohang_world, tmp_path, "inprocess", 2.0), 30.0)
    # the grid's deadline cancelled the stalled client: no worker left to wake up later
    assert not [t for t in threading.enumerate() if t.name.startswith(("fedrepro-client-", "client-node-"))
                and t.is_alive()]
    monkeypatch.delenv(failpoints.ENV)
    again = _run(_cell(world, tmp_path, "ct", "FedSUMM", "again", rounds=2))
    assert (again / "adapters.safetensors").read_bytes() == (reference / "adapters.safetensors").read_bytes()
