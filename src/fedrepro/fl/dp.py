"""Server-side differential privacy of FedSUMM (Pan et al., eq. 8–10): clipping + Gaussian noise.

The paper: "The strength of the added noise is related to the median M (9) of the user gradient
update norm.  The central server adds Gaussian noise N and then does a global optimization (10)"::

    M = median{ζ^k}_{k∈S_t}                                                               (9)
    W_{t+1} ← W_t + (1/m) ( Σ_k ΔW^k_{t+1} · max(1, ζ^k/M) + N(0, M²σ²) )                 (10)

with ζ^k = ‖ΔW^k‖₂ the norm of client k's update: the client-level DP of Geyer et al. (2017).
**Eq. 10 as printed multiplies** each update by ``max(1, ζ^k/M) ≥ 1``, which would *enlarge* the
updates above the median, and the noise scale M·σ would then bound nothing.  We implement the
clipping reading of the Gaussian mechanism it cites (McMahan et al. 2018, DP-FedAvg; Andrew et al.
2021): each update is *divided* by that factor, ``ΔW^k / max(1, ζ^k/M)``, so every clipped norm is
≤ M (the sensitivity of the sum), then ``N(0, M²σ²)`` is added to every entry of the *sum* and the
result divided by m = |S_t| (the number of updates aggregated).  The per-entry noise on the *mean*
therefore has std ``M·σ/m``.

Two rules for M (``fedsumm.dp.clipping``):

* ``adaptive`` (default, :func:`dp_adaptive_clip_mean`): the median estimated *privately*, Andrew et
  al.'s adaptive clipping at target quantile ½ -- the round clips at the current estimate C_t, a
  noisy count of the unclipped updates moves it geometrically,
  ``C_{t+1} = C_t · exp(−η (b̃ − γ))``, ``b̃ = (Σ_k 1[ζ^k ≤ C_t] + N(0, σ_b²)) / m``; the update's
  noise multiplier z_Δ is raised so that update + count together spend the configured σ
  (:mod:`fedrepro.fl.privacy`, which also accounts ε);
* ``round_median`` (:func:`dp_median_clip_mean`): eq. 9 literally, ``numpy.median`` of the round's
  raw norms (the mean of the two middle norms when m is even).  M is not privatised (the paper
  does not privatise it either), so there is no formal guarantee and no ε.

Flower ships :class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideFixedClipping` and
:class:`~flwr.serverapp.strategy.DifferentialPrivacyServerSideAdaptiveClipping` (Andrew et al.).
We use Flower's helpers where they fit -- ``compute_adaptive_noise_params`` (the σ → (z_Δ, σ_b)
split) and ``compute_stdv`` (the std on the mean) -- but not its adaptive class, for three reasons
(Flower 1.41, ``flwr/serverapp/strategy/dp_adaptive_clipping.py``):

1. its indicator counts the *clipped* updates (``norm_bit = scaling_factor < 1``) and then applies
   Andrew et al.'s update written for the *unclipped* fraction, ``C ← C·exp(−η(clipped − γ))``:
   when most updates are clipped C shrinks further.  With γ = ½ the median is a repelling point
   (checked: norms spread over [0.5, 1.5], median 1, C_0 = 0.1, σ = 0 → C = 0.005 after 30 rounds).
   We count the unclipped ones, as Andrew et al.'s Alg. 1 and TF Privacy's
   ``QuantileEstimatorQuery`` do;
2. it updates C before adding the round's noise, so the noise is scaled by C_{t+1} while the
   round's sum was clipped at C_t (its sensitivity); we scale by C_t;
3. it draws the count noise from NumPy's global generator; ours come from a ``torch.Generator``
   seeded by (cell seed, round), so a rerun or a resumed run draws the same bits.  (And, as for
   every wrapper, FedSUMM clips the *modulated* updates, which only exist inside its server round:
   see :mod:`fedrepro.papers.fedsumm.strategy`.)

:class:`DifferentialPrivacyServerSideMedianClipping` is the ``round_median`` rule as a Flower
wrapper around a plain strategy (clip the replies in ``aggregate_train``, let the inner strategy
aggregate, add noise to the aggregate), with a seeded noise generator and the noise scale recorded
in the returned metrics.

Use an inner strategy that takes the *unweighted* mean (eq. 10's 1/m, and FedSUMM's plain mean):
e.g. Flower's ``FedAvg`` with ``weighted_by_key`` pointing at a metric every client sets to 1.
With a weighted mean the noise is still ``M·σ/m`` per entry (as Flower's own wrappers do).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.dp_fixed_clipping import validate_replies
from flwr.supercore import log

from fedrepro.data.seq2seq import derive_seed
from fedrepro.io import InputError

Tensors = Mapping[str, torch.Tensor]

METRIC_KEYS = {
    "clip_norm": "dp-clip-norm",
    "noise_multiplier": "dp-noise-multiplier",
    "noise_scale": "dp-noise-scale",
    "noise_std_on_mean": "dp-noise-std-mean",
    "num_clipped": "dp-num-clipped",
    "num_clients": "dp-num-clients",
}
"""Names of the noise-scale entries added to the round's aggregated train metrics."""
ADAPTIVE_METRIC_KEYS = {
    "next_clip_norm": "dp-next-clip-norm",
    "update_noise_multiplier": "dp-update-noise-multiplier",
    "num_unclipped": "dp-num-unclipped",
    "noisy_unclipped_fraction": "dp-noisy-unclipped-fraction",
    "epsilon": "dp-epsilon",
}
"""Further round metrics of adaptive clipping and the accountant (where the info has them)."""


