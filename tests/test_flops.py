"""Model FLOPs and MFU (fedrepro.flops; issue on GPU-hours, item 2): the formula of an
AdaFedSelecKD step equals PyTorch's FLOP counter on a small BART, counting leaves the step's bits
alone, MFU uses the right peak, and StepTimer counts one step per key when asked."""

from __future__ import annotations

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from fedrepro import devices, flops
from fedrepro.papers.adafedseleckd.methods import METHODS, TrainHParams, _step, make_optimizer
from fedrepro.papers.adafedseleckd.model import AdapterSummarizer

D, F, V, M, K = 32, 48, 97, 24, 2
B, S, T = 3, 11, 7


def _model(seed=0) -> AdapterSummarizer:
    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=V, d_model=D, encoder_layers=2, decoder_layers=3,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=F,
                     decoder_ffn_dim=F, max_position_embeddings=64, pad_token_id=1,
                     decoder_start_token_id=2, forced_bos_token_id=None)
    model = AdapterSummarizer(BartForConditionalGeneration(cfg), K, M, ("global", "local"))
    with torch.no_grad():  # global != local, so the teacher path is a different computation
        for p in model.stacks["global"].parameters():
            p.add_(0.01)
    return model


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    dec = torch.randint(4, V, (B, T), generator=g)
    return {"input_ids": torch.randint(4, V, (B, S), generator=g),
            "attention_mask": torch.ones(B, S, dtype=torch.long),
            "decoder_input_ids": dec, "labels": torch.roll(dec, -1, 1)}


HP = TrainHParams(lr=1e-3, weight_decay=0.01, batch_size=B, local_epochs=1, lam=0.3, tau=2.0)


@pytest.mark.parametrize("method", ["AdaFedAvg", "AdaFedSelectKD", "AdaFedKD"])
def test_the_formula_equals_the_flop_counter_on_a_small_bart(method):
    model = _model()
    model.train()
    spec = METHODS[method]
    opt = make_optimizer(model, HP)
    tau = HP.tau if spec.selective else float("inf")
    _, counted = flops.count_flops(
        lambda: _step(model, spec, _batch(), torch.device("cpu"), HP, tau, opt))
    parts = flops.seq2seq_adapter_step_flops(
        batch=B, source_len=S, target_len=T, d_model=D, ffn_dim=F, encoder_layers=2,
        decoder_layers=3, vocab=V, top_k=K, bottleneck=M, teacher=spec.distill, attention=False)
    assert counted == parts["total"]
    assert (parts["teacher_forward"] > 0) == spec.distill
    # the attention terms: 4 b q k d per attention, forward, plus the backward of the upper layers
    with_att = flops.seq2seq_adapter_step_flops(
        batch=B, source_len=S, target_len=T, d_model=D, ffn_dim=F, encoder_layers=2,
        decoder_layers=3, vocab=V, top_k=K, bottleneck=M, teacher=spec.distill)
    dec_att = 4 * B * T * T * D + 4 * B * T * S * D
    expected = 2 * 4 * B * S * S * D + 3 * dec_att + (K - 1) * dec_att * 5 // 2
    expected += K * dec_att if spec.distill else 0
    assert with_att["total"] - parts["total"] == expected


def test_counting_a_step_leaves_its_bits_alone():
    a, b = _model(), _model()
    for m in (a, b):
        m.train()
    oa, ob = make_optimizer(a, HP), make_optimizer(b, HP)
    spec = METHODS["AdaFedSelectKD"]
    la = _step(a, spec, _batch(), torch.device("cpu"), HP, HP.tau, oa)[0]
    lb, n = flops.count_flops(lambda: _step(b, spec, _batch(), torch.device("cpu"), HP, HP.tau, ob))
    assert n > 0
    assert torch.equal(la, lb[0])
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na


def test_peaks_and_mfu():
    h100 = "NVIDIA H100 80GB HBM3"
    assert flops.peak_flops(h100, "bf16-mixed") == pytest.approx(989.4e12)
    assert flops.peak_flops(h100, "fp32") == pytest.approx(66.9e12)
    assert flops.peak_flops(h100, "tf32") == pytest.approx(494.7e12)
    assert flops.peak_flops("NVIDIA H100 PCIe", "bf16-mixed") == pytest.approx(756e12)
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "bfloat16") == pytest.approx(312e12)
    assert flops.peak_flops(None, "fp32") is None
    assert flops.peak_flops("Some Future GPU", "fp32") is None
    with pytest.raises(ValueError, match="unknown precision"):
        flops.peak_flops(h100, "fp8")
    r = flops.mfu(98.94e12, 0.5, h100, "bf16-mixed")  # 197.88 TFLOP/s
    assert r["tflops_per_s"] == pytest.approx(197.88)
    assert r["mfu"] == pytest.approx(0.2)
    assert r["mfu_vs_bf16_peak"] == pytest.approx(0.2)
    r = flops.mfu(6.69e12, 1.0, h100, "fp32")
    assert r["mfu"] == pytest.approx(0.1) and r["mfu_vs_bf16_peak"] == pytest.approx(6.69 / 989.4)
    assert flops.mfu(1e12, 1.0, None, "fp32") == {
        "mfu": None, "mfu_vs_bf16_peak": None, "tflops_per_s": 1.0, "peak_tflops": None}
    assert flops.mfu(None, 1.0, h100, "fp32")["mfu"] is None
    assert flops.mfu(1e12, 0.0, h100, "fp32")["mfu"] is None


