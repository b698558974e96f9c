"""Client splits for the four papers: deterministic functions of (ids, seed, parameters).

Every function here works on example *ids* (or on index ranges) and returns plain lists, so that
a split is reproducible from its manifest alone and testable without any model.  The workflow
writes each result as a manifest ``{client: {split: [ids]}}`` (:func:`write_manifest`) and one
jsonl file per client and split (:func:`materialize`).

Where Flower Datasets has a partitioner that does the job, it would be the natural choice; its
current release (flwr-datasets 0.6.1) requires ``datasets<5``, which conflicts with the pinned
``datasets`` 5.2 of this project, so the few lines of index bookkeeping are written here, each
with a test of the sizes the papers state (docs/decisions.md, "partitioners").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from fedrepro.io import InputError, read_jsonl, write_json_atomic, write_jsonl_atomic

Manifest = dict[str, dict[str, list[str]]]


def _rng(seed: int, *salt: int | str) -> np.random.Generator:
    """A generator seeded by (seed, salt…), independent of Python's hash randomisation."""
    from fedrepro.data.seq2seq import derive_seed

    return np.random.default_rng(derive_seed(seed, *salt))


def _shuffled(ids: Sequence[str], seed: int, *salt: int | str) -> list[str]:
    ids = sorted(ids)  # the input order never matters
    order = _rng(seed, *salt).permutation(len(ids))
    return [ids[i] for i in order]


