"""The rehearsal report: ``results/rehearsal/report.{json,md}``.

Per cell (:func:`fedrepro.rehearsal.plan.cells`): status (a failed cell names its job log and the
error lines at its end), wall time per round, optimizer step time, peak process memory (the
Snakemake benchmark's ``max_rss`` of the cell's jobs, Ray workers included) and peak GPU memory
where CUDA was used, bytes on the wire per round, and whether the declared job resources cover
what was measured, projected to the paper's full rounds and data:

* a full round makes ``sum_i E * ceil(n_i / B)`` optimizer steps over the round's clients (``n_i``
  the client's training examples in its data folder, ``B`` the paper batch, ``E`` local epochs);
  a step at batch ``B`` is taken as the measured step at the rehearsal's batch
  ``b = min(B, examples_per_client)`` times ``B / b`` (linear in the batch: pessimistic on a GPU,
  about right on a CPU); the rest of a measured round (server, messages, evaluation) is kept as
  measured; the job's start-up (its wall time outside the rounds) is added once;
* memory is compared as measured (at batch ``b``; activations grow with the batch, so on a GPU
  rerun the rehearsal with ``examples_per_client`` >= the batch to measure it at full batch).

Device-hours per table: the number of cells of the paper grid that build the table times the
projected training hours of the matching rehearsal cell (same paper, method and backbone; else
the paper's mean).  Projections are estimates from a few steps; they say so.

The numbers, not only the crashes (:func:`run_checks`): every finished cell's round log is held
against a stated bound per check (:data:`CHECK_BOUNDS`) -- finite losses, the server's step
against the clients' mean update (the strategy's ``server_step`` entry, bounded per paper and
method by :func:`expected_server_step`), FedSUMM's ρ band, AdaFedSelecKD's KD share, and the
bytes on the wire against the method's declared shared parameters.  A cell outside a bound is
``warn`` with the reasons (``warnings``); ``warn`` does not fail the rehearsal, ``failed`` does.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from fedrepro.flops import mfu
from fedrepro.io import read_json, write_json_atomic, write_text_atomic

ERROR_MARKERS = ("Error", "error", "Traceback", "Exception", "Killed", "MemoryError")


def _read_benchmark(path: Path) -> dict | None:
    """Snakemake's benchmark TSV: ``s`` (wall seconds), ``max_rss`` (MB), ... (last row)."""
    if not path.exists():
        return None
    rows = list(csv.DictReader(path.open(), delimiter="\t"))
    if not rows:
        return None
    out = {}
    for key in ("s", "max_rss", "max_vms", "max_uss", "cpu_time"):
        try:
            out[key] = float(rows[-1][key])
        except (KeyError, TypeError, ValueError):
            out[key] = None
    return out


def _failure_reason(log: Path) -> str:
    if not log.exists():
        return f"the job did not run or left no log ({log}); see Snakemake's output"
    lines = log.read_text(errors="replace").splitlines()
    hits = [ln for ln in lines if any(m in ln for m in ERROR_MARKERS)]
    tail = (hits or lines)[-3:]
    return f"{log}: " + " | ".join(ln.strip()[:300] for ln in tail)


def _train_sizes(cell: dict, root: Path) -> list[int] | None:
    sizes = []
    for client in cell.get("clients", []):
        folder = (cell.get("client_data") or {}).get(client)
        path = root / str(folder) / "train.jsonl" if folder else None
        if path is None or not path.exists():
            return None
        with path.open("rb") as fh:
            sizes.append(sum(1 for line in fh if line.strip()))
    return sizes


def _epochs(train: dict) -> int:
    for key in ("local_epochs", "epochs"):
        if key in train:
            return int(train[key])
    return 1