def update_norm(update: Tensors) -> float:
    """ζ^k: the L2 norm of a client update over all its tensors (float64 accumulation)."""
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in update.values()))


def median_clip_norm(norms: Sequence[float]) -> float:
    """Eq. 9: ``M = median{ζ^k}`` of the round's update norms (``numpy.median``)."""
    if len(norms) == 0:
        raise InputError("no update norms to take the median of")
    arr = np.asarray(norms, dtype=np.float64)
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InputError(f"update norms must be finite and >= 0, got {norms}")
    return float(np.median(arr))


def clip_factor(norm: float, clip_norm: float) -> float:
    """``1 / max(1, ζ/M)``: the factor that brings a norm-ζ update to norm ≤ M (eq. 10, clipping reading)."""
    if norm <= clip_norm or norm == 0.0:
        return 1.0
    return clip_norm / norm


def _check_updates(updates: Sequence[Tensors]) -> list[str]:
    if not updates:
        raise InputError("no client updates to aggregate")
    keys = list(updates[0])
    for i, u in enumerate(updates):
        if list(u) != keys:
            raise InputError(f"update {i} has tensors {list(u)[:3]}…, expected {keys[:3]}…")
        for k, t in u.items():
            if not torch.is_floating_point(t):
                raise InputError(
                    f"update {i}: tensor {k!r} is {t.dtype}; DP clips floating-point tensors only"
                )
            if t.shape != updates[0][k].shape:
                raise InputError(
                    f"update {i}: tensor {k!r} has shape {tuple(t.shape)}, expected {tuple(updates[0][k].shape)}"
                )
    return keys


