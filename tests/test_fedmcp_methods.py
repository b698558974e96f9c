"""FedMCP's nine compared methods + ablations (fedmcp_methods) on a tiny offline RoBERTa."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dataclasses
import math
from collections import OrderedDict

import pytest
import torch
from transformers import RobertaConfig, RobertaModel

from fedrepro.io import InputError
from fedrepro.papers.fedmcp.methods import (
    METHODS,
    SINGLE_SET_BASELINES,
    LocalHParams,
    build_model,
    get_method,
    local_update,
    shared_share,
)
from fedrepro.papers.fedmcp.losses import fedmcp_loss

R = 4
CFG = {"bottleneck": R, "lora_r": 2}


def tiny_backbone(seed: int = 0) -> RobertaModel:
    torch.manual_seed(seed)
    cfg = RobertaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
    )
    return RobertaModel(cfg).eval()


def make_batches(n: int = 2, bs: int = 4, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 100, (bs, 8), generator=g)
        ids[:, 0] = 0
        mask = torch.ones_like(ids)
        ids[1, 5:], mask[1, 5:] = 1, 0
        out.append({"input_ids": ids, "attention_mask": mask,
                    "labels": torch.randint(0, 2, (bs,), generator=g)})
    return out


def randomise(model, seed: int = 1) -> None:
    """Non-zero adapter up-projections (W_up = 0 at init would make every adapter a no-op)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".adapters." in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def build(name: str, seed: int = 0, sizing: str = "paper"):
    torch.manual_seed(seed + 11)
    m = build_model(name, tiny_backbone(seed), num_labels=2, cfg={**CFG, "baseline_adapters": sizing})
    randomise(m)
    return m


def perturbed(state, seed: int = 5, scale: float = 0.2):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((k, v + scale * torch.randn(v.shape, generator=g)) for k, v in state.items())


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


HP = LocalHParams(lr=1e-2, epochs=1, head_epochs=1)


# adapter sets each method uploads: Table I's Comm. (paper sizing) and the earlier single-set one
SENT_ROLES = {
    "paper": {"FedAvg-PEFT": ("global", "private"), "MOON": ("global", "private"),
              "FedRep": ("global", "private"), "FedMatch": ("global", "private")},
    "single": {"FedAvg-PEFT": ("global", "private")},
}


def expected_shared_keys(name: str, model, sizing: str = "paper") -> set[str]:
    params = dict(model.named_parameters())
    if name == "Local":
        return set()
    if name == "FedAvg-FT":
        return {k for k in params if k.startswith("encoder.")}
    if name == "FedLR":
        return {k for k in params if "lora_" in k}
    roles = SENT_ROLES[sizing].get(name, ("global",))
    return {
        f"{r}.{k[len(f'net.adapters.{r}.'):]}"
        for k in params for r in roles if k.startswith(f"net.adapters.{r}.")
    }


CASES = [(name, "paper") for name in METHODS] + [(name, "single") for name in SINGLE_SET_BASELINES]


