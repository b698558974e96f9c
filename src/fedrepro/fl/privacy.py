"""Client-level DP settings and privacy accounting (FedSUMM eq. 8–10; Geyer et al. 2017; Andrew et al. 2021).

Torch-free and cheap to import: the workflow's grid validates ``fedsumm.dp`` while Snakemake builds
its DAG.  Flower and ``dp-accounting`` are imported inside the functions that need them.

Mechanism accounted (one round t, m = clients per round of K clients, q = m/K):

* every client update is clipped to the round's clip norm C_t, the clipped updates are summed and
  N(0, (z_Δ·C_t)²) is added to every entry of the sum (sensitivity C_t under adding/removing one
  client): a Gaussian query with noise multiplier z_Δ;
* with ``clipping: adaptive`` (Andrew et al., "Differentially private learning with adaptive
  clipping", Alg. 1) C_{t+1} comes from the count of *unclipped* updates Σ_k 1[ζ^k ≤ C_t] plus
  N(0, σ_b²).  Written as Σ_k (1[ζ^k ≤ C_t] − ½) + m/2 the count has sensitivity ½, so it is a
  Gaussian query with noise multiplier 2σ_b;
* both queries read the same sampled clients in the same round.  Gaussian queries on the same data
  compose into one Gaussian query with ``z^{-2} = z_Δ^{-2} + (2σ_b)^{-2}`` (Andrew et al. §3.1; Mironov
  et al. 2019, "Rényi DP of the sampled Gaussian mechanism", §3).  The configured
  ``noise_multiplier`` σ is this *effective* z: the update's z_Δ = (σ^{-2} − (2σ_b)^{-2})^{-1/2} > σ is
  Flower's ``compute_adaptive_noise_params`` (the split Andrew et al. prescribe), so the count's noise
  is paid for by a little more noise on the update and the accounting below sees σ.  We do not add
  the two up by hand: each round is ``PoissonSampledDpEvent(q, ComposedDpEvent([GaussianDpEvent(z_Δ),
  GaussianDpEvent(2σ_b)]))`` and ``dp-accounting``'s RDP accountant composes it (it folds the inner
  Gaussians into one with the rule above), T rounds by T compositions, ε(δ) after every round.

Sampling: the FedSUMM server draws a fixed number m of the K clients without replacement each round
(or all K).  The RDP accountant's subsampled Gaussian under add/remove-one neighbours is the
Poisson one; we account with Poisson rate q = m/K, as DP-FedAvg (McMahan et al. 2018) and Geyer et
al. do.  With all clients every round (q = 1, both configs) there is no sampling and the number is
exact.

``clipping: round_median`` is eq. 9 literally: C_t = the exact median of the round's raw update
norms.  C_t then depends on the data without noise, so the Gaussian noise bounds nothing formal:
no ε is reported (``None``), and the log says why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from fedrepro.io import InputError

CLIPPINGS = ("adaptive", "round_median")
"""``adaptive``: Andrew et al.'s private quantile (target ½ = private median); ``round_median``: eq. 9
as printed (exact median of the round's norms, not private)."""
ACCOUNTANT = "rdp"
"""dp-accounting's ``RdpAccountant`` (add/remove-one neighbouring relation, its default orders)."""
NO_GUARANTEE = (
    "none: clipping round_median clips at the exact median of the round's raw update norms, which "
    "is not privatised; use clipping: adaptive for an (epsilon, delta) guarantee"
)


@dataclasses.dataclass(frozen=True)
class DPSettings:
    """The ``fedsumm.dp`` block (``key`` names it in every error)."""

    enabled: bool = False
    noise_multiplier: float = 1.0
    delta: float = 1e-5
    clipping: str = "adaptive"
    target_quantile: float = 0.5
    initial_clip_norm: float = 0.1
    clip_norm_lr: float = 0.2
    clipped_count_stddev: float | None = None
    regimes: tuple[str, ...] = ("FedSUMM",)
    key: str = dataclasses.field(default="fedsumm.dp", compare=False)

    def __post_init__(self) -> None:
        k = self.key

        def number(name: str, value, low: float | None = None, high: float | None = None,
                   low_open: bool = True, high_open: bool = True, what: str = "") -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if ok and low is not None:
                ok = value > low if low_open else value >= low
            if ok and high is not None:
                ok = value < high if high_open else value <= high
            if not ok:
                raise InputError(f"config key {k}.{name}: must be {what}, got {value!r}")

        if not isinstance(self.enabled, bool):
            raise InputError(f"config key {k}.enabled: must be true or false, got {self.enabled!r}")
        number("noise_multiplier", self.noise_multiplier, 0.0, what="a number > 0 (σ)")
        number("delta", self.delta, 0.0, 1.0, what="a number in (0, 1) (δ)")
        if self.clipping not in CLIPPINGS:
            raise InputError(
                f"config key {k}.clipping: must be one of {CLIPPINGS}, got {self.clipping!r}"
            )
        number("target_quantile", self.target_quantile, 0.0, 1.0,
               what="a number in (0, 1) (0.5: the median)")
        number("initial_clip_norm", self.initial_clip_norm, 0.0, what="a number > 0")
        number("clip_norm_lr", self.clip_norm_lr, 0.0, what="a number > 0")
        if self.clipped_count_stddev is not None:
            number("clipped_count_stddev", self.clipped_count_stddev, 0.0,
                   what="a number > 0 or null (clients per round / 20)")
        bad = [r for r in self.regimes if r not in ("FedAvg", "FedSUMM")]
        if bad:
            raise InputError(f"config key {k}.regimes: {bad} are not federated regimes (FedAvg, FedSUMM)")

    @classmethod
    def from_config(cls, cfg: Mapping | None, key: str = "fedsumm.dp") -> DPSettings:
        cfg = dict(cfg or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"key"}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise InputError(f"config key {key}: unknown keys {unknown}; known: {sorted(known)}")
        if "regimes" in cfg:
            cfg["regimes"] = tuple(cfg["regimes"])
        return cls(**cfg, key=key)

    def as_dict(self) -> dict:
        """JSON-able, for the cell (what its config hash covers)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "key"}
        d["regimes"] = list(self.regimes)
        return d

    # -- the noise split of adaptive clipping ------------------------------------------------------
    def count_stddev(self, clients_per_round: int) -> float:
        """σ_b: the configured value, else Andrew et al.'s recommendation m/20 (Flower's default)."""
        if self.clipped_count_stddev is not None:
            return float(self.clipped_count_stddev)
        return clients_per_round / 20.0

    def check(self, clients_per_round: int) -> None:
        """The split needs σ < 2σ_b (else no z_Δ exists); an error naming both keys."""
        if self.clipping != "adaptive":
            return
        sb = self.count_stddev(clients_per_round)
        if not self.noise_multiplier < 2 * sb:
            raise InputError(
                f"config key {self.key}.noise_multiplier: σ = {self.noise_multiplier} must be < 2 x "
                f"{self.key}.clipped_count_stddev = 2 x {sb:g} "
                f"({'clients per round / 20' if self.clipped_count_stddev is None else 'configured'}; "
                f"{clients_per_round} clients per round): the clipped-count noise alone would exceed "
                "the privacy budget of σ. Raise clipped_count_stddev or lower noise_multiplier"
            )

    def noise_split(self, clients_per_round: int) -> tuple[float, float]:
        """``(z_Δ, σ_b)`` of adaptive clipping, by Flower's ``compute_adaptive_noise_params``
        (``round_median``: ``(σ, 0)``, no count)."""
        if self.clipping != "adaptive":
            return float(self.noise_multiplier), 0.0
        self.check(clients_per_round)
        from flwr.supercore.differential_privacy import compute_adaptive_noise_params

        sb, z_update = compute_adaptive_noise_params(
            self.noise_multiplier, clients_per_round, self.count_stddev(clients_per_round)
        )
        return float(z_update), float(sb)


# -- accounting --------------------------------------------------------------------------------------
def round_event(settings: DPSettings, clients_per_round: int, num_clients: int):
    """One round's ``DpEvent`` (module docstring), or None for ``round_median`` (no guarantee)."""
    if settings.clipping != "adaptive":
        return None
    if not 1 <= clients_per_round <= num_clients:
        raise InputError(
            f"clients per round must be in 1..{num_clients} (the clients), got {clients_per_round}"
        )
    import dp_accounting

    z_update, sb = settings.noise_split(clients_per_round)
    return dp_accounting.PoissonSampledDpEvent(
        clients_per_round / num_clients,
        dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(z_update), dp_accounting.GaussianDpEvent(2.0 * sb)]
        ),
    )