def measure_cell(entry: dict, root: Path, settings: dict, full_rounds: int | None) -> dict:
    """The report row of one rehearsal cell (``root``: the rehearsal's working directory)."""
    out = {k: entry[k] for k in ("paper", "method", "backbone", "setting", "cell")}
    missing = [f for f in entry["files"] if not (root / f).exists()]
    benches = {j: _read_benchmark(root / spec["benchmark"]) for j, spec in entry["jobs"].items()}
    out["declared"] = {j: spec["resources"] for j, spec in entry["jobs"].items()}
    if missing:
        out["status"] = "failed"
        out["reason"] = "; ".join(_failure_reason(root / spec["log"]) for spec in entry["jobs"].values())
        out["missing"] = missing
        return out
    out["status"] = "ok"
    prov = read_json(root / entry["cell"] / "provenance.json")
    cell = prov["cell"]
    timing = prov.get("timing") or {}
    rounds = timing.get("rounds") or []
    round_s = [float(r["seconds"]) for r in rounds if r.get("seconds") is not None]
    steps = [c.get("seconds_per_step") for r in rounds for c in r.get("clients", [])]
    steps = [float(x) for x in steps if x]
    step_total = [sum(float(c.get("seconds_steps") or 0) for c in r.get("clients", [])) for r in rounds]
    gpu = [float(c["peak_gpu_mb"]) for r in rounds for c in r.get("clients", []) if c.get("peak_gpu_mb")]
    train = cell.get("train", {})
    batch = int(train.get("batch_size", 1))
    # the examples a trainer really had (the round log's num_examples): a pooled trainer --
    # FedSUMM's `all`, AdaFedSelecKD's AdaCentralized -- holds every client's examples_per_client
    round_log = read_round_log(root / entry["cell"])
    trained = [int(c["num_examples"]) for r in round_log[:1]
               for c in r.get("clients", []) if isinstance(c, dict) and c.get("num_examples")]
    eff_batch = min(batch, max(trained) if trained else int(settings["examples_per_client"]))
    bytes_rounds = prov.get("bytes_per_round") or []
    train_bench = benches.get("train") or {}
    eval_bench = benches.get("evaluate") or {}
    shared_by = int(entry["jobs"]["train"].get("shared_by", 1))
    rss = [b.get("max_rss") for b in benches.values() if b and b.get("max_rss") is not None]
    out.update({
        "engine": prov.get("engine"),
        "device": "cuda" if (prov.get("machine") or {}).get("cuda") and gpu else "cpu",
        "rounds_run": len(round_s),
        "wall_s": prov.get("wall_time_s"),
        "train_job_s": train_bench.get("s"),
        "evaluate_job_s": eval_bench.get("s"),
        "job_cells": shared_by,
        "round_s": round_s,
        "step_s": statistics.median(steps) if steps else None,
        "steps_per_round": [
            round(sum(float(c.get("seconds_steps") or 0) / float(c["seconds_per_step"])
                      for c in r.get("clients", []) if c.get("seconds_per_step")))
            for r in rounds
        ],
        "batch_size": batch,
        "effective_batch": eff_batch,
        "peak_rss_mb": max(rss) if rss else None,
        "driver_peak_rss_mb": timing.get("peak_rss_mb"),
        "peak_gpu_mb": max(gpu) if gpu else None,
        "bytes_per_round": (
            statistics.mean(b["down"] + b["up"] for b in bytes_rounds) if bytes_rounds else 0
        ),
        "parameters": prov.get("parameters"),
    })
    # -- model FLOPs per step (one counted step per method: fedrepro.devices.StepTimer) and MFU
    counted = [float(c["flops_per_step"]) for r in rounds for c in r.get("clients", [])
               if c.get("flops_per_step")]
    precision = str(cell.get("precision", "fp32"))
    out["precision"] = precision
    # why this cell's bf16 was emulated, where its process trained (fedrepro.precision)
    out["emulated_bf16"] = (prov.get("precision") or {}).get("emulated_bf16")
    out["flops_per_step"] = max(counted) if counted else None
    gpu_name = (prov.get("machine") or {}).get("gpu") if out["device"] == "cuda" else None
    out.update(mfu(out["flops_per_step"], out["step_s"], gpu_name, precision))
    # -- projection to the paper's rounds and data
    sizes = _train_sizes(cell, root)
    proj: dict = {"full_rounds": full_rounds, "assumption": "step time linear in the batch"}
    if sizes is not None and steps and round_s and full_rounds:
        per_round_clients = int(cell.get("clients_per_round") or len(sizes))
        frac = per_round_clients / max(len(sizes), 1)
        full_steps = frac * sum(_epochs(train) * math.ceil(n / batch) for n in sizes)
        step_full = statistics.median(steps) * batch / eff_batch
        overhead = max(statistics.mean(r - s for r, s in zip(round_s, step_total)), 0.0)
        startup = max(float(prov.get("wall_time_s") or 0) - sum(round_s), 0.0)
        train_s = full_rounds * (full_steps * step_full + overhead) + startup
        proj.update({
            "client_train_examples": sizes,
            "steps_per_round": full_steps,
            "step_s_at_paper_batch": step_full,
            "round_s": full_steps * step_full + overhead,
            "train_hours": train_s / 3600,
        })
        declared = out["declared"]["train"]
        runtime_min = declared.get("runtime")
        if runtime_min:
            # a row job trains several cells: compare its share of the declared runtime
            proj["runtime_covered"] = train_s / 60 <= float(runtime_min) / shared_by
    mem = out["declared"]["train"].get("mem_mb")
    if mem and out.get("peak_rss_mb"):
        proj["memory_covered"] = out["peak_rss_mb"] <= float(mem)
    out["projection"] = proj
    # -- the numbers against their bounds (CHECK_BOUNDS)
    checks = run_checks(entry["paper"], entry["method"], cell, prov, round_log, backbone_weights(cell, root))
    out["checks"] = checks
    warnings = [f"{name}: {reason}" for name, c in checks.items() for reason in c.get("reasons", [])]
    if warnings:
        out["status"] = "warn"
        out["warnings"] = warnings
    return out


# -- the numbers: per-cell checks, a stated bound each -------------------------------------------
WIRE_DTYPE_BYTES = 4
"""Bytes per shared entry on the wire: every paper sends float32 tensors."""

STEP_SLACK = 0.05
"""Relative slack of the server-step bounds: the new global model is stored in float32, and its
rounding is a visible fraction of a small step (lr 1e-5 moves an entry of size 1 by ~1e-5, its
float32 rounding is ~6e-8, 0.6 %; the repository's runs give 1 ± 2e-6)."""

RHO_BAND = (1.0, 5.0)
"""FedSUMM's ρ per client and round (the demo's: 1.0-1.6).  Under ``rho_reduction: expected``
ρ = 1 + χ²(p‖q) >= 1 (to RHO_TOLERANCE); under ``mean`` it can fall below 1 (band (0, 5])."""

RHO_TOLERANCE = 1e-6

KD_KIND = {"AdaFedKD": "all", "AdaFedSelectKD": "selective", "AdaFedHardKD": "hard"}
"""AdaFedSelecKD's distilling methods (``papers.adafedseleckd.methods``: ``distill`` with
``selective`` / ``hard_kd``); every other method distils nothing."""

SERVER_OPTIMIZER_DEFAULTS = {
    "adam": {"eta": 0.1, "beta_1": 0.9, "beta_2": 0.99},
    "yogi": {"eta": 0.01, "beta_1": 0.9, "beta_2": 0.99},
    "adagrad": {"eta": 0.1, "beta_1": 0.0, "beta_2": 0.0},
}
"""Flower 1.41's FedAdam / FedYogi / FedAdagrad defaults (FedAdagrad fixes β₁ = β₂ = 0)."""

CHECKS = ("finite_losses", "server_step", "fedsumm_rho", "kd_share", "payload")

