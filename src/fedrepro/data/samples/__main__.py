"""``python -m fedrepro.data.samples <source> <out_dir> [--seed N] [--scale N]``.

Writes the generated sample of one registered data source (any name of
``fedrepro.data.sources.SOURCE_MODULES``) into ``out_dir`` in the source's raw layout, through the
registry: ``fedrepro.data.sources.get(source).write_samples(out_dir, seed=seed, scale=scale)``.
``--scale 1`` (the default) with ``--seed 0`` writes the committed ``resources/samples/<source>/``
byte for byte; ``--scale N`` writes ``N`` times the records of every split (see
:mod:`fedrepro.data.samples`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fedrepro.data import sources
from fedrepro.data.samples import check_scale
from fedrepro.io import InputError


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and write the sample; prints the counts per split to stderr. Returns 0, or 2
    with a message for an unknown source or an invalid ``--scale``."""
    parser = argparse.ArgumentParser(
        prog="python -m fedrepro.data.samples",
        description="Write the generated raw-schema sample of one data source.",
    )
    parser.add_argument("source", help=f"registered source: {', '.join(sources.names())}")
    parser.add_argument("out_dir", help="output folder (e.g. resources/samples/<source>)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="write N times the records of every split (default 1: the committed sample)",
    )
    args = parser.parse_args(argv)
    try:
        scale = check_scale(args.scale)
        source = sources.get(args.source)
        counts = source.write_samples(args.out_dir, seed=args.seed, scale=scale)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.source}: {counts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