def dp_median_clip_mean(
    updates: Sequence[Tensors],
    noise_multiplier: float,
    generator: torch.Generator | None = None,
) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """Eq. 9–10 (clipping reading) without Flower: clipped, noised mean of the client updates.

    Parameters
    ----------
    updates : sequence of {name: Tensor}
        ΔW^k for every client k of the round (same names, shapes, floating dtypes).
    noise_multiplier : float
        σ ≥ 0; the noise added to the *sum* has std ``M·σ`` per entry.
    generator : torch.Generator, optional
        Source of the noise (seed it for reproducible runs).  Required when σ > 0.

    Returns
    -------
    (OrderedDict, dict)
        ``(1/m)(Σ_k ΔW^k / max(1, ζ^k/M) + N(0, M²σ²))`` and ``{"clip_norm": M,
        "noise_multiplier": σ, "noise_scale": M·σ, "noise_std_on_mean": M·σ/m,
        "num_clipped": #{ζ^k > M}, "num_clients": m, "norms": [ζ^k]}``.
    """
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise InputError(
            f"the DP noise multiplier σ must be a finite number >= 0, got {noise_multiplier}"
        )
    if noise_multiplier > 0 and generator is None:
        raise InputError("pass a seeded torch.Generator for the DP noise (σ > 0)")
    keys = _check_updates(updates)
    norms = [update_norm(u) for u in updates]
    clip_norm = median_clip_norm(norms)
    factors = [clip_factor(n, clip_norm) for n in norms]
    m = len(updates)
    noise_scale = clip_norm * noise_multiplier
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for k in keys:
        total = sum(u[k].detach().double() * f for u, f in zip(updates, factors))
        if noise_scale > 0:
            total = (
                total
                + torch.randn(total.shape, generator=generator, dtype=torch.float64) * noise_scale
            )
        out[k] = (total / m).to(updates[0][k].dtype)
    info = {
        "clipping": "round_median",
        "clip_norm": clip_norm,
        "noise_multiplier": float(noise_multiplier),
        "noise_scale": noise_scale,
        "noise_std_on_mean": noise_scale / m,
        "num_clipped": sum(1 for n in norms if n > clip_norm),
        "num_clients": m,
        "norms": norms,
    }
    return out, info


def geometric_clip_update(
    clip_norm: float, noisy_unclipped_fraction: float, target_quantile: float, clip_norm_lr: float
) -> float:
    """Andrew et al.'s geometric step: ``C · exp(−η (b̃ − γ))`` (b̃: noisy fraction of updates with
    norm ≤ C; more unclipped than γ shrinks C, fewer grows it)."""
    return clip_norm * math.exp(-clip_norm_lr * (noisy_unclipped_fraction - target_quantile))


