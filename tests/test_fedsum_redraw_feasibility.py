"""FedSum's Dirichlet re-draw knows when it cannot succeed (issue 23, item 1), and the rehearsal
draws the split where it can: at the paper's 2,000 documents, with samples large enough."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedrepro.data import partition as P
from fedrepro.data import sources
from fedrepro.io import InputError
from fedrepro.rehearsal import plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n,k,alpha", [(200, 10, 0.5), (100, 5, 0.3), (50, 5, 1.0), (60, 4, 0.2)])
def test_acceptance_estimate_matches_a_direct_count(n, k, alpha):
    """Where the rate is large enough to count: the estimate is within 3 % of 10^6 real draws."""
    draws = np.random.default_rng(7).dirichlet(np.full(k, alpha), size=1_000_000)
    counted = float(np.mean(draws.min(axis=1) * n >= 1))
    assert P.redraw_acceptance(n, k, alpha) == pytest.approx(counted, rel=0.03)


def test_acceptance_estimate_matches_the_measured_paper_rate():
    """Dir(0.1), 20 clients, 2,000 documents: 14 accepted in 76.8 M draws were measured
    (partition.DEFAULT_MAX_REDRAWS' docstring) = 1.82e-7."""
    assert P.redraw_acceptance(2000, 20, 0.1) == pytest.approx(14 / 76.8e6, rel=0.15)


def test_acceptance_is_exact_at_the_edges():
    assert P.redraw_acceptance(20, 20, 0.1) == 0.0  # needs p exactly uniform
    assert P.redraw_acceptance(10, 1, 0.1) == 1.0
    # two clients: P(1/n <= p_1 <= 1 - 1/n) with p_1 ~ Beta(a, a), exactly
    from scipy.stats import beta

    exact = beta(0.3, 0.3).cdf(0.9) - beta(0.3, 0.3).cdf(0.1)
    assert P.redraw_acceptance(10, 2, 0.3) == pytest.approx(exact, rel=1e-9)


def test_infeasible_redraw_fails_at_once_naming_the_keys():
    """The rehearsal's old 80 documents over 20 clients at Dir(0.1): ~2e-14 per draw, so 10^9
    draws would spin for minutes and find nothing.  It now fails after the first batch."""
    t0 = time.perf_counter()
    with pytest.raises(InputError) as err:
        P.dirichlet_quantity_skew(80, 20, 0.1, 0, "redraw", P.DEFAULT_MAX_REDRAWS)
    msg = str(err.value)
    for key in ("partitions.fedsum.total", "partitions.fedsum.num_clients", "partitions.fedsum.alphas",
                "partitions.fedsum.max_redraws", "empty_clients: add_one"):
        assert key in msg
    assert "first 65,536 draws" in msg and "e-14" in msg
    assert time.perf_counter() - t0 < 60  # one batch and the estimate, not 10^9 draws


def test_feasible_redraws_keep_their_seeded_split():
    """The estimate happens only after a first batch without a passing draw and never touches the
    split's random stream: a split that needs several batches is the same as before (the paper's
    seed 4 needs 631,684 draws, ten batches)."""
    parts = P.dirichlet_quantity_skew(2000, 20, 0.1, 4)
    assert sorted(i for p in parts for i in p) == list(range(2000)) and min(map(len, parts)) >= 1
    rng = P._rng(4, "dirichlet", 2000, 20, 0.1)
    p, used = P.redraw_proportions(rng, 2000, 20, 0.1, P.DEFAULT_MAX_REDRAWS)
    assert used == 631_684
    assert [len(x) for x in parts] == P.sizes_from_proportions(p, 2000).tolist()


def test_a_borderline_budget_is_refused_only_when_expected_draws_exceed_it():
    rate = P.redraw_acceptance(2000, 20, 0.1)
    # a budget of a tenth of the expected draws: refused at once (seed 4's first batch has none)
    with pytest.raises(InputError, match="max_redraws"):
        P.dirichlet_quantity_skew(2000, 20, 0.1, 4, "redraw", int(0.1 / rate))
    # three times the expected draws: allowed and found (631,684 draws for seed 4)
    assert len(P.dirichlet_quantity_skew(2000, 20, 0.1, 4, "redraw", int(3 / rate))) == 20


def test_rehearsal_draws_fedsum_at_the_paper_total_with_enough_samples(tmp_path):
    paper = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    over = yaml.safe_load((ROOT / "config/rehearsal.yaml").read_text())
    config = {**paper, **{k: v for k, v in over.items() if not isinstance(v, dict) or k == "rehearsal_settings"}}
    for k, v in over.items():
        if isinstance(v, dict) and k != "rehearsal_settings":
            config[k] = {**paper.get(k, {}), **v}
    plan.apply(config, ROOT)
    total = config["partitions"]["fedsum"]["total"]
    assert total == paper["partitions"]["fedsum"]["total"] == 2000
    need = plan.document(config)["min_train_records"]
    held = config["fedsum"]["eval"]["heldout_test_docs"]
    assert need == {ds: 2000 + held for ds in paper["partitions"]["fedsum"]["datasets"]}
    # the generated sample then holds them, read by the real parser
    used = sources.write_samples_for("pubmed", tmp_path / "pubmed", scale=4, min_train=need["pubmed"])
    assert sources.train_records("pubmed", tmp_path / "pubmed") >= need["pubmed"]
    per_copy = sources.train_records("pubmed", ROOT / "resources/samples/pubmed")
    assert used == math.ceil(need["pubmed"] / per_copy)
    # and an integer still overrides the total
    config2 = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config2["rehearsal_settings"]["fedsum_total"] = 400
    plan.apply(config2, ROOT)
    assert config2["partitions"]["fedsum"]["total"] == 400
    config3 = yaml.safe_load((ROOT / "config/paper.yaml").read_text())
    config3["rehearsal_settings"]["fedsum_total"] = "all"
    with pytest.raises(InputError, match="rehearsal_settings.fedsum_total"):
        plan.apply(config3, ROOT)