def equal_parts(ids: Sequence[str], num_parts: int, seed: int, *salt: int | str) -> list[list[str]]:
    """Shuffle (seeded) and cut into ``num_parts`` parts whose sizes differ by at most one."""
    if num_parts < 1:
        raise ValueError("num_parts must be >= 1")
    shuffled = _shuffled(ids, seed, *salt)
    bounds = np.linspace(0, len(shuffled), num_parts + 1).round().astype(int)
    return [shuffled[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# -- AdaFedSelecKD ---------------------------------------------------------------------------
def natural(ids_by_client: Mapping[str, Mapping[str, Sequence[str]]]) -> Manifest:
    """One client per domain / task / dataset: the ids stay where they are (sorted)."""
    return {c: {s: sorted(ids) for s, ids in splits.items()} for c, splits in ids_by_client.items()}


def iid_balanced(
    ids_by_domain: Mapping[str, Mapping[str, Sequence[str]]], num_clients: int, seed: int
) -> Manifest:
    """AdaFedSelecKD Fig. 6 (IID and balanced): each domain's split is cut into ``num_clients``
    equal parts and client k receives part k of every domain; re-drawn per seed."""
    clients = [f"client{k + 1}" for k in range(num_clients)]
    out: Manifest = {c: {} for c in clients}
    for domain in sorted(ids_by_domain):
        for split, ids in ids_by_domain[domain].items():
            for c, part in zip(clients, equal_parts(ids, num_clients, seed, "iid", domain, split)):
                out[c].setdefault(split, []).extend(part)
    return {c: {s: sorted(v) for s, v in splits.items()} for c, splits in out.items()}


def noniid_balanced(
    ids_by_domain: Mapping[str, Mapping[str, Sequence[str]]],
    sizes: Mapping[str, int],
    seed: int,
) -> Manifest:
    """AdaFedSelecKD Fig. 7 (non-IID, balanced): from each domain draw ``sizes[split]`` examples
    (paper: 200 train / 40 valid / 40 test); re-drawn per seed."""
    out: Manifest = {}
    for domain in sorted(ids_by_domain):
        out[domain] = {}
        for split, n in sizes.items():
            ids = ids_by_domain[domain].get(split, [])
            if len(ids) < n:
                raise InputError(
                    f"non-IID balanced split needs {n} {split} examples of {domain}, only {len(ids)} exist; "
                    f"lower the sizes in the config (partitions.noniid_balanced.sizes)"
                )
            out[domain][split] = sorted(_shuffled(ids, seed, "noniid", domain, split)[:n])
    return out


# -- FedSum ----------------------------------------------------------------------------------
EMPTY_CLIENTS = ("redraw", "add_one")
"""How :func:`dirichlet_quantity_skew` keeps every client non-empty (``partitions.fedsum.empty_clients``)."""

DEFAULT_MAX_REDRAWS = 1_000_000_000
"""Dirichlet draws tried before ``redraw`` gives up (``partitions.fedsum.max_redraws``).  Dir(0.1)
over 20 clients and 2,000 examples accepts about 1 draw in 5 million (measured: 14 in 76.8 M)."""

REDRAW_BATCH = 65_536
"""Dirichlet vectors drawn per batch while re-drawing (part of the definition of a seeded split:
the first accepted row of the batches, in order)."""


def redraw_acceptance(n: int, num_clients: int, alpha: float, particles: int = 4096,
                      seed: int = 0) -> float:
    """Estimate of the probability that one draw ``p ~ Dir(α·1_K)`` passes the redraw test
    ``min(p)·n >= 1`` (every client gets an example): the acceptance rate of
    :func:`redraw_proportions`.

    Why not a plain Monte-Carlo count: the cases that matter are those where the rate is far
    below one in a batch (1e-10 for Dir(0.1) over 20 clients and 80 examples), which a count of
    zero accepted draws cannot tell from 1e-6.  So the estimate is sequential importance sampling
    over Dirichlet stick-breaking (``p_k = r_k·B_k``, ``B_k ~ Beta(α, (K−k)·α)``,
    ``r_{k+1} = r_k·(1 − B_k)``): at step ``k`` each particle draws ``B_k`` from its Beta
    truncated to the values that can still succeed, ``[x/r_k, 1 − (K−k)·x/r_k]`` with ``x = 1/n``
    (this client gets ``>= x``, the ``K−k`` after it can each still get ``>= x``), and its weight
    is multiplied by that interval's probability.  Every particle that reaches the end passes the
    test, so the mean weight is an unbiased estimate of the rate, with a small relative error even
    at 1e-12 (the weights are products of K moderate factors).  No library does this truncated
    stick-breaking (scipy gives the Beta distribution's CDF and inverse, used here).
    Deterministic (own generator ``seed``): it never touches the split's random stream.
    """
    from scipy.special import betainc, betaincinv

    k_total = int(num_clients)
    x = 1.0 / float(n)
    if k_total == 1:
        return 1.0
    rng = np.random.default_rng(seed)
    a = float(alpha)
    r = np.ones(particles)
    log_w = np.zeros(particles)
    alive = np.ones(particles, dtype=bool)
    for k in range(1, k_total):
        b = (k_total - k) * a
        lo = np.clip(x / r, 0.0, 1.0)
        hi = np.clip(1.0 - (k_total - k) * x / r, 0.0, 1.0)
        alive &= hi > lo
        if not alive.any():
            return 0.0
        f_lo = betainc(a, b, np.where(alive, lo, 0.0))
        f_hi = betainc(a, b, np.where(alive, hi, 1.0))
        mass = f_hi - f_lo
        alive &= mass > 0
        if not alive.any():
            return 0.0
        log_w = np.where(alive, log_w + np.log(np.where(alive, mass, 1.0)), -np.inf)
        u = f_lo + rng.random(particles) * mass
        frac = np.clip(betaincinv(a, b, np.clip(u, 0.0, 1.0)), lo, hi)
        r = np.where(alive, r * (1.0 - frac), 1.0)
    return float(np.mean(np.exp(log_w)))


def redraw_proportions(
    rng: np.random.Generator, n: int, num_clients: int, alpha: float, max_redraws: int
) -> tuple[np.ndarray, int]:
    """The FedSum authors' rule: draw ``p ~ Dir(α·1_K)`` until every client's share is at least one
    example (``min(p)·n >= 1``, their ``min_size`` test); returns (p, number of draws used).

    The draws come in batches of :data:`REDRAW_BATCH` (vectorised; the accepted ``p`` is the first
    row, in draw order, that passes).  When the first batch has no passing row and draws are left,
    the acceptance rate is estimated (:func:`redraw_acceptance`); when the expected number of
    draws (1 / rate) exceeds ``max_redraws`` the split fails at once with an InputError naming the
    keys, instead of spinning through ``max_redraws`` draws (10^9 by default: minutes) that will
    very probably find nothing.  After ``max_redraws`` draws without one: InputError."""
    if max_redraws < 1:
        raise InputError(f"partitions.fedsum.max_redraws must be >= 1, got {max_redraws}")
    alphas = np.full(num_clients, float(alpha))
    used = 0
    while used < max_redraws:
        size = min(REDRAW_BATCH, max_redraws - used)
        p = rng.dirichlet(alphas, size=size)
        ok = np.flatnonzero(p.min(axis=1) * n >= 1)
        if ok.size:
            return p[ok[0]], used + int(ok[0]) + 1
        used += size
        if used == size and used < max_redraws:  # after the first batch: can the rest succeed?
            rate = redraw_acceptance(n, num_clients, alpha)
            if rate * max_redraws < 1.0:
                expected = "never (rate 0)" if rate == 0 else f"about {1.0 / rate:.3g}"
                raise InputError(
                    f"Dirichlet split (Dir = {alpha:g}, {n} examples, {num_clients} clients): a draw "
                    f"gives every client at least one example with probability ~{rate:.3g}, so the "
                    f"redraw needs {expected} draws, more than partitions.fedsum.max_redraws = "
                    f"{max_redraws:,} (partitions.fedsum.empty_clients: redraw, the FedSum authors' "
                    f"rule; estimated after the first {used:,} draws found none).  Use more examples "
                    f"(partitions.fedsum.total) or fewer clients (partitions.fedsum.num_clients) or a "
                    f"larger alpha (partitions.fedsum.alphas), raise partitions.fedsum.max_redraws, "
                    f"or set partitions.fedsum.empty_clients: add_one"
                )
    raise InputError(
        f"Dirichlet split (Dir = {alpha:g}, {n} examples, {num_clients} clients): no draw in "
        f"{max_redraws:,} gave every client at least one example "
        f"(partitions.fedsum.empty_clients: redraw, the FedSum authors' rule); raise "
        f"partitions.fedsum.max_redraws, use more examples (partitions.fedsum.total) or fewer "
        f"clients, or set partitions.fedsum.empty_clients: add_one"
    )


def sizes_from_proportions(p: np.ndarray, n: int) -> np.ndarray:
    """The authors' cut: client k gets ``⌊n·P_k⌋ − ⌊n·P_(k−1)⌋`` examples (``P`` the cumulative
    proportions; the last client takes the rest), i.e. ``np.split`` at ``(cumsum(p)·n).astype(int)[:-1]``."""
    cuts = (np.cumsum(p) * n).astype(int)[:-1]
    return np.diff(np.concatenate([[0], cuts, [n]]))


def dirichlet_quantity_skew(
    n: int,
    num_clients: int,
    alpha: float,
    seed: int,
    empty_clients: str = "redraw",
    max_redraws: int = DEFAULT_MAX_REDRAWS,
) -> list[list[int]]:
    """FedSum §5.1: quantity skew — client sizes ~ Dirichlet(α), every client non-empty.

    Proportions ``p ~ Dir(α·1_K)``; ``α = inf`` gives uniform sizes (±1).  ``empty_clients``
    (``partitions.fedsum.empty_clients``) says how no client ends up empty:

    * ``redraw`` (the FedSum authors' code): re-draw ``p`` until ``min(p)·n >= 1``
      (:func:`redraw_proportions`, at most ``max_redraws`` draws), then cut ``n`` at the cumulative
      proportions (:func:`sizes_from_proportions`) -- every client then holds at least one example;
    * ``add_one``: sizes ``1 + Multinomial(n − K, p)`` from the first draw.

    Either way the sizes sum to ``n``; the indices ``range(n)`` are shuffled (seeded) and cut into
    consecutive blocks of those sizes.  Returns ``num_clients`` disjoint index lists covering
    ``range(n)``.
    """
    if num_clients < 1 or n < num_clients:
        raise ValueError(f"need n >= num_clients >= 1, got n={n}, num_clients={num_clients}")
    if empty_clients not in EMPTY_CLIENTS:
        raise InputError(
            f"partitions.fedsum.empty_clients must be one of {list(EMPTY_CLIENTS)}, got {empty_clients!r}"
        )
    rng = _rng(seed, "dirichlet", n, num_clients, alpha)
    if math.isinf(alpha):
        sizes = np.full(num_clients, n // num_clients)
        sizes[: n % num_clients] += 1
    else:
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0 (or inf), got {alpha}")
        if empty_clients == "redraw":
            p, _ = redraw_proportions(rng, n, num_clients, alpha, int(max_redraws))
            sizes = sizes_from_proportions(p, n)
        else:
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            sizes = 1 + rng.multinomial(n - num_clients, p)
    order = rng.permutation(n)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [sorted(order[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:])]


def fedsum_scarcity(
    train_ids: Sequence[str],
    total: int,
    num_clients: int,
    alpha: float,
    seed: int,
    empty_clients: str = "redraw",
    max_redraws: int = DEFAULT_MAX_REDRAWS,
) -> dict[str, list[str]]:
    """FedSum's data-scarcity setting: ``total`` training examples (paper: 2,000) drawn from the
    training set, split over ``num_clients`` by :func:`dirichlet_quantity_skew`."""
    if len(train_ids) < total:
        raise InputError(f"FedSum scarcity needs {total} training examples, only {len(train_ids)} exist")
    pool = _shuffled(train_ids, seed, "fedsum-pool")[:total]
    blocks = dirichlet_quantity_skew(total, num_clients, alpha, seed, empty_clients, max_redraws)
    return {f"client{k + 1:02d}": sorted(pool[i] for i in block) for k, block in enumerate(blocks)}


# -- FedMCP ----------------------------------------------------------------------------------
def fedmcp_cross_task(
    ids_by_task: Mapping[str, Mapping[str, Sequence[str]]],
    seed: int,
    cap_task: str = "MRPC",
    ratios: tuple[float, float, float] = (0.6, 0.2, 0.2),
) -> Manifest:
    """FedMCP §V-A: per task merge train and validation, downsample tasks larger than
    ``cap_task`` (MRPC) to its size, then split 6:2:2 into train / val / test per client."""
    merged = {t: [i for s in ("train", "val") for i in splits.get(s, [])] for t, splits in ids_by_task.items()}
    if cap_task not in merged:
        raise InputError(f"FedMCP's split needs the {cap_task} task to set the per-task size")
    cap = len(merged[cap_task])
    out: Manifest = {}
    for task in sorted(merged):
        ids = _shuffled(merged[task], seed, "fedmcp", task)[:cap]
        n_train = int(round(ratios[0] * len(ids)))
        n_val = int(round(ratios[1] * len(ids)))
        out[task] = {
            "train": sorted(ids[:n_train]),
            "val": sorted(ids[n_train : n_train + n_val]),
            "test": sorted(ids[n_train + n_val :]),
        }
    return out


# -- FedSUMM ---------------------------------------------------------------------------------
def fedsumm_clients(
    ids_by_split: Mapping[str, Sequence[str]], num_clients: int, seed: int, corpus: str
) -> Manifest:
    """FedSUMM §IV-A: one corpus split over N clients (each split cut into N near-equal parts).

    Every client trains on its train part and is evaluated on its test part, so the corpus must
    have both splits (a release without a test file gets a held-out one when prepared:
    ``data.<corpus>.heldout_test_fraction``, see :func:`fedrepro.data.prepare.hold_out_test`).
    """
    missing = [s for s in ("train", "test") if not ids_by_split.get(s)]
    if missing:
        raise InputError(
            f"FedSUMM's {corpus} clients need a train and a test split; the prepared {corpus} "
            f"records have no {' or '.join(missing)} split (splits: {sorted(ids_by_split)}). A raw "
            f"copy without a test file needs data.{corpus}.heldout_test_fraction (NLPCC2017's "
            f"download has only train)"
        )
    out: Manifest = {f"{corpus}-{k + 1:03d}": {} for k in range(num_clients)}
    for split, ids in ids_by_split.items():
        if len(ids) < num_clients:
            raise InputError(f"{corpus} {split} has {len(ids)} examples, fewer than {num_clients} clients")
        for c, part in zip(out, equal_parts(ids, num_clients, seed, "fedsumm", corpus, split)):
            out[c][split] = sorted(part)
    return out


# -- FedSUMM: length-skewed (non-i.i.d.) clients ----------------------------------------------
FEDSUMM_SPLITS = ("iid", "dirichlet_length")
"""``partitions.fedsumm.split``: :func:`fedsumm_clients` (i.i.d. equal parts) or
:func:`fedsumm_length_skew_clients` (equal parts, Dirichlet mixtures over source-length buckets)."""


def length_bucket_edges(train_lengths: Sequence[int], buckets: int) -> list[int]:
    """The ``buckets − 1`` inner edges of the length buckets: the training lengths at sorted ranks
    ``⌊k·n/B⌋`` (k = 1 … B−1).  An example of length x is in bucket ``#{edges ≤ x}`` (0 … B−1), so
    the buckets are the training set's B length quantiles (equal lengths stay in one bucket)."""
    lengths = sorted(int(x) for x in train_lengths)
    if buckets < 2 or not lengths:
        raise InputError(f"length buckets need >= 2 buckets and training records, got {buckets}")
    return [lengths[(k * len(lengths)) // buckets] for k in range(1, buckets)]


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers summing to ``total`` proportional to ``weights`` (Hamilton's method; ties to the
    lower index)."""
    raw = total * weights / weights.sum()
    out = np.floor(raw).astype(int)
    rest = total - int(out.sum())
    order = sorted(range(len(raw)), key=lambda b: (-(raw[b] - out[b]), b))
    for b in order[:rest]:
        out[b] += 1
    return out


def fit_to_supply(
    wanted: np.ndarray, rows: np.ndarray, columns: np.ndarray, tol: float = 1e-9, max_iter: int = 10_000
) -> np.ndarray:
    """Iterative proportional fitting (Sinkhorn): ``diag(u)·W·diag(v)`` with row sums ``rows`` and
    column sums ``columns`` (equal totals), W floored at 1e-12 of its row so every cell may take a
    share; a column of sum 0 stays 0.  Stops when every sum is within ``tol``·total."""
    total = float(rows.sum())
    if abs(total - float(columns.sum())) > 1e-9 * max(total, 1.0):
        raise ValueError("row and column totals differ")
    t = np.asarray(wanted, dtype=np.float64)
    t = t + 1e-12 * t.sum(axis=1, keepdims=True) + 1e-300
    t[:, columns == 0] = 0.0
    for _ in range(max_iter):
        col = t.sum(axis=0)
        t *= np.divide(columns, col, out=np.zeros_like(col), where=col > 0)[None, :]
        row = t.sum(axis=1)
        t *= np.divide(rows, row, out=np.zeros_like(row), where=row > 0)[:, None]
        if np.abs(t.sum(axis=0) - columns).max() <= tol * max(total, 1.0):
            break
    return t


def fedsumm_length_skew_clients(
    ids_by_split: Mapping[str, Sequence[str]],
    lengths: Mapping[str, int],
    num_clients: int,
    seed: int,
    corpus: str,
    alpha: float,
    buckets: int = 5,
) -> Manifest:
    """FedSUMM's heterogeneous clients (``partitions.fedsumm.split: dirichlet_length``): every
    client holds the same number of examples as under :func:`fedsumm_clients` (each split cut into N
    near-equal parts), but its examples follow its own mixture over source-length buckets.

    The paper's subject is clients whose texts differ ("statistical diversity of text … different
    local data have different semantic information", §III-C) but it does not say how its N-client
    splits were made.  The length of the source is a heterogeneity every corpus has (only THUCNews
    carries a topic label); it changes what a summary must compress and what a 512-token model sees.

    1. Buckets: the B quantiles of the training sources' lengths (``lengths[id]``: characters of
       the input), :func:`length_bucket_edges`; val/test examples use the same edges.
    2. Client c draws its mixture ``q_c ~ Dir(α·1_B)`` (seeded by (seed, corpus, N, α, B); the
       Dirichlet prior of Hsu et al. 2019, per client).  α → ∞: every client mirrors the corpus;
       α → 0: each client's examples come from one bucket as far as that bucket lasts.
    3. Per split (train, val, test alike, so a client's test data follow its training mixture):
       client sizes m_c as :func:`equal_parts` (the plain mean of FedAvg/FedSUMM stays the mean
       of near-equal shares).  The wanted counts ``m_c·q_c`` are fitted to the buckets' supplies
       by iterative proportional fitting (:func:`fit_to_supply`: ``T = diag(u)·(m q)·diag(v)`` with
       row sums m_c and column sums the bucket sizes; every client's mixture rescaled by the same
       per-bucket factors, so no client is served first), then rounded client by client
       (:func:`_largest_remainder`; clients in index order; a client whose rounded want exceeds
       what a bucket has left takes the rest from its next-largest buckets -- a few examples at
       most).  Each bucket's ids are shuffled (seeded per split and bucket) and dealt in that order.
       Every id is assigned and every client gets its m_c ≥ 1 examples.

    Returns ``{"<corpus>-NNN": {split: sorted ids}}`` as :func:`fedsumm_clients` (same client names,
    same sizes); disjoint, covering every id.
    """
    missing = [s for s in ("train", "test") if not ids_by_split.get(s)]
    if missing:
        raise InputError(
            f"FedSUMM's {corpus} clients need a train and a test split; the prepared {corpus} "
            f"records have no {' or '.join(missing)} split (splits: {sorted(ids_by_split)})"
        )
    if not (alpha > 0 and math.isfinite(alpha)):
        raise InputError(f"partitions.fedsumm.alpha must be a finite number > 0, got {alpha!r}")
    if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 2:
        raise InputError(f"partitions.fedsumm.length_buckets must be an integer >= 2, got {buckets!r}")
    unknown = [i for ids in ids_by_split.values() for i in ids if i not in lengths]
    if unknown:
        raise InputError(f"{corpus}: no source length for record {unknown[0]}")
    edges = np.asarray(length_bucket_edges([lengths[i] for i in ids_by_split["train"]], buckets))
    clients = [f"{corpus}-{k + 1:03d}" for k in range(num_clients)]
    rng = _rng(seed, "fedsumm-length", corpus, num_clients, f"{alpha!r}", buckets)
    mixtures = rng.dirichlet(np.full(buckets, float(alpha)), size=num_clients)
    out: Manifest = {c: {} for c in clients}
    for split in sorted(ids_by_split):
        ids = sorted(ids_by_split[split])
        if len(ids) < num_clients:
            raise InputError(f"{corpus} {split} has {len(ids)} examples, fewer than {num_clients} clients")
        which = np.searchsorted(edges, [lengths[i] for i in ids], side="right")
        pools = [
            _shuffled([i for i, b in zip(ids, which) if b == k], seed, "fedsumm-length", corpus, split, k)
            for k in range(buckets)
        ]
        sizes = np.diff(np.linspace(0, len(ids), num_clients + 1).round().astype(int))
        supply = np.array([len(pool) for pool in pools])
        plan = fit_to_supply(sizes[:, None] * mixtures, sizes, supply)
        dealt = [0] * buckets  # ids of each bucket handed out so far
        for c in range(num_clients):
            want = _largest_remainder(int(sizes[c]), plan[c])
            left = [int(supply[k]) - dealt[k] for k in range(buckets)]
            take = [min(int(want[k]), left[k]) for k in range(buckets)]
            short = int(sizes[c]) - sum(take)
            for k in sorted(range(buckets), key=lambda b: (-plan[c, b], b)):
                extra = min(short, left[k] - take[k])
                take[k] += extra
                short -= extra
            assert short == 0  # the ids left are the sizes still to fill
            got: list[str] = []
            for k in range(buckets):
                got += pools[k][dealt[k] : dealt[k] + take[k]]
                dealt[k] += take[k]
            out[clients[c]][split] = sorted(got)
    return out


# -- manifests and files ---------------------------------------------------------------------
def check_disjoint(manifest: Manifest) -> None:
    """Every id appears at most once across clients and splits."""
    seen: dict[str, tuple[str, str]] = {}
    for client, splits in manifest.items():
        for split, ids in splits.items():
            for i in ids:
                if i in seen:
                    raise ValueError(f"id {i} is in {seen[i]} and in {(client, split)}")
                seen[i] = (client, split)


def write_manifest(manifest: Manifest, path: str, meta: dict) -> None:
    check_disjoint(manifest)
    write_json_atomic(path, {"meta": meta, "clients": manifest})


def materialize(manifest_path: str, record_files: Sequence[str], out_dir: str) -> dict[str, dict[str, int]]:
    """Write ``out_dir/<client>/<split>.jsonl`` for every client of a manifest (folder atomically).

    Each client reads only its own folder; records get the client's name in ``client``.
    """
    from pathlib import Path

    from fedrepro.io import atomic_dir, read_json

    by_id = {r["id"]: r for f in record_files for r in read_jsonl(f)}
    clients = read_json(manifest_path)["clients"]
    counts: dict[str, dict[str, int]] = {}
    with atomic_dir(out_dir) as tmp:
        for client, splits in clients.items():
            for split, ids in splits.items():
                missing = [i for i in ids if i not in by_id]
                if missing:
                    raise InputError(f"{manifest_path}: unknown record id {missing[0]} for client {client}")
                rows = [dict(by_id[i], client=client) for i in sorted(ids)]
                counts.setdefault(client, {})[split] = write_jsonl_atomic(Path(tmp) / client / f"{split}.jsonl", rows)
    return counts