def _linear_step(model, opt, x):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()


def test_step_timer_counts_the_first_step_of_a_key_once_per_process(monkeypatch):
    monkeypatch.setenv("FEDREPRO_COUNT_FLOPS", "1")
    monkeypatch.setattr(devices, "_FLOPS_COUNTED", set())
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 5)
    timer = devices.StepTimer("cpu", flop_key="method-a")
    for _ in range(3):
        with timer.step():
            _linear_step(model, opt, x)
    st = timer.stats()
    # forward 2·4·5·3, backward: the weight gradient only (x needs no grad)
    assert st["flops_per_step"] == 2 * 4 * 5 * 3 * 2
    assert timer.steps == 2  # the counted step is not timed (the counter slows it down)
    assert st["seconds_flop_step"] > 0
    again = devices.StepTimer("cpu", flop_key="method-a")  # same key: counted already
    with again.step():
        _linear_step(model, opt, x)
    assert again.stats()["flops_per_step"] == 0 and again.steps == 1  # the keys: every client's
    other = devices.StepTimer("cpu", flop_key="method-b")
    with other.step():
        _linear_step(model, opt, x)
    assert other.stats()["flops_per_step"] == 240 and other.steps == 0


def test_step_timer_does_not_count_unless_asked(monkeypatch):
    monkeypatch.delenv("FEDREPRO_COUNT_FLOPS", raising=False)
    monkeypatch.setattr(devices, "_FLOPS_COUNTED", set())
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    timer = devices.StepTimer("cpu", flop_key="k")
    with timer.step():
        _linear_step(model, opt, torch.randn(4, 5))
    assert timer.steps == 1 and "flops_per_step" not in timer.stats()
    assert devices._FLOPS_COUNTED == set()


def test_fedsumm_counts_each_regime_and_the_guided_step_apart(monkeypatch):
    """A FedSUMM row job trains its model's four regimes in one process: each regime's cell counts
    its own step (``fedsumm:<model>:<regime>``), and a guided step -- eq. 7's double backward --
    is counted apart from the unguided first round, with more FLOPs (the 2026-11-28 rehearsal's
    FedSUMM cells had no count: every regime shared one key)."""
    from collections import OrderedDict

    from fedrepro.papers.fedsumm import task as fsumm_task
    from fedrepro.papers.fedsumm.algorithm import ClientGuidance, FedSummConfig, fedsumm_local_update

    monkeypatch.setenv("FEDREPRO_COUNT_FLOPS", "1")
    monkeypatch.setattr(devices, "_FLOPS_COUNTED", set())
    keys = [fsumm_task.flop_key({"model": "bart", "regime": r}) for r in ("single", "all", "FedAvg", "FedSUMM")]
    assert keys == ["fedsumm:bart:single", "fedsumm:bart:all", "fedsumm:bart:FedAvg", "fedsumm:bart:FedSUMM"]
    assert fsumm_task.flop_key({"model": "ct", "regime": "single"}) != keys[0]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    batches = [{"x": torch.randn(3, 5)}, {"x": torch.randn(3, 5)}]

    def loss(m, b):
        return m(b["x"]).pow(2).mean()

    def update(key, guidance=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        return fedsumm_local_update(model, batches, loss, opt, guidance, FedSummConfig(dldt="inner_product"),
                                    flop_key=key).timing["flops_per_step"]

    plain = [update(k) for k in keys]
    assert all(f > 0 for f in plain) and len(set(plain)) == 1  # each regime counted, the same step
    assert update(keys[3]) == 0  # the key counted already in this process
    g = OrderedDict((n, torch.ones_like(p)) for n, p in model.named_parameters())
    guided = update(keys[3], ClientGuidance(g, rho=1.5, previous_loss=2.0, epsilon=0.2))
    assert guided > plain[0]  # eq. 7's inner product, differentiated: a double backward
    assert devices._FLOPS_COUNTED == set(keys) | {"fedsumm:bart:FedSUMM:eq7"}
