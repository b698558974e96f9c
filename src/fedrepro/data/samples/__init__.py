"""Generators of the committed samples (``resources/samples/<name>/``), in each source's raw schema.

The samples let the whole pipeline run and be tested without the real releases; they are written in
the upstream layouts and parsed by the same code as the real data (:mod:`fedrepro.data.sources`).
Every generator is deterministic: the same arguments give byte-identical files.

* :mod:`~fedrepro.data.samples.qmsum` — QMSum's three domains (``python -m
  fedrepro.data.samples.qmsum resources/samples/qmsum``);
* :mod:`~fedrepro.data.samples.samsum`, :mod:`~fedrepro.data.samples.cnndm`,
  :mod:`~fedrepro.data.samples.pubmed`, :mod:`~fedrepro.data.samples.wikihow`,
  :mod:`~fedrepro.data.samples.reddit_tifu` — the English summarization sources (shared helpers in
  :mod:`~fedrepro.data.samples._english`);
* :mod:`~fedrepro.data.samples.glue` — the six GLUE tasks;
* :mod:`~fedrepro.data.samples.meetings` — AMI, ICSI, ELITR and MeetingBank;
* :mod:`~fedrepro.data.samples.chinese` — CSL, NLPCC2017, LCSTS, THUCNews and EDUCATION
  (``python -m fedrepro.data.samples.chinese resources/samples``).

A source's generator is also reachable through the registry:
``fedrepro.data.sources.get(name).write_samples(out_dir, seed=0, scale=1)``, and from the command
line as ``python -m fedrepro.data.samples <source> <out_dir> [--seed N] [--scale N]``.

Every generator takes ``scale`` (default 1): ``scale=1`` writes the committed samples byte for
byte; ``scale=k`` writes ``k`` times the records of every split in the same raw schema (a rehearsal
of the paper-scale grid, with many clients, needs more records than the committed copies hold).
The extra records come after the ``scale=1`` ones, from random streams derived from the seed, the
split and the copy number (``…/scale/<copy>``), with ids that do not collide with the ``scale=1``
ones, so the ``scale=1`` records are always a part of a larger sample.
"""

from __future__ import annotations

from typing import Any

from fedrepro.io import InputError

__all__ = ["check_scale"]


def check_scale(scale: Any) -> int:
    """``scale`` if it is an integer ``>= 1`` (not a bool); otherwise an :class:`InputError` naming
    ``scale``."""
    if isinstance(scale, bool) or not isinstance(scale, int):
        raise InputError(f"scale must be an integer >= 1, got {scale!r} ({type(scale).__name__})")
    if scale < 1:
        raise InputError(f"scale must be an integer >= 1, got {scale}")
    return scale