def epsilon_per_round(
    settings: DPSettings, rounds: int, clients_per_round: int, num_clients: int
) -> list[float | None]:
    """ε after rounds 1..T at the configured δ (dp-accounting's RDP accountant); None per round
    for ``round_median``."""
    event = round_event(settings, clients_per_round, num_clients)
    if event is None:
        return [None] * int(rounds)
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    out = []
    for _ in range(int(rounds)):
        accountant.compose(event)
        out.append(float(accountant.get_epsilon(settings.delta)))
    return out


def accounting_report(
    settings: DPSettings, rounds: int, clients_per_round: int, num_clients: int
) -> dict:
    """What the cell's provenance records about its privacy (``dp``)."""
    z_update, sb = settings.noise_split(clients_per_round)
    eps = epsilon_per_round(settings, rounds, clients_per_round, num_clients)
    return {
        **settings.as_dict(),
        "clients_per_round": int(clients_per_round),
        "num_clients": int(num_clients),
        "sampling_rate": clients_per_round / num_clients,
        "rounds": int(rounds),
        "update_noise_multiplier": z_update,
        "clipped_count_stddev_used": sb if settings.clipping == "adaptive" else None,
        "accountant": f"dp-accounting {ACCOUNTANT}: PoissonSampledDpEvent(q, ComposedDpEvent("
                      "[GaussianDpEvent(z_update), GaussianDpEvent(2 x clipped_count_stddev)])) per round"
                      if settings.clipping == "adaptive" else None,
        "neighbouring": "add or remove one client (client-level DP)",
        "epsilon_per_round": eps,
        "epsilon": eps[-1] if eps else None,
        "guarantee": (
            f"({eps[-1]:.6g}, {settings.delta:g})-DP for each client's whole data"
            if eps and eps[-1] is not None else NO_GUARANTEE
        ),
    }