CHECK_BOUNDS = {
    "finite_losses": "every client loss and loss term in the round log (keys with 'loss' or 'nll', "
                     "FedSum's L_* terms) is a finite number (FedSUMM's log writes a non-finite "
                     "value as null: null counts as non-finite)",
    "server_step": "the strategy's server_step per round: r = ‖w_{t+1} − w_t‖ / ‖mean client Δ‖ over "
                   "the tensors both broadcast and returned with the same shape.  A server that "
                   "averages the returned models: r against its own mean (FedAvg: the "
                   "num-examples-weighted one) = its scale s ± 5 % (s = 1; SCAFFOLD: η_g; FedNova "
                   "with equal local steps: 1).  A server that scales client c's update by s_c <= "
                   "s_max (FedSUMM: 1 + ε·ρ_c with ρ in the band, so s_max = 1 + 5ε; FedNova: "
                   "τ_eff/τ_c): r <= s_max · D · 1.05, D = the mean of the clients' ‖Δ_c‖ over the "
                   "mean's norm (triangle inequality).  FedOpt (AdaFedOPT): every entry moves by "
                   "at most η·K(t) · 1.05 (K from β₁, β₂ and the round, Cauchy-Schwarz on m_t/√v_t).  "
                   "Not judged: DP regimes (the step carries the noise), FedDC (each client starts "
                   "from its own model), methods whose uplink is not model-shaped (FedProto)",
    "fedsumm_rho": f"FedSUMM / FedAvg cells of FedSUMM: every client's ρ in [{RHO_BAND[0]:g}, "
                   f"{RHO_BAND[1]:g}] (the demo's: 1.0-1.6; ρ = 1 + χ² >= 1 under rho_reduction "
                   "expected, (0, 5] under mean)",
    "kd_share": "AdaFedSelecKD: every client's KD share (kd_fraction: distilled / target tokens) is "
                "finite and in [0, 1]; AdaFedKD (τ = ∞) = 1; methods without KD = 0; AdaFedHardKD "
                "(noun/verb tokens, from the text, not the weights): 0 < round share < 1; "
                "AdaFedSelectKD: 0 < round share < 1 on pretrained weights, not judged on random "
                "ones (kind: shape, tiny): their teacher's entropy is a property of the "
                "initialisation's logit scale (BART/LED's std-0.02 head: near ln|V| ≈ 10.8 > τ, "
                "share ≈ 0; a larger init scale: up to 1), not of the method",
    "payload": f"every round: each client's uplink bytes = the method's declared shared entries "
               f"(parameters.shared_per_round) × {WIRE_DTYPE_BYTES} B (float32), the downlink = "
               "clients × that (+ FedSUMM's guidance: a whole number of guidance_per_round × 4 B, "
               "at most one per client); not judged where the method declares no "
               "shared_per_round (FedSum)",
}


def _result(check: str, reasons=(), values=None, skip: str | None = None) -> dict:
    out: dict = {"check": check}
    if skip is not None:
        out.update(status="skip", note=skip)
    else:
        reasons = list(reasons)
        out["status"] = "warn" if reasons else "ok"
        if reasons:
            out["reasons"] = reasons[:3] + ([f"(and {len(reasons) - 3} more)"] if len(reasons) > 3 else [])
    if values:
        out["values"] = values
    return out


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x) -> bool:
    return _is_number(x) and math.isfinite(x)


def _is_loss_key(key) -> bool:
    k = str(key)
    return "loss" in k.lower() or "nll" in k.lower() or k.startswith(("L_", "L-"))