@pytest.mark.parametrize("name,sizing", CASES)
def test_shared_keys_update_and_roundtrip(name, sizing):
    model = build(name, sizing=sizing)
    state = model.shared_state()
    assert set(state) == expected_shared_keys(name, model, sizing)
    for k in state:  # never a head, a private adapter only where the method uploads it, ...
        assert not any(h in k for h in ("g1", "g2", "head"))
        if name not in SENT_ROLES[sizing]:
            assert not k.startswith("private.")
        if name not in ("FedAvg-FT",):
            assert not k.startswith("encoder.") or "lora_" in k
    if name == "FedAvg-FT":  # the whole backbone, nothing else
        assert len(state) == len(list(model.encoder.parameters()))

    # loading a server state then reading it back is exact -- except FedMatch's uploaded patch,
    # which the client keeps (the authors' code loads back only the shared backbone)
    own_patch = {k: v.clone() for k, v in state.items() if k.startswith("private.")}
    server = perturbed(state)
    model.load_shared_state(server)
    back = model.shared_state()
    assert list(back) == list(server)
    if name == "FedMatch" and sizing == "paper":
        assert own_patch and all(torch.equal(back[k], own_patch[k]) for k in own_patch)
        assert all(torch.equal(back[k], server[k]) for k in server if k.startswith("global."))
        server = OrderedDict((k, own_patch.get(k, v)) for k, v in server.items())
    assert all(torch.equal(back[k], server[k]) for k in server)
    if state:
        with pytest.raises(ValueError):
            model.load_shared_state(OrderedDict(list(server.items())[1:]))
        with pytest.raises(ValueError):
            model.load_shared_state({**server, "extra": torch.zeros(1)})

    # one local round: only trainable parameters move; the shared part starts from server
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    before = snapshot(model)
    stats = local_update(model, name, make_batches(), HP, server_state=server if state else None)
    assert math.isfinite(stats["loss"]) and stats["n_examples"] == 8
    assert stats["lr"] == (HP.full_ft_lr if name == "FedAvg-FT" else HP.lr)
    after = snapshot(model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed, "nothing was trained"
    assert changed <= trainable
    backbone_changed = {n for n in changed if "adapters" not in n and "lora_" not in n
                        and not n.startswith(("net.g", "head."))}
    if name == "FedAvg-FT":
        assert backbone_changed
    else:
        assert not backbone_changed
    assert set(model.shared_state()) == set(state)
    logits, pooled = model(make_batches()[0]["input_ids"], make_batches()[0]["attention_mask"])
    assert logits.shape == (4, 2) and pooled.shape == (4, 32)


def test_specific_trainable_sets():
    fedmcp = build("FedMCP")
    tr = {n for n, p in fedmcp.named_parameters() if p.requires_grad}
    assert any(n.startswith("net.adapters.private.") for n in tr)
    assert {"net.g1.weight", "net.g2.weight"} <= tr
    fedap = build("FedAP")
    tr = {n for n, p in fedap.named_parameters() if p.requires_grad}
    assert not any("private" in n or "g1" in n for n in tr)


def test_shared_share():
    full = sum(p.numel() for p in build("FedAvg-FT").parameters())
    share_ft = shared_share(build("FedAvg-FT"), full)
    assert 0.99 < share_ft < 1.0  # everything but the local head
    s_mcp = shared_share(build("FedMCP"), full)
    s_peft = shared_share(build("FedAvg-PEFT"), full)
    assert s_peft == pytest.approx(2 * s_mcp)
    assert shared_share(build("Local"), full) == 0.0
    for name in ("MOON", "FedRep", "FedMatch"):  # Table I: 1.16 % sent = two adapter sets
        assert shared_share(build(name), full) == pytest.approx(2 * s_mcp)
        assert shared_share(build(name, sizing="single"), full) == pytest.approx(s_mcp)


def test_baseline_sizing_option():
    """``baseline_adapters``: paper (default) vs single -- trainable parts, evaluated head, sent."""
    for name in ("MOON", "FedRep", "FedMatch"):
        paper, single = get_method(name), get_method(name, "single")
        assert paper is METHODS[name] and single is SINGLE_SET_BASELINES[name]
        assert paper.trained == ("global", "private", "g1") and paper.eval_mode == "both"
        assert set(paper.sent) == {"global", "private"}
    assert get_method("FedMatch").shared == ("global",)  # the patch is uploaded, not loaded back
    assert get_method("FedMatch").upload_only == ("private",)
    assert get_method("MOON", "single").trained == ("global", "g2")
    assert get_method("FedRep", "single").sent == ("global",)
    assert get_method("FedMatch", "single").sent == ("global",)
    assert get_method("FedAP", "single") is METHODS["FedAP"]  # the others do not change
    with pytest.raises(InputError, match="baseline_adapters"):
        get_method("MOON", "double")
    with pytest.raises(ValueError, match="MOON"):  # the model's spec decides; names must agree
        local_update(build("FedRep"), "MOON", make_batches(), HP, server_state=None)


def test_full_ft_uses_its_own_learning_rate(monkeypatch):
    """FedAvg (Full FT) trains with ``full_ft_lr``; every adapter method with ``lr``."""
    seen = []
    real = torch.optim.Adam

    def spy(params, lr, **kw):
        seen.append(lr)
        return real(params, lr=lr, **kw)

    monkeypatch.setattr(torch.optim, "Adam", spy)
    hp = dataclasses.replace(HP, lr=5e-4, full_ft_lr=2e-5)
    st = local_update(build("FedAvg-FT"), "FedAvg-FT", make_batches(), hp, server_state=None)
    assert seen == [2e-5] and st["lr"] == 2e-5
    assert LocalHParams.from_config({"lr": 5e-4}).full_ft_lr == 2e-5  # the default
    assert LocalHParams.from_config({"full_ft_lr": "3e-5"}).full_ft_lr == 3e-5
    seen.clear()
    local_update(build("FedMCP"), "FedMCP", make_batches(), hp, server_state=None)
    local_update(build("FedLR"), "FedLR", make_batches(), hp, server_state=None)
    assert seen == [5e-4, 5e-4]


def test_fedmatch_uploads_its_patch_but_trains_its_own():
    """Paper sizing: FedMatch uploads A_g and A_p; the server's average replaces A_g only, so
    two server states differing only in the averaged patch give the same round, bit for bit."""
    a, b = build("FedMatch"), build("FedMatch")
    patch0 = {k: v.clone() for k, v in a.net.adapters["private"].state_dict().items()}
    server = perturbed(a.shared_state(), seed=6)
    other = OrderedDict((k, v + 1.0 if k.startswith("private.") else v) for k, v in server.items())
    local_update(a, "FedMatch", make_batches(), HP, server_state=server)
    local_update(b, "FedMatch", make_batches(), HP, server_state=other)
    sa, sb = a.shared_state(), b.shared_state()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    patch = a.net.adapters["private"].state_dict()
    assert any(not torch.equal(patch[k], patch0[k]) for k in patch0)  # trained...
    assert all(torch.equal(sa[f"private.{k}"], v) for k, v in patch.items())  # ...and uploaded


def test_fedrep_alternation():
    hp_head = dataclasses.replace(HP, head_epochs=2, epochs=0)
    m = build("FedRep")
    b0, h0 = [p.clone() for p in m.body_parameters()], [p.clone() for p in m.head_parameters()]
    st = local_update(m, "FedRep", make_batches(), hp_head, server_state=None)
    assert st["phases"] == [("head", 2)]
    assert all(torch.equal(a, b) for a, b in zip(b0, m.body_parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(h0, m.head_parameters()))

    hp_body = dataclasses.replace(HP, head_epochs=0, epochs=1)
    m = build("FedRep")
    b0, h0 = [p.clone() for p in m.body_parameters()], [p.clone() for p in m.head_parameters()]
    local_update(m, "FedRep", make_batches(), hp_body, server_state=None)
    assert all(torch.equal(a, b) for a, b in zip(h0, m.head_parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(b0, m.body_parameters()))

    m = build("FedRep")
    st = local_update(m, "FedRep", make_batches(), HP, server_state=None)
    assert st["phases"] == [("head", 1), ("body", 1)]
    assert all(p.requires_grad for p in m.body_parameters() + m.head_parameters())


@pytest.mark.parametrize("sizing", ["paper", "single"])
def test_moon_term_uses_previous_round(sizing):
    one = make_batches(n=1)
    hp = dataclasses.replace(HP, moon_mu=1.0, moon_tau=0.5)
    m = build("MOON", sizing=sizing)
    server = perturbed(m.shared_state(), seed=3)
    assert {k.split(".", 1)[0] for k in server} == (
        {"global", "private"} if sizing == "paper" else {"global"})
    # no previous model: z_prev = z_glob, ℓ_con = log 2 exactly
    st = local_update(m, "MOON", one, hp, server_state=server)
    assert st["L_con"] == pytest.approx(math.log(2), abs=1e-5)
    # with a previous-round state, the term differs and depends on it
    vals = []
    for seed in (8, 9):
        m = build("MOON", sizing=sizing)
        prev = perturbed(server, seed=seed, scale=0.5)
        st = local_update(m, "MOON", one, hp, server_state=server, prev_shared_state=prev)
        assert st["L_con"] > 0
        assert st["loss"] == pytest.approx(st["L_ce"] + hp.moon_mu * st["L_con"], rel=1e-5)
        vals.append(st["L_con"])
    assert abs(vals[0] - math.log(2)) > 1e-4 and abs(vals[0] - vals[1]) > 1e-6


def reference_fedmcp(model, batch, server, gamma, mu, similarity="cka", pooling="mean"):
    """Independent eq. 8 on the model *after* loading the server state (Z = X here)."""
    model.load_shared_state(server)
    net = model.net
    with torch.no_grad():
        ids, mask = batch["input_ids"], batch["attention_mask"]

        def run(mode):
            net.router.set_mode(mode)
            h = net.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
            net.router.set_mode("both")
            return net.pool(h, mask, "mean"), net.pool(h, mask, pooling)

        full, _ = run("both")
        gmean, x = run("global")
        _, y = run("private")
        z = x.clone()  # local global adapter == server average before the first step
        return fedmcp_loss(net.g1(full), net.g2(gmean), batch["labels"], x, y, z,
                           gamma=gamma, mu=mu, similarity=similarity)


@pytest.mark.parametrize("name", ["FedMCP", "FedMCP-noLc", "FedMCP-noLb", "FedMCP-cos",
                                  "FedMCP-cls"])
def test_fedmcp_loss_and_ablations(name):
    one = make_batches(n=1)
    hp = dataclasses.replace(HP, gamma=0.3, mu=0.2)
    spec = METHODS[name]
    m = build(name)
    server = perturbed(m.shared_state(), seed=4)
    gamma = hp.gamma if spec.gamma is None else spec.gamma
    mu = hp.mu if spec.mu is None else spec.mu
    ref, parts = reference_fedmcp(build(name), one[0], server, gamma, mu,
                                  spec.similarity, spec.rep_pooling)
    st = local_update(m, name, one, hp, server_state=server)
    assert st["loss"] == pytest.approx(float(ref), rel=1e-5, abs=1e-6)
    assert st["L_a"] == pytest.approx(parts["L_a"], rel=1e-5)
    assert st["L_b"] == pytest.approx(parts["L_b"], rel=1e-5)
    if name == "FedMCP-noLc":
        assert spec.mu == 0.0 and spec.gamma is None
        assert st["loss"] == pytest.approx((1 - hp.gamma) * parts["L_a"] + hp.gamma * parts["L_b"],
                                           rel=1e-5)
    elif name == "FedMCP-noLb":
        assert spec.gamma == 0.0 and spec.mu is None
        assert st["loss"] == pytest.approx(parts["L_a"] + hp.mu * parts["L_c"], rel=1e-5)
    else:
        assert st["L_c"] == pytest.approx(parts["L_c"], abs=1e-5)
        assert st["loss"] == pytest.approx(
            (1 - hp.gamma) * parts["L_a"] + hp.gamma * parts["L_b"] + hp.mu * parts["L_c"],
            rel=1e-5)


def test_fedmcp_z_is_the_received_average_not_the_training_adapter():
    """Over two steps, Z stays the server state while the local global adapter moves."""
    batches = make_batches(n=2)
    m = build("FedMCP")
    server = perturbed(m.shared_state(), seed=4)
    local_update(m, "FedMCP", batches, HP, server_state=server)
    moved = m.shared_state()
    assert any(not torch.equal(moved[k], server[k]) for k in server)
    b = batches[1]
    z = m.representation_with_global(server, b["input_ids"], b["attention_mask"])
    ref = build("FedMCP")
    ref.load_shared_state(server)
    with torch.no_grad():
        _, z_ref = ref(b["input_ids"], b["attention_mask"], mode="global")
    assert torch.allclose(z, z_ref, atol=1e-6)
    assert all(torch.equal(moved[k], v) for k, v in m.shared_state().items())  # untouched


def test_fedmcp_z_is_the_received_server_average_on_every_batch_of_the_round():
    """Z (eq. 5) comes from the averaged global adapter received this round, not from the adapter
    being trained: the state used for Z must equal the server state on the 2nd and 3rd batch too."""
    model = build("FedMCP")
    server = perturbed(model.shared_state(), seed=9)
    seen = []
    original = model.representation_with_global

    def spy(state, *args, **kwargs):
        seen.append(OrderedDict((k, v.detach().clone()) for k, v in state.items()))
        return original(state, *args, **kwargs)

    model.representation_with_global = spy
    local_update(model, "FedMCP", make_batches(n=3), HP, server)
    assert len(seen) == 3
    expected = OrderedDict((k[len("global."):], v) for k, v in server.items())
    for state in seen:
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], expected[k]) for k in expected)
    # ...while the client's own global adapter has moved away from it
    after = model.shared_state()
    assert any(not torch.equal(after[k], server[k]) for k in server)
