"""Fault injection for the reliability tests: named *failpoints* in the federated runner that
raise or stall a chosen client when the environment asks for it (the failpoint pattern of
FreeBSD's fail(9), etcd's gofail and TiKV's fail-rs, reduced to what the tests need).

A failpoint is inert unless ``FEDREPRO_FAILPOINTS`` is set, e.g.::

    FEDREPRO_FAILPOINTS='{"client_train": {"Committee": "raise"}}'
    FEDREPRO_FAILPOINTS='{"client_train": {"Committee": "sleep:60"}}'

The variable is read at each hit, from the environment of the process that runs the client: the
test process itself (in-process engine), the Ray workers (they inherit the driver's environment)
or the ClientApp processes of a deployed SuperNode (the launcher passes its environment on), so
one setting exercises every engine.  Actions: ``raise`` (a :class:`FailpointError`) and
``sleep:SECONDS``.  A malformed setting is an :class:`~fedrepro.io.InputError` naming the
variable, never a silently ignored fault.
"""

from __future__ import annotations

import json
import os

from fedrepro import cancellation
from fedrepro.io import InputError

ENV = "FEDREPRO_FAILPOINTS"


class FailpointError(RuntimeError):
    """The fault a ``raise`` failpoint injects."""


def _plan() -> dict:
    text = os.environ.get(ENV)
    if not text:
        return {}
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{ENV}={text!r} is not JSON ({exc}); expected {{point: {{client: action}}}}") from None
    if not isinstance(plan, dict) or not all(isinstance(v, dict) for v in plan.values()):
        raise InputError(f"{ENV}={text!r}: expected {{point: {{client: action}}}}")
    return plan


def hit(point: str, client: str) -> None:
    """Run the action set for ``(point, client)``, if any (a no-op when ``FEDREPRO_FAILPOINTS`` is
    unset)."""
    action = _plan().get(point, {}).get(client)
    if action is None:
        return
    if action == "raise":
        raise FailpointError(f"failpoint {point} raised for client {client}")
    if isinstance(action, str) and action.startswith("sleep:"):
        try:
            seconds = float(action.split(":", 1)[1])
        except ValueError:
            raise InputError(f"{ENV}: {point}.{client}: {action!r} is not sleep:SECONDS") from None
        # wakes at once, with Cancelled, when a bounded client call gives up on this client
        # (fedrepro.cancellation): a stalled client does not go on after its round has failed
        cancellation.sleep(seconds)
        return
    raise InputError(f"{ENV}: {point}.{client}: unknown action {action!r} (raise | sleep:SECONDS)")