def dp_adaptive_clip_mean(
    updates: Sequence[Tensors],
    clip_norm: float,
    noise_multiplier: float,
    clipped_count_stddev: float,
    target_quantile: float = 0.5,
    clip_norm_lr: float = 0.2,
    generator: torch.Generator | None = None,
) -> tuple[OrderedDict[str, torch.Tensor], dict]:
    """One round of adaptive clipping (Andrew et al., Alg. 1, server side): the clipped, noised mean
    of the client updates and the next clip norm.

    Parameters
    ----------
    updates : sequence of {name: Tensor}
        ΔW^k for every client k of the round (same names, shapes, floating dtypes).
    clip_norm : float
        C_t > 0, this round's clip norm (the private estimate of the target quantile).
    noise_multiplier : float
        σ > 0, the *effective* noise multiplier of update and count together (what the accountant
        sees); the update gets z_Δ = (σ⁻² − (2σ_b)⁻²)^{−1/2} (Flower's ``compute_adaptive_noise_params``).
    clipped_count_stddev : float
        σ_b > 0, std of the noise on the count of unclipped updates (needs σ < 2σ_b).
    target_quantile, clip_norm_lr : float
        γ ∈ (0, 1) (½: the median) and η > 0 of the geometric update.
    generator : torch.Generator
        Seeded source of both noises: first the count's N(0, σ_b²), then the update's noise,
        tensor by tensor in key order.

    Returns
    -------
    (OrderedDict, dict)
        ``(1/m)(Σ_k ΔW^k · min(1, C_t/ζ^k) + N(0, (z_Δ C_t)²))`` and the round's info: ``clip_norm``
        C_t, ``next_clip_norm`` C_{t+1}, ``num_unclipped`` Σ 1[ζ^k ≤ C_t],
        ``noisy_unclipped_fraction`` b̃, ``noise_multiplier`` σ, ``update_noise_multiplier`` z_Δ,
        ``noise_scale`` z_Δ·C_t (on the sum), ``noise_std_on_mean`` z_Δ·C_t/m, ``num_clipped``,
        ``num_clients`` m, and as diagnostics (not privatised; for the log only) ``median_norm``
        and ``norms``.
    """
    from flwr.supercore.differential_privacy import compute_adaptive_noise_params, compute_stdv

    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise InputError(f"the clip norm must be a finite number > 0, got {clip_norm}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise InputError(f"the DP noise multiplier σ must be a finite number > 0, got {noise_multiplier}")
    if not (math.isfinite(clipped_count_stddev) and clipped_count_stddev > 0):
        raise InputError(f"clipped_count_stddev must be a finite number > 0, got {clipped_count_stddev}")
    if not noise_multiplier < 2 * clipped_count_stddev:
        raise InputError(
            f"σ = {noise_multiplier} must be < 2 x clipped_count_stddev = {2 * clipped_count_stddev}"
        )
    if not 0 < target_quantile < 1 or not clip_norm_lr > 0:
        raise InputError(
            f"target quantile must be in (0, 1) and the clip-norm learning rate > 0, got "
            f"{target_quantile}, {clip_norm_lr}"
        )
    if generator is None:
        raise InputError("pass a seeded torch.Generator for the DP noise")
    keys = _check_updates(updates)
    m = len(updates)
    _, z_update = compute_adaptive_noise_params(noise_multiplier, m, clipped_count_stddev)
    norms = [update_norm(u) for u in updates]
    factors = [clip_factor(n, clip_norm) for n in norms]
    unclipped = sum(1 for n in norms if n <= clip_norm)
    count_noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * clipped_count_stddev
    fraction = (unclipped + count_noise) / m
    noise_scale = z_update * clip_norm
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for k in keys:
        total = sum(u[k].detach().double() * f for u, f in zip(updates, factors))
        total = total + torch.randn(total.shape, generator=generator, dtype=torch.float64) * noise_scale
        out[k] = (total / m).to(updates[0][k].dtype)
    info = {
        "clipping": "adaptive",
        "clip_norm": float(clip_norm),
        "next_clip_norm": geometric_clip_update(clip_norm, fraction, target_quantile, clip_norm_lr),
        "target_quantile": float(target_quantile),
        "clip_norm_lr": float(clip_norm_lr),
        "num_unclipped": unclipped,
        "noisy_unclipped_fraction": fraction,
        "clipped_count_stddev": float(clipped_count_stddev),
        "noise_multiplier": float(noise_multiplier),
        "update_noise_multiplier": float(z_update),
        "noise_scale": noise_scale,
        "noise_std_on_mean": compute_stdv(z_update, clip_norm, m),
        "num_clipped": m - unclipped,
        "num_clients": m,
        "median_norm": float(np.median(norms)),
        "norms": norms,
    }
    return out, info


class DifferentialPrivacyServerSideMedianClipping(Strategy):
    """Flower strategy wrapper: FedSUMM's server-side DP (eq. 9–10, clipping reading).

    Per round: ``ΔW^k = reply^k − W_t`` for every reply, ``M = median ζ^k``, each reply replaced by
    ``W_t + ΔW^k / max(1, ζ^k/M)``, the inner strategy aggregates, then Gaussian noise of std
    ``M·σ/m`` is added to every entry of the aggregate (= ``N(0, M²σ²)`` on the sum, divided by
    m).  The noise comes from a NumPy generator seeded by ``(seed, round)``.  The round's
    ``M``, ``σ``, ``M·σ`` and ``M·σ/m`` are added to the aggregated train metrics
    (:data:`METRIC_KEYS`) and kept in :attr:`history`.

    Parameters
    ----------
    strategy : Strategy
        The inner strategy (e.g. FedAvg; see the module docstring about weights).
    noise_multiplier : float
        σ ≥ 0 (config ``fedsumm.dp.noise_multiplier``).
    num_sampled_clients : int
        Expected replies per round (a mismatch is logged, as in Flower's wrappers).
    seed : int
        Seed of the noise.
    """

    def __init__(
        self, strategy: Strategy, noise_multiplier: float, num_sampled_clients: int, seed: int = 0
    ) -> None:
        super().__init__()
        if strategy is None:
            raise ValueError("The passed strategy is None.")
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError("The noise multiplier should be a non-negative value.")
        if num_sampled_clients <= 0:
            raise ValueError("The number of sampled clients should be a positive value.")
        self.strategy = strategy
        self.noise_multiplier = float(noise_multiplier)
        self.num_sampled_clients = num_sampled_clients
        self.seed = int(seed)
        self.current_arrays: ArrayRecord = ArrayRecord()
        self.history: list[dict] = []

    def __repr__(self) -> str:
        return (
            "Differential Privacy Strategy Wrapper (Server-Side Median Clipping, FedSUMM eq. 9-10)"
        )

    def summary(self) -> None:
        log(INFO, "\t├──> DP settings (FedSUMM eq. 9-10):")
        log(INFO, "\t│\t├── Noise multiplier: %s", self.noise_multiplier)
        log(INFO, "\t│\t└── Clipping norm: median of the round's update norms")
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.current_arrays = arrays
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies_list = list(replies)
        if not validate_replies(replies_list, self.num_sampled_clients):
            return None, None
        current = {k: a.numpy() for k, a in self.current_arrays.items()}
        if not current:
            raise InputError("no current arrays: configure_train must run before aggregate_train")
        deltas, names = [], []
        for reply in replies_list:
            records = list(reply.content.array_records.items())
            if len(records) != 1:
                raise InputError(f"a reply must carry exactly one ArrayRecord, got {len(records)}")
            name, record = records[0]
            if list(record.keys()) != list(current):
                raise InputError(
                    f"reply arrays {list(record.keys())[:3]}… differ from the sent arrays "
                    f"{list(current)[:3]}…"
                )
            deltas.append(
                OrderedDict(
                    (k, torch.from_numpy(np.asarray(a.numpy(), dtype=np.float64) - current[k]))
                    for k, a in record.items()
                )
            )
            names.append(name)
        norms = [update_norm(d) for d in deltas]
        clip_norm = median_clip_norm(norms)
        for reply, name, delta, norm in zip(replies_list, names, deltas, norms):
            factor = clip_factor(norm, clip_norm)
            reply.content[name] = ArrayRecord(
                OrderedDict(
                    (k, Array(np.asarray(current[k] + d.numpy() * factor, dtype=current[k].dtype)))
                    for k, d in delta.items()
                )
            )
        log(INFO, "aggregate_train: updates clipped to the median norm M = %.6g", clip_norm)

        aggregated, metrics = self.strategy.aggregate_train(server_round, replies_list)
        m = len(replies_list)
        noise_scale = clip_norm * self.noise_multiplier
        info = {
            "clip_norm": clip_norm,
            "noise_multiplier": self.noise_multiplier,
            "noise_scale": noise_scale,
            "noise_std_on_mean": noise_scale / m,
            "num_clipped": sum(1 for n in norms if n > clip_norm),
            "num_clients": m,
        }
        if aggregated is not None:
            if noise_scale > 0:
                rng = np.random.default_rng(derive_seed(self.seed, "fedsumm-dp", server_round))
                aggregated = ArrayRecord(
                    OrderedDict(
                        (
                            k,
                            Array(
                                np.asarray(
                                    a.numpy() + rng.normal(0.0, noise_scale / m, a.numpy().shape),
                                    dtype=a.numpy().dtype,
                                )
                            ),
                        )
                        for k, a in aggregated.items()
                    )
                )
            log(
                INFO,
                "aggregate_train: central DP noise, std %.6g on the mean (M·σ = %.6g)",
                noise_scale / m,
                noise_scale,
            )
            metrics = MetricRecord() if metrics is None else metrics
            for key, metric in METRIC_KEYS.items():
                metrics[metric] = info[key]
        self.history.append({"round": server_round, **info, "norms": norms})
        return aggregated, metrics
