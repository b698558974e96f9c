"""Compare two ``results/`` trees file by file: the check that a refactor changed no output.

    python tests/compare_results.py A/results B/results

Every file must exist in both trees and be byte-identical, except ``provenance.json``, which is
compared as JSON without the keys that record when and from which commit it ran
(``wall_time_s``, ``git_commit``, ``timing``). Prints one line per difference and a summary; exits 1 when
anything differs, 0 when the trees are equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOLATILE_PROVENANCE_KEYS = ("wall_time_s", "git_commit", "timing")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _provenance(path: Path) -> dict:
    data = json.loads(path.read_text())
    for key in VOLATILE_PROVENANCE_KEYS:
        data.pop(key, None)
    return data


def compare(a: Path, b: Path) -> list[str]:
    """Human-readable differences between the trees ``a`` and ``b`` (empty when equal)."""
    fa, fb = _files(a), _files(b)
    out = [f"only in {a}: {f}" for f in sorted(fa - fb)]
    out += [f"only in {b}: {f}" for f in sorted(fb - fa)]
    for f in sorted(fa & fb):
        pa, pb = a / f, b / f
        if Path(f).name == "provenance.json":
            if _provenance(pa) != _provenance(pb):
                out.append(f"differs (beyond {', '.join(VOLATILE_PROVENANCE_KEYS)}): {f}")
        elif pa.read_bytes() != pb.read_bytes():
            out.append(f"differs: {f}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    a, b = Path(argv[0]), Path(argv[1])
    for root in (a, b):
        if not root.is_dir():
            print(f"{root}: not a folder", file=sys.stderr)
            return 2
    diffs = compare(a, b)
    for line in diffs:
        print(line)
    n = len(_files(a) | _files(b))
    print(f"{n} files compared: {'identical' if not diffs else f'{len(diffs)} differ'}"
          f" (provenance.json without {', '.join(VOLATILE_PROVENANCE_KEYS)})")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