def _loss_leaves(obj, path: str, under: bool = False):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _loss_leaves(v, f"{path}.{k}", under or _is_loss_key(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _loss_leaves(v, f"{path}[{i}]", under)
    elif under and (obj is None or _is_number(obj)):
        yield path, obj


def check_finite_losses(rounds: list[dict]) -> dict:
    if not rounds:
        return _result("finite_losses", skip="no round log")
    bad, n = [], 0
    for e in rounds:
        for path, v in _loss_leaves(e, f"round {e.get('round')}"):
            n += 1
            if not _finite(v):
                bad.append(f"non-finite loss: {path} = {v}")
    if not n:
        return _result("finite_losses", skip="the round log records no loss")
    return _result("finite_losses", bad, {"losses": n})


def _method_base(method: str) -> str:
    return str(method).split("~", 1)[0]


def adaptive_step_bound(name: str, eta: float, beta_1: float, beta_2: float, t: int,
                        bias_correction: str = "flower") -> float:
    """η·K(t): the most Flower 1.41's FedOpt server moves one entry in round ``t`` (moments from
    round 1; step η_t·m_t/(√v_t + τ) with m_t = Σ_s (1−β₁)β₁^(t−s) Δ_s):

    * FedAdam: v_t = Σ_s (1−β₂)β₂^(t−s) Δ_s², η_t = η·√(1−β₂^(t+1))/(1−β₁^(t+1)) (Flower's bias
      correction of round t; ``bias_correction: adam`` uses the exponent t, ``none`` no
      correction -- ``AdaFedOptStrategy``); Cauchy-Schwarz: |m_t| <= √(Σ_k (1−β₁)²/(1−β₂)·(β₁²/β₂)^k)·√v_t;
    * FedYogi: v_t >= (1−β₂)β₂^(t−s)Δ_s² for every s (β₂ >= 1/2), so
      |m_t|/√v_t <= (1−β₁)/√(1−β₂)·Σ_k (β₁/√β₂)^k;
    * FedAdagrad: v_t = Σ_s Δ_s²: |m_t|/√v_t <= (1−β₁)·√(Σ_k β₁^(2k)) (= 1 at Flower's β₁ = 0).
    """
    t = max(int(t), 1)
    if name == "adam":
        e = {"flower": t + 1, "adam": t}.get(bias_correction)
        bias = 1.0 if e is None else math.sqrt(1 - beta_2 ** e) / (1 - beta_1 ** e)
        q = beta_1 ** 2 / beta_2
        return eta * bias * (1 - beta_1) / math.sqrt(1 - beta_2) * math.sqrt(sum(q ** k for k in range(t)))
    if name == "yogi":
        q = beta_1 / math.sqrt(beta_2)
        return eta * (1 - beta_1) / math.sqrt(1 - beta_2) * sum(q ** k for k in range(t))
    if name == "adagrad":
        return eta * (1 - beta_1) * math.sqrt(sum(beta_1 ** (2 * k) for k in range(t)))
    raise ValueError(f"unknown server optimizer {name!r}")


def _nova(steps, clients: list[dict]) -> dict:
    """FedNova's x ← x + τ_eff·Σ p_c Δ_c/τ_c: client c's update scaled by τ_eff/τ_c."""
    if not steps or len(steps) != len(clients):
        return {"kind": "skip", "why": "FedNova: the round log has no local step counts"}
    n = [float(c.get("num_examples", 1)) for c in clients]
    p = [x / sum(n) for x in n]
    tau_eff = sum(pi * t for pi, t in zip(p, steps))
    scales = [tau_eff / t for t in steps]
    if max(steps) == min(steps):
        return {"kind": "exact", "reference": "weighted", "scale": 1.0,
                "why": f"FedNova with equal local steps ({steps[0]}): the weighted mean"}
    return {"kind": "scaled", "reference": "weighted", "scale": max(scales),
            "why": f"FedNova: local steps {list(steps)}, client scales τ_eff/τ_c <= {max(scales):.3g}"}


def expected_server_step(paper: str, method: str, cell: dict, entry: dict) -> dict:
    """What a round's server step should be for this paper and method (:data:`CHECK_BOUNDS`):
    ``{"kind": "exact" | "scaled" | "adaptive" | "skip", "reference": "weighted" | "uniform",
    "scale": s, "why": ...}`` (``adaptive``: ``"max_abs"``, the per-entry bound)."""
    base = _method_base(cell.get("method") or method)
    weighted = {"kind": "exact", "reference": "weighted", "scale": 1.0,
                "why": "FedAvg: the num-examples-weighted mean of the returned models"}
    if paper == "fedsumm":
        regime = cell.get("regime", method)
        dp = cell.get("dp") or {}
        if dp.get("enabled") and regime in (dp.get("regimes") or []):
            return {"kind": "skip", "why": "DP regime: the server step carries the Gaussian noise"}
        alg = cell.get("algorithm") or {}
        eps = float(alg.get("epsilon", 0.1))
        if regime == "FedSUMM" and alg.get("apply_on_server", True) and eps > 0:
            own = (alg.get("memory_assignment", "own") == "own"
                   and alg.get("client_gradient", "delta") == "delta")
            if not own:
                return {"kind": "skip", "why": "FedSUMM's adapter adds a memory entry that is not "
                        "the client's own update (memory_assignment / client_gradient): no bound "
                        "from the replies"}
            s_max = 1 + eps * RHO_BAND[1]
            return {"kind": "scaled", "reference": "uniform", "scale": s_max,
                    "why": f"FedSUMM: client c's update times 1 + ε·ρ_c <= 1 + {eps:g}·{RHO_BAND[1]:g}"}
        return {"kind": "exact", "reference": "uniform", "scale": 1.0,
                "why": "Algorithm 1: the plain mean of the returned models"}
    if paper == "fedsum":
        if base == "SCAFFOLD":
            eta_g = float((cell.get("baselines") or {}).get("scaffold_global_lr", 1.0))
            return {"kind": "exact", "reference": "uniform", "scale": eta_g,
                    "why": f"SCAFFOLD: x + η_g·mean(y_c − x), η_g = {eta_g:g}"}
        if base == "FedNova":
            return _nova((entry.get("server") or {}).get("local_steps"), entry.get("clients") or [])
        if base == "FedDC":
            return {"kind": "skip", "why": "FedDC: each client starts from the model it holds"}
        if base == "FedProto":
            return {"kind": "skip", "why": "FedProto: only prototypes cross the wire"}
        return dict(weighted, why=f"{base}: the n_i/n-weighted mean of the returned Ω")
    if paper == "adafedseleckd":
        if base == "AdaFedOPT":
            opt = dict(cell.get("server_optimizer") or {"name": "adam"})
            name = opt.get("name", "adam")
            d = SERVER_OPTIMIZER_DEFAULTS.get(name)
            if d is None:
                return {"kind": "skip", "why": f"unknown server optimizer {name!r}"}
            hp = {k: float(opt.get(k, v)) for k, v in d.items()}
            if name == "adagrad":  # AdaFedOptStrategy drops β for FedAdagrad (Flower fixes 0)
                hp.update(beta_1=0.0, beta_2=0.0)
            t = int(entry.get("round") or 1)
            bound = adaptive_step_bound(name, hp["eta"], hp["beta_1"], hp["beta_2"], t,
                                        str(opt.get("bias_correction", "flower")))
            return {"kind": "adaptive", "scale": bound,
                    "why": f"Fed{name.capitalize()} (η = {hp['eta']:g}, β₁ = {hp['beta_1']:g}, "
                           f"β₂ = {hp['beta_2']:g}), round {t}: |step_i| <= η·K(t) = {bound:.4g}"}
        if base == "AdaFedNova":
            return _nova(entry.get("local_steps"), entry.get("clients") or [])
        return weighted
    return weighted


def _judge_step(t, step: dict, exp: dict) -> str | None:
    """The reason a round's ``server_step`` is outside its expectation (None: inside)."""
    if exp["kind"] == "adaptive":
        got = step.get("max_abs_server_step")
        if not _finite(got):
            return f"round {t}: the server step is not finite (max |step| = {got})"
        if got > exp["scale"] * (1 + STEP_SLACK):
            return (f"round {t}: an entry moved by {got:.4g} > η·K(t) = {exp['scale']:.4g} "
                    f"(+{STEP_SLACK:.0%}) ({exp['why']})")
        return None
    weighted = exp["reference"] == "weighted"
    ratio = step.get("weighted_ratio" if weighted else "ratio")
    mean_norm = step.get("weighted_mean_update_norm" if weighted else "mean_update_norm")
    which = "weighted" if weighted else "uniform"
    if ratio is None:
        server = step.get("server_norm")
        if _finite(server) and server == 0:
            return None
        return (f"round {t}: the server moved (‖Δ_server‖ = {server}) while the clients' {which} mean "
                "update is 0")
    if not _finite(ratio):
        return f"round {t}: ‖Δ_server‖ / ‖{which} mean client Δ‖ is not finite ({ratio})"
    if exp["kind"] == "exact":
        s = exp["scale"]
        if abs(ratio - s) > STEP_SLACK * max(abs(s), 1e-12):
            return (f"round {t}: ‖Δ_server‖ / ‖{which} mean client Δ‖ = {ratio:.4g}, expected "
                    f"{s:g} ± {STEP_SLACK * s:.2g} ({exp['why']})")
        return None
    spread = step.get("client_update_norm_weighted" if weighted else "client_update_norm_mean")
    dispersion = spread / mean_norm if _finite(spread) and mean_norm else math.inf
    limit = exp["scale"] * dispersion * (1 + STEP_SLACK)
    if ratio > limit:
        return (f"round {t}: ‖Δ_server‖ / ‖{which} mean client Δ‖ = {ratio:.4g} > s_max·D = "
                f"{exp['scale']:.3g}·{dispersion:.3g} (+{STEP_SLACK:.0%}) ({exp['why']})")
    return None


def check_server_step(paper: str, method: str, cell: dict, rounds: list[dict]) -> dict:
    if not rounds:
        return _result("server_step", skip="no round log")
    reasons, notes, values = [], [], []
    for e in rounds:
        t = e.get("round")
        step = e.get("server_step")
        if step is None:
            notes.append("the round log has no server_step (not a federated run, or one made "
                         "before the strategy recorded it)")
            continue
        if not step.get("tensors"):
            notes.append(step.get("note") or "no ratio: no tensor is both broadcast and returned "
                         "with the same shape (the uplink is not model-shaped)")
            continue
        exp = expected_server_step(paper, method, cell, e)
        if exp["kind"] == "skip":
            notes.append(exp["why"])
            continue
        key = {"weighted": "weighted_ratio", "uniform": "ratio"}.get(exp.get("reference"), "ratio")
        values.append({"round": t, "ratio": step.get(key), "reference": exp.get("reference", "max_abs"),
                       "max_abs_step": step.get("max_abs_server_step"), "tensors": step.get("tensors"),
                       "skipped_tensors": step.get("skipped_tensors"), "expected": exp["why"]})
        reason = _judge_step(t, step, exp)
        if reason:
            reasons.append(reason)
    if not values:
        return _result("server_step", skip="; ".join(dict.fromkeys(notes)) or "no server step")
    out = _result("server_step", reasons, {"rounds": values})
    if notes:
        out["note"] = "; ".join(dict.fromkeys(notes))
    return out


def check_fedsumm_rho(paper: str, method: str, cell: dict, rounds: list[dict]) -> dict | None:
    if paper != "fedsumm":
        return None
    regime = cell.get("regime", method)
    if regime not in ("FedAvg", "FedSUMM"):
        return _result("fedsumm_rho", skip=f"regime {regime}: not federated, no ρ")
    if not rounds:
        return _result("fedsumm_rho", skip="no round log")
    mean_reduction = (cell.get("algorithm") or {}).get("rho_reduction", "expected") == "mean"
    band = f"(0, {RHO_BAND[1]:g}]" if mean_reduction else f"[{RHO_BAND[0]:g}, {RHO_BAND[1]:g}]"

    def inside(r: float) -> bool:
        low_ok = r > 0 if mean_reduction else r >= RHO_BAND[0] - RHO_TOLERANCE
        return low_ok and r <= RHO_BAND[1]

    reasons, seen = [], []
    for e in rounds:
        rho = e.get("rho")
        if not isinstance(rho, dict) or not rho:
            reasons.append(f"round {e.get('round')}: no ρ in the round log")
            continue
        for client, r in sorted(rho.items()):
            if not _finite(r):
                reasons.append(f"round {e.get('round')}: ρ of client {client} is not finite ({r})")
                continue
            seen.append(r)
            if not inside(r):
                reasons.append(f"round {e.get('round')}: ρ of client {client} = {r:.4g} outside "
                               f"{band} (the demo's: 1.0-1.6)")
    values = {"min": min(seen), "max": max(seen)} if seen else None
    return _result("fedsumm_rho", reasons, values)


def backbone_weights(cell: dict, root: Path) -> str:
    """``pretrained`` (a checkpoint), ``random`` (``kind: shape``), ``tiny`` (the demo's small
    models) or ``unknown`` (the backbone folder is not there)."""
    folder = cell.get("backbone_dir")
    if not folder:
        return "unknown"
    folder = root / str(folder)
    meta = folder / "fedrepro_backbone.json"
    if meta.exists():
        info = read_json(meta)
        scale = info.get("kind") or info.get("scale")
        return {"shape": "random", "tiny": "tiny"}.get(scale, "pretrained")
    return "pretrained" if folder.exists() else "unknown"


def check_kd_share(paper: str, method: str, cell: dict, rounds: list[dict], weights: str) -> dict | None:
    if paper != "adafedseleckd":
        return None
    kind = KD_KIND.get(_method_base(cell.get("method") or method))
    reasons, shares = [], []
    any_share = False
    for e in rounds:
        t = e.get("round")
        fr = [(c.get("partition_id"), c.get("kd_fraction")) for c in e.get("clients") or []
              if "kd_fraction" in c]
        if not fr:
            continue
        any_share = True
        for pid, f in fr:
            if not _finite(f) or not 0.0 <= f <= 1.0:
                reasons.append(f"round {t}: client {pid}'s KD share {f} is outside [0, 1]")
        kd = sum(float(c.get("n_kd_tokens") or 0) for c in e["clients"])
        tokens = sum(float(c.get("n_tokens") or 0) for c in e["clients"])
        finite = [f for _, f in fr if _finite(f)]
        if tokens:
            share = kd / tokens  # the round's share of distilled target tokens
        else:
            share = statistics.mean(finite) if finite else math.nan
        shares.append(share)
        if kind is None and any(_finite(f) and f != 0 for _, f in fr):
            reasons.append(f"round {t}: a method without KD distilled tokens (share {share:.3g})")
        elif kind == "all" and any(_finite(f) and f != 1 for _, f in fr):
            reasons.append(f"round {t}: AdaFedKD distils every token (τ = ∞) but the share is {share:.4g}")
        elif kind == "hard" or (kind == "selective" and weights == "pretrained"):
            if _finite(share) and not 0.0 < share < 1.0:
                gate = "the noun/verb mask" if kind == "hard" else "the entropy gate"
                reasons.append(f"round {t}: degenerate KD share {share:.3g} ({gate} "
                               f"{'never' if share == 0 else 'always'} opens)")
    if not any_share:
        return _result("kd_share", skip="the round log has no kd_fraction")
    values = {"round_shares": shares, "kind": kind or "none", "weights": weights}
    out = _result("kd_share", reasons, values)
    if kind == "selective" and weights != "pretrained":
        out["note"] = f"{weights} weights: degeneracy of the entropy gate not judged"
    return out


def check_payload(prov: dict, rounds: list[dict]) -> dict:
    params = prov.get("parameters") or {}
    shared = params.get("shared_per_round")
    if shared is None:
        return _result("payload", skip="the method's parameter report declares no shared_per_round")
    if not rounds:
        return _result("payload", skip="no round log")
    per_client = int(shared) * WIRE_DTYPE_BYTES
    guidance = int(params.get("guidance_per_round") or 0) * WIRE_DTYPE_BYTES
    reasons = []
    for e in rounds:
        t = e.get("round")
        clients = e.get("clients") or []
        for c in clients:
            up = c.get("uplink_bytes", 0 if not shared else None)
            if up != per_client:
                reasons.append(f"round {t}: client {c.get('partition_id')} sent {up} B up, the method "
                               f"declares {shared} shared entries × {WIRE_DTYPE_BYTES} B = {per_client} B")
        g = int(e.get("guidance_bytes_down") or 0)
        down = int(e.get("bytes_down") or 0) - g
        if down != len(clients) * per_client:
            reasons.append(f"round {t}: {down} B sent down to {len(clients)} clients, declared "
                           f"{len(clients)} × {per_client} B = {len(clients) * per_client} B")
        if (g and not guidance) or (guidance and (g % guidance or g // guidance > len(clients))):
            reasons.append(f"round {t}: {g} B of guidance sent down, not a whole number (<= "
                           f"{len(clients)}) of the declared {guidance} B per client")
    return _result("payload", reasons, {"declared_bytes_per_client": per_client,
                                        "guidance_bytes_per_client": guidance})


def run_checks(paper: str, method: str, cell: dict, prov: dict, rounds: list[dict],
               weights: str = "unknown") -> dict[str, dict]:
    """Every check of :data:`CHECKS` that applies to the cell: ``{check: result}`` with
    ``status`` ok / warn (``reasons``) / skip (``note``) and the values judged."""
    results = {
        "finite_losses": check_finite_losses(rounds),
        "server_step": check_server_step(paper, method, cell, rounds),
        "fedsumm_rho": check_fedsumm_rho(paper, method, cell, rounds),
        "kd_share": check_kd_share(paper, method, cell, rounds, weights),
        "payload": check_payload(prov, rounds),
    }
    return {k: v for k, v in results.items() if v is not None}


def read_round_log(cell_dir: Path) -> list[dict]:
    """The cell's ``train_log.json`` rounds, else its checkpoints' round JSONs."""
    path = cell_dir / "train_log.json"
    if path.exists():
        return list(read_json(path).get("rounds") or [])
    metas = sorted((cell_dir / "checkpoints").glob("server_round_*.json"))
    return [read_json(p) for p in metas]


def _match(rows: list[dict], paper: str, path: str) -> list[dict]:
    parts = set(Path(path).parts)
    mine = [r for r in rows if r["paper"] == paper and r.get("projection", {}).get("train_hours")]
    both = [r for r in mine if r["method"] in parts and r["backbone"] in parts]
    if both:
        return both
    same_backbone = [r for r in mine if r["backbone"] in parts]
    return same_backbone or mine


def table_hours(rows: list[dict], grids: dict[str, dict[str, list[str]]]) -> list[dict]:
    """``grids``: paper -> table/figure -> the full grid's cell folders."""
    out = []
    for paper, targets in grids.items():
        for target, cells in targets.items():
            hours, matched = 0.0, True
            for cell in cells:
                m = _match(rows, paper, cell)
                if not m:
                    matched = False
                    break
                hours += statistics.mean(r["projection"]["train_hours"] for r in m)
            out.append({"paper": paper, "target": target, "cells": len(set(cells)),
                        "train_hours": round(hours, 2) if matched else None})
    return out


def _fmt(x, digits=1):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**NO**"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _mfu_text(r: dict) -> str:
    """``12.3 % (1.2 %)``: MFU against the precision's peak (against the bf16 dense peak)."""
    if r.get("mfu") is None:
        return "–"
    return f"{100 * r['mfu']:.1f} % ({100 * r['mfu_vs_bf16_peak']:.1f} %)"


def render_md(report: dict) -> str:
    s = report["settings"]
    lines = [
        "# Paper-scale rehearsal",
        "",
        f"{report['summary']['ok']} of {report['summary']['cells']} cells ok, "
        f"{report['summary'].get('warn', 0)} warn, "
        f"{report['summary']['failed']} failed; machine: {report['machine']}; "
        f"{s['rounds']} round(s), {s['examples_per_client']} training / {s['eval_examples']} "
        f"evaluation examples per client, generation capped at {s['max_new_tokens']} new tokens, "
        f"coverage `{s['coverage']}`, data `{s['data']}`, backbones `{s['backbones']}`.",
        "",
        "Backbones: " + ", ".join(f"{k} ({v})" for k, v in sorted(report["backbones"].items())),
        "",
        f"Precision: {precision_text(report.get('precision'))}",
        "",
        "| paper | method | backbone | setting | status | s/round | step s (batch) | GFLOP/step "
        "| MFU (bf16 peak) | peak RSS MB | declared MB | mem ok | bytes/round | projected train h "
        "| declared h | time ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["cells"]:
        p = r.get("projection") or {}
        d = (r.get("declared") or {}).get("train", {})
        rs = r.get("round_s") or []
        declared_h = d.get("runtime") / 60 / r.get("job_cells", 1) if d.get("runtime") else None
        lines.append(
            f"| {r['paper']} | {r['method']} | {r['backbone']} | {r['setting']} | {r['status']} "
            f"| {_fmt(statistics.mean(rs) if rs else None)} "
            f"| {_fmt(r.get('step_s'), 2)} ({r.get('effective_batch', '–')}/{r.get('batch_size', '–')}) "
            f"| {_fmt(r['flops_per_step'] / 1e9 if r.get('flops_per_step') else None, 1)} "
            f"| {_mfu_text(r)} "
            f"| {_fmt(r.get('peak_rss_mb'), 0)} | {_fmt(d.get('mem_mb'))} | {_fmt(p.get('memory_covered'))} "
            f"| {_fmt(r.get('bytes_per_round'))} | {_fmt(p.get('train_hours'), 2)} | {_fmt(declared_h, 1)} "
            f"| {_fmt(p.get('runtime_covered'))} |"
        )
    failed = [r for r in report["cells"] if r["status"] == "failed"]
    if failed:
        lines += ["", "## Failed cells", ""]
        lines += [f"- `{r['cell']}`: {r.get('reason')}" for r in failed]
    warned = [r for r in report["cells"] if r["status"] == "warn"]
    if warned:
        lines += ["", "## Cells outside a bound (warn)", ""]
        lines += [f"- `{r['cell']}`: {w}" for r in warned for w in r.get("warnings", [])]
    lines += _render_checks(report)
    lines += ["", f"## Projected {report['device_hours_unit']} per table (training only)", "",
              "| paper | table/figure | cells | hours |", "|---|---|---|---|"]
    lines += [f"| {t['paper']} | {t['target']} | {t['cells']} | {_fmt(t['train_hours'], 2)} |"
              for t in report["tables"]]
    lines += ["", "Notes: " + " ".join(report["notes"]), ""]
    return "\n".join(lines)


def _check_cell(c: dict | None) -> str:
    """One check of one cell in the checks table: its status and the value judged."""
    if not c:
        return ""
    if c["status"] == "skip":
        return "–"
    mark = "ok" if c["status"] == "ok" else "**warn**"
    v = c.get("values") or {}
    if c["check"] == "server_step":
        ratios = [x["ratio"] for x in v.get("rounds", []) if _finite(x.get("ratio"))]
        steps = [x["max_abs_step"] for x in v.get("rounds", []) if _finite(x.get("max_abs_step"))]
        if v.get("rounds") and v["rounds"][0]["reference"] == "max_abs" and steps:
            return f"{mark} (max \\|step\\| {max(steps):.3g})"
        if ratios:
            return f"{mark} (r {min(ratios):.4g}–{max(ratios):.4g}, {v['rounds'][0]['reference']})"
    if c["check"] == "fedsumm_rho" and v:
        return f"{mark} ({v['min']:.3g}–{v['max']:.3g})"
    if c["check"] == "kd_share" and v.get("round_shares"):
        shares = [x for x in v["round_shares"] if _finite(x)]
        if shares:
            return f"{mark} ({min(shares):.3g}–{max(shares):.3g})"
    if c["check"] == "payload" and v:
        return f"{mark} ({v['declared_bytes_per_client']} B/client)"
    if c["check"] == "finite_losses" and v:
        return f"{mark} ({v['losses']} values)"
    return mark


def _render_checks(report: dict) -> list[str]:
    lines = ["", "## Checks (the numbers against stated bounds)", ""]
    lines += [f"- **{name}**: {CHECK_BOUNDS[name]}." for name in CHECKS]
    lines += ["", "| paper | method | backbone | setting | status | " + " | ".join(CHECKS) + " |",
              "|---|---|---|---|---|" + "---|" * len(CHECKS)]
    notes = []
    for r in report["cells"]:
        checks = r.get("checks") or {}
        lines.append(f"| {r['paper']} | {r['method']} | {r['backbone']} | {r['setting']} | {r['status']} | "
                     + " | ".join(_check_cell(checks.get(name)) for name in CHECKS) + " |")
        for name in CHECKS:
            c = checks.get(name) or {}
            if c.get("note"):
                notes.append(f"- `{r['cell']}` {name}: {c['note']}")
    lines += ["", "– : not judged for the cell (why below); r: ‖Δ_server‖ / ‖mean client Δ‖ against "
              "the mean the method averages with (weighted by num-examples or uniform)."]
    if notes:
        lines += ["", "Not judged / notes:", ""] + notes
    return lines


def precision_text(decision: dict | None) -> str:
    """The rehearsal's precision in words (:func:`fedrepro.rehearsal.plan.resolve_precision`):
    each paper's own, or fp32 in place of which papers' settings, and why."""
    if not decision:
        return "each paper's own (`precision`, `frozen_dtype`)"
    changed = decision.get("fp32_instead_of") or {}
    if decision.get("ran") != "fp32":
        return f"each paper's own (`rehearsal_settings.precision: {decision.get('setting')}`; {decision.get('reason')})"
    if not changed:
        return f"fp32 (every paper's own precision is fp32; {decision.get('reason')})"
    was = "; ".join(f"{paper}: " + ", ".join(f"{k} {v}" for k, v in sorted(keys.items()))
                    for paper, keys in sorted(changed.items()))
    return (f"**fp32 in place of the paper config's** {was} (`rehearsal_settings.precision: "
            f"{decision.get('setting')}`; {decision.get('reason')}).  Those cells' step times and MFU "
            f"are fp32's; the bf16 code paths are tested by `make test` (CPU autocast).")


def summary_lines(report: dict) -> list[str]:
    """``rehearsal: 40 ok, 3 warn, 0 failed``, one line per warn or failure reason, and a line
    when the cells ran fp32 in place of a paper's own precision."""
    s = report["summary"]
    lines = [f"rehearsal: {s['ok']} ok, {s.get('warn', 0)} warn, {s['failed']} failed "
             f"({s['cells']} cells; see report.md)"]
    decision = report.get("precision") or {}
    if decision.get("ran") == "fp32" and decision.get("fp32_instead_of"):
        lines.append(f"  precision: fp32 in place of {', '.join(sorted(decision['fp32_instead_of']))}'s own "
                     f"({decision.get('reason')})")
    for r in report["cells"]:
        if r["status"] == "warn":
            lines += [f"  warn {r['cell']}: {w}" for w in r.get("warnings", [])]
        elif r["status"] == "failed":
            lines.append(f"  failed {r['cell']}: {r.get('reason')}")
    return lines


def build(plan: dict, root: str | Path, json_out: str | Path, md_out: str | Path) -> dict:
    """Write the report from the rehearsal ``plan`` (``rehearsal_plan`` rule: the cells, the
    settings, the paper rounds, the full grid per table, the backbones)."""
    root = Path(root)
    settings = plan["settings"]
    rows = [measure_cell(e, root, settings, plan["full_rounds"].get(e["paper"])) for e in plan["cells"]]
    ok = sum(r["status"] == "ok" for r in rows)
    warn = sum(r["status"] == "warn" for r in rows)
    cuda = any(r.get("device") == "cuda" for r in rows)
    backbones = {}
    for name, folder in plan.get("backbone_dirs", {}).items():
        meta = root / folder / "fedrepro_backbone.json"
        if meta.exists():
            info = read_json(meta)
            backbones[name] = info.get("scale") or info.get("kind") or "local"
        elif (root / folder).exists():
            backbones[name] = "checkpoint"
        else:
            backbones[name] = "not built"
    report = {
        "summary": {"cells": len(rows), "ok": ok, "warn": warn, "failed": len(rows) - ok - warn},
        "machine": plan.get("machine"),
        "settings": settings,
        "precision": plan.get("precision"),
        "backbones": backbones,
        "cells": rows,
        "device_hours_unit": "GPU-hours" if cuda else "CPU-hours (this machine)",
        "tables": table_hours(rows, plan["grids"]),
        "notes": [
            "Projections scale a few measured steps to the paper's rounds and the data in the client "
            "folders the rehearsal used (the generated samples with data: samples -- not the paper's "
            "corpus sizes -- so rerun with data: configured on the real data for real figures).",
            "Memory is measured at the rehearsal's batch (see the effective batch column).",
            "kind: shape backbones have random weights: time and memory only, no results.",
            "GFLOP/step: one training step per method counted by PyTorch's FLOP counter (matrix "
            "work: forward, backward, double backward; fedrepro.flops) at the rehearsal's batch; "
            "MFU = that / (median step time x the GPU's dense peak for the cell's precision), in "
            "brackets against the bf16 dense peak; none on the CPU.  At the rehearsal's 2-example "
            "batches a GPU is mostly idle: the paper-batch MFU is the benchmarks' (bench/kd_step.py).",
            "warn: a number outside its stated bound (Checks); it does not fail the rehearsal.",
        ],
    }
    write_json_atomic(json_out, report)
    write_text_atomic(md_out, render_md(report))
    return report


def machine() -> str:
    """This machine in words (CPU count, memory, GPU)."""
    import os
    import platform

    import torch

    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        mem_gb = float("nan")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {os.cpu_count()} CPUs, {mem_gb:.0f} GiB, {gpu}"


def main(argv: list[str] | None = None) -> int:
    """Write the report of a rehearsal folder from whatever it holds (``make rehearse`` calls it
    when Snakemake stopped on a failed cell, so the failures are reported too) and print the
    summary: ``rehearsal: N ok, W warn, F failed`` and every warn's and failure's reason.  Exit
    status 1 when a cell failed (a warn alone exits 0).  ``--summary``: print the summary of the
    report already written (``report.json``), without rebuilding it."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", nargs="?", default="results/rehearsal")
    parser.add_argument("--summary", action="store_true",
                        help="print the summary of the existing report.json only")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.summary:
        path = root / "report.json"
        if not path.exists():
            raise SystemExit(f"{path}: no rehearsal report; run `make rehearse` first")
        report = read_json(path)
    else:
        plan_path = root / "plan.json"
        if not plan_path.exists():
            raise SystemExit(f"{plan_path}: no rehearsal plan; run `make rehearse` first")
        report = build(read_json(plan_path), root, root / "report.json", root / "report.md")
        print(f"{root / 'report.md'}: {report['summary']['ok']} of {report['summary']['cells']} cells ok")
    print("\n".join(summary_lines(report)))
    return 0 if report["summary"]["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
