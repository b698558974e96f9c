"""Client splits.  AdaFedSelecKD's main setting is *natural*: one client per QMSum domain (§II-A)."""

from __future__ import annotations

from fedrepro.io import InputError, read_jsonl, write_jsonl_atomic


def natural_partition(records_path: str, out_path: str, client: str) -> int:
    """Write ``client``'s records (one domain = one client) to the client's own partition file.

    Every record must already belong to ``client``; a stray record is an error, not silently moved.
    """
    records = read_jsonl(records_path)
    stray = [r.get("id") for r in records if r.get("client") != client]
    if stray:
        raise InputError(
            f"{records_path}: {len(stray)} records do not belong to client {client!r} "
            f"(first: {stray[0]}); the prepared file and the partition disagree"
        )
    return write_jsonl_atomic(out_path, sorted(records, key=lambda r: r["id"]))
