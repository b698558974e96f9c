"""AdaFedSelecKD's selective-KD kernel (kd.py) and client loop (methods.py) against numbers computed
here, on the cases the other tests leave open (mutation testing, issue 24: docs/mutation.md).

kd.py -- every loss and gradient is compared with eq. 8 written out in float64 with
``torch.nn.functional`` and differentiated by autograd (never the project's kernel):

* the defaults of ``selective_kd_loss`` are the paper's λ = 0.2, τ = 5 nats (§IV-D), with teacher
  tokens on both sides of τ = 5 and some between 5 and 6 nats;
* the hand-written backward scales with the incoming gradient (``c·L`` for c ≠ 1), divides by the
  number of valid tokens also when there is one, and a half-precision student (fp16, bf16) gets the
  float32 gradient rounded once (within about half an ulp of the float64 one);
* the chunked loop: the CPU chunk holds ``_CHUNK_ELEMENTS // V`` rows (at least one), every row is
  computed once (traced with a ``TorchFunctionMode``), results bit-identical to one chunk;
* the result follows the logits' dtype and device, not torch's default dtype or device;
* a one-word vocabulary with padding; ``cross_entropy_loss``'s ``ignore_index``.

methods.py -- ``local_update`` / ``_step`` on a stub model (an embedding and a linear layer per
adapter role), against a hand loop over the batches of ``iterate_batches`` seeded by
(seed, client, round, epoch): the mean training loss over batches, the batch order per round,
statistics of an empty client, the device given to the batches, step timer and precision, a
prefix cache's calls, KD masks of non-hard-KD methods, FedProx with μ = 0,
``zero_grad(set_to_none=True)`` (a parameter outside a step's graph is not touched by AdamW),
``TrainHParams.from_config``'s ``prox_mu`` and ``precision="bf16-mixed"`` (the forward and loss
under CPU bf16 autocast).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import fedrepro.devices as devices
import fedrepro.papers.adafedseleckd.kd as kd
from fedrepro.data.seq2seq import derive_seed, iterate_batches
from fedrepro.io import InputError
from fedrepro.papers.adafedseleckd.kd import cross_entropy_loss, selective_kd_loss
from fedrepro.papers.adafedseleckd.methods import TrainHParams, _step, get_method, local_update
from fedrepro.precision import Precision


# =============================================================================================
# eq. 8 in float64, by hand
# =============================================================================================
def hand_kd(student, teacher, labels, lam, tau, allowed=None, ignore_index=-100):
    """(loss, KD mask, teacher entropy) of eq. 8 in float64; ``student`` may require grad."""
    log_ql = F.log_softmax(student.double(), -1)
    log_qg = F.log_softmax(teacher.detach().double(), -1)
    q_g = log_qg.exp()
    entropy = -(q_g * log_qg).sum(-1)
    valid = labels != ignore_index
    use = valid & (entropy < tau)
    if allowed is not None:
        use = use & allowed
    ce = -log_ql.gather(-1, labels.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1)
    kl = (q_g * (log_qg - log_ql)).sum(-1)
    per_token = torch.where(use, (1 - lam) * ce + lam * kl, ce) * valid.double()
    return per_token.sum() / max(int(valid.sum()), 1), use, entropy


def hand_grad(student, teacher, labels, lam, tau, scale=1.0, **kw):
    s = student.detach().double().requires_grad_(True)
    loss, _, _ = hand_kd(s, teacher, labels, lam, tau, **kw)
    (scale * loss).backward()
    return s.grad


def kd_grad(student, teacher, labels, lam, tau, scale=1.0, **kw):
    s = student.detach().clone().requires_grad_(True)
    loss, mask = selective_kd_loss(s, teacher, labels, lam, tau, **kw)
    (scale * loss).backward()
    return loss.detach(), mask, s.grad


def _entropy_ladder(n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Teacher logits whose entropies run from peaked (~0.5 nats) to near-uniform (~ln V)."""
    base = torch.randn(n, vocab, generator=gen)
    scales = torch.logspace(math.log10(12.0), math.log10(0.2), n).unsqueeze(-1)
    return base * scales


# =============================================================================================
# kd.py
# =============================================================================================
def test_defaults_are_the_papers_lambda_and_tau():
    """λ = 0.2 and τ = 5 nats (§IV-D) when not given; tokens with 5 <= H < 6 are not distilled."""
    gen = torch.Generator().manual_seed(11)
    V, n = 256, 24  # ln 256 = 5.55 nats: near-uniform teachers sit between 5 and 6
    teacher = _entropy_ladder(n, V, gen)
    student = torch.randn(n, V, generator=gen) * 2
    labels = torch.randint(0, V, (n,), generator=gen)
    labels[3] = -100
    ref_loss, ref_mask, entropy = hand_kd(student, teacher, labels, 0.2, 5.0)
    valid = labels != -100
    assert ((entropy < 4.9) & valid).sum() >= 3  # distilled
    assert ((entropy > 5.05) & (entropy < 5.95) & valid).sum() >= 3  # not distilled at τ = 5 only
    assert ((entropy - 5.0).abs() > 0.02).all()  # no token on the fence
    loss, mask = selective_kd_loss(student, teacher, labels)
    assert torch.equal(mask, ref_mask)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    # and λ matters: the same call with λ = 0.2 given explicitly is the same number
    explicit, _ = selective_kd_loss(student, teacher, labels, 0.2, 5.0)
    assert torch.equal(loss, explicit)


def test_backward_scales_with_the_incoming_gradient():
    """d(c·L)/ds = c·dL/ds (the custom backward multiplies by grad_loss), for c = 3 and c = 1/4."""
    gen = torch.Generator().manual_seed(5)
    V, n = 40, 9
    teacher = _entropy_ladder(n, V, gen)
    student = torch.randn(n, V, generator=gen)
    labels = torch.randint(0, V, (n,), generator=gen)
    labels[[2, 7]] = -100
    for c in (3.0, 0.25):
        loss, mask, grad = kd_grad(student, teacher, labels, 0.3, 2.5, scale=c)
        ref = hand_grad(student, teacher, labels, 0.3, 2.5, scale=c)
        assert 0 < int(mask.sum()) < int((labels != -100).sum())
        assert torch.allclose(grad.double(), ref, rtol=1e-5, atol=1e-8 * c)
        assert grad.abs().max() > 0.05 * c  # not a vanishing gradient


def test_one_valid_token_is_its_own_mean():
    """The mean over valid tokens with exactly one valid token: its loss, its whole gradient."""
    gen = torch.Generator().manual_seed(7)
    V = 30
    teacher = torch.randn(2, 5, V, generator=gen)
    student = torch.randn(2, 5, V, generator=gen)
    labels = torch.full((2, 5), -100)
    labels[1, 2] = 4
    loss, mask, grad = kd_grad(student, teacher, labels, 0.2, math.inf)
    ref_loss, ref_mask, _ = hand_kd(student, teacher, labels, 0.2, math.inf)
    assert torch.equal(mask, ref_mask) and int(mask.sum()) == 1
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert torch.allclose(grad.double(), hand_grad(student, teacher, labels, 0.2, math.inf), atol=1e-7)
    # no valid token at all: zero loss, zero gradient (no division by zero)
    none = torch.full((2, 5), -100)
    loss0, mask0, grad0 = kd_grad(student, teacher, none, 0.2, math.inf)
    assert float(loss0) == 0.0 and not mask0.any() and torch.equal(grad0, torch.zeros_like(grad0))


def _half_ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Half the spacing of ``dtype`` around each value of ``ref`` (float64), subnormals included."""
    fi = torch.finfo(dtype)
    nmant = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    exp = torch.floor(torch.log2(ref.abs().clamp(min=fi.tiny)))
    return torch.exp2(exp - nmant) / 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_student_gets_the_float32_gradient_rounded_once(dtype):
    """Logits in fp16 / bf16 (autocast): the gradient is accumulated and scaled in float32 and
    rounded to the logits' dtype once, so each entry is within half an ulp (plus float32's error) of
    the float64 gradient; storing it in the half dtype first rounds it again at every later step."""
    gen = torch.Generator().manual_seed(3)
    V, n = 64, 15  # 15 valid tokens: a division that is not exact in binary
    spread = torch.linspace(0.0, -13.0, V)  # q_l from ~1 down to ~2e-6
    student = (spread + 0.3 * torch.randn(n, V, generator=gen)).to(dtype)
    teacher = _entropy_ladder(n, V, gen)
    labels = torch.randint(0, V, (n,), generator=gen)
    c = 1000.0  # a scaled loss (c·L), e.g. a loss scaler
    loss, mask, grad = kd_grad(student, teacher, labels, 0.2, 3.0, scale=c)
    assert grad.dtype == dtype and 0 < int(mask.sum()) < n
    ref = hand_grad(student, teacher, labels, 0.2, 3.0, scale=c)
    err = (grad.double() - ref).abs()
    # half an ulp (the one rounding) with a quarter of margin for float32's own error, plus that
    # error's absolute size (~1e-7 of an O(1) term, times c / n); rounding to the half dtype before
    # the scaling is off by up to ~2.5 half-ulps, on ~10 % of the entries here
    bound = 1.25 * _half_ulp(ref, dtype) + 2e-7 * c / n
    assert (err <= bound).all(), float((err / bound).max())


class _RowsPerLogSoftmax(TorchFunctionMode):
    """Records the number of rows of every log-softmax the kernel takes."""

    FUNCS = {torch.log_softmax, torch.Tensor.log_softmax, F.log_softmax, torch.special.log_softmax}

    def __init__(self):
        super().__init__()
        self.rows: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FUNCS:
            self.rows.append(int(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("elements, rows", [(4 * 6, 4), (5, 1)])  # 4 rows; V > elements: 1 row
def test_cpu_chunks_hold_chunk_elements_over_vocab_rows_each_row_once(monkeypatch, elements, rows):
    """On the CPU a chunk holds ``_CHUNK_ELEMENTS // V`` rows (at least 1; the accelerator's far
    larger size is not used), each row's teacher and student log-softmax is taken once, and the
    result is bit-identical to one chunk and equal to eq. 8 by hand."""
    gen = torch.Generator().manual_seed(9)
    V, n = 6, 10
    teacher = _entropy_ladder(n, V, gen).reshape(2, 5, V)
    student = torch.randn(2, 5, V, generator=gen)
    labels = torch.randint(0, V, (2, 5), generator=gen)
    labels[0, 4] = labels[1, 0] = -100
    monkeypatch.setattr(kd, "_CHUNK_ELEMENTS", 1 << 20)
    one_loss, one_mask, one_grad = kd_grad(student, teacher, labels, 0.2, 1.0)
    monkeypatch.setattr(kd, "_CHUNK_ELEMENTS", elements)
    monkeypatch.setattr(kd, "_CHUNK_ELEMENTS_ACCELERATOR", 1 << 20)
    with _RowsPerLogSoftmax() as trace:
        loss, mask, grad = kd_grad(student, teacher, labels, 0.2, 1.0)
    assert max(trace.rows) == rows and sum(trace.rows) == 2 * n, trace.rows
    ref_loss, ref_mask, _ = hand_kd(student, teacher, labels, 0.2, 1.0)
    assert 0 < int(ref_mask.sum()) < int((labels != -100).sum())
    assert torch.equal(mask, ref_mask) and float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert torch.allclose(grad.double(), hand_grad(student, teacher, labels, 0.2, 1.0), atol=1e-7)
    assert torch.equal(loss, one_loss) and torch.equal(mask, one_mask) and torch.equal(grad, one_grad)


def test_result_follows_the_logits_not_torchs_default_dtype_or_device():
    """Loss (float32), KD mask and gradient stay on the logits' device and dtype, bit for bit,
    when torch's default dtype is float64 or its default device is another one (here ``meta``)."""
    gen = torch.Generator().manual_seed(4)
    V = 12
    teacher = _entropy_ladder(8, V, gen)
    student = torch.randn(8, V, generator=gen)
    labels = torch.randint(0, V, (8,), generator=gen)
    labels[5] = -100
    base = kd_grad(student, teacher, labels, 0.2, 1.5)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        in_f64 = kd_grad(student, teacher, labels, 0.2, 1.5)
    finally:
        torch.set_default_dtype(old)
    with torch.device("meta"):
        on_meta = kd_grad(student, teacher, labels, 0.2, 1.5)
    for loss, mask, grad in (in_f64, on_meta):
        assert loss.dtype == torch.float32 and loss.device.type == "cpu"
        assert mask.device.type == "cpu" and grad.device.type == "cpu" and grad.dtype == torch.float32
        assert torch.equal(loss, base[0]) and torch.equal(mask, base[1]) and torch.equal(grad, base[2])


def test_one_word_vocabulary_with_padding():
    """V = 1: every distribution is the point mass, loss and gradient 0; padding is ignored."""
    student = torch.randn(2, 3, 1)
    teacher = torch.randn(2, 3, 1)
    labels = torch.tensor([[0, 0, -100], [0, -100, -100]])
    loss, mask, grad = kd_grad(student, teacher, labels, 0.2, 5.0)
    assert float(loss) == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert torch.equal(mask, labels != -100)  # entropy 0 < τ on every valid token


def test_cross_entropy_loss_honours_ignore_index():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 9, generator=gen)
    labels = torch.randint(1, 9, (2, 6), generator=gen)
    labels[0, 4:] = 0
    labels[1, 5] = 0
    keep = labels != 0
    log_q = F.log_softmax(logits.double(), -1)
    hand = -(log_q.gather(-1, labels.unsqueeze(-1)).squeeze(-1))[keep].mean()
    assert float(cross_entropy_loss(logits, labels, ignore_index=0)) == pytest.approx(float(hand), rel=1e-6)


# =============================================================================================
# methods.py: a stub model
# =============================================================================================
V, D, PAD, START = 11, 6, 0, 1


class Stub(torch.nn.Module):
    """What ``_step`` / ``local_update`` use of an AdapterSummarizer: ``stacks[role]`` and
    ``path_logits`` (student asked for by name; a prefix, when given, is added to the logits).
    Each adapter: embedding of the decoder inputs, then a linear layer (bf16 under autocast).
    ``extra``: one more local parameter, used while ``use_extra`` is set."""

    def __init__(self, seed: int = 0, extra: bool = False):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.stacks = torch.nn.ModuleDict(
            {r: torch.nn.Sequential(torch.nn.Embedding(V, D), torch.nn.Linear(D, V)) for r in ("local", "global")}
        )
        if extra:
            self.stacks["local"].register_parameter("extra", torch.nn.Parameter(torch.zeros(V)))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
        self.stacks["global"].requires_grad_(False)
        self.use_extra = extra
        self.calls: list[dict] = []

    def logits(self, role, decoder_input_ids, prefix=None):
        out = self.stacks[role](decoder_input_ids)
        if role == "local" and self.use_extra:
            out = out + self.stacks["local"].extra
        if prefix is not None:
            out = out + prefix[0][0]
        return out

    def path_logits(self, input_ids, attention_mask, decoder_input_ids, *, student, teacher=None, prefix=None):
        self.calls.append({"ids": input_ids[:, 0].tolist(), "student": student, "teacher": teacher,
                           "prefix": prefix, "device": decoder_input_ids.device})
        teacher_logits = None
        if teacher is not None:
            with torch.no_grad():
                teacher_logits = self.logits(teacher, decoder_input_ids, prefix)
        return self.logits(student, decoder_input_ids, prefix), teacher_logits


def _examples(n: int, kd_allowed: bool = False) -> list[dict]:
    out = []
    for i in range(n):
        labels = [2 + (3 * i + j) % (V - 2) for j in range(2 + i % 3)]  # lengths 2..4: padding
        e = {"id": f"ex{i}", "input_ids": [100 + i, 7], "labels": labels}
        if kd_allowed:
            e["kd_allowed"] = [False] * len(labels)
        out.append(e)
    return out


def _hp(**kw) -> TrainHParams:
    base = dict(lr=0.05, weight_decay=0.0, batch_size=2, local_epochs=2, lam=0.3, tau=1.35, prox_mu=0.0)
    base.update(kw)
    return TrainHParams(**base)


def _hand_local_update(model, method, examples, hp, seed, client, rnd, autocast=False):
    """Algorithm 1's client loop written out: batches of iterate_batches seeded by
    (seed, client, round, epoch), plain SGD on eq. 8 (KD methods) or CE, by hand."""
    opt = torch.optim.SGD(model.stacks["local"].parameters(), lr=hp.lr)
    spec = get_method(method)
    tau = hp.tau if spec.selective else math.inf
    losses, orders, n_tokens, n_kd = [], [], 0, 0
    for epoch in range(hp.local_epochs):
        for batch in iterate_batches(examples, hp.batch_size, PAD, START, derive_seed(seed, client, rnd, epoch)):
            orders.append(batch["ids"])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                s = model.logits("local", batch["decoder_input_ids"])
                t = model.logits("global", batch["decoder_input_ids"]).detach()
            labels = batch["labels"]
            if spec.distill:
                loss, use, _ = hand_kd(s, t, labels, hp.lam, tau)
                n_kd += int(use.sum())
            else:
                valid = labels != -100
                ce = -F.log_softmax(s.double(), -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
                loss = ce[valid].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
            n_tokens += int((labels != -100).sum())
    return losses, orders, n_tokens, n_kd


@pytest.mark.parametrize("method", ["AdaFedSelectKD", "AdaFedAvg"])
def test_local_update_stats_and_batch_order_by_hand(method):
    """train_loss is the mean of the batches' losses; batches follow derive_seed(seed, client,
    round, epoch) (another round: another order); token and KD counts add up over all batches."""
    examples = _examples(7)
    hp = _hp()
    model, ref = Stub(1), Stub(1)
    opt = torch.optim.SGD(model.stacks["local"].parameters(), lr=hp.lr)
    stats = local_update(model, get_method(method), examples, hp, opt, 5, "c2", 3, PAD, START)
    losses, orders, n_tokens, n_kd = _hand_local_update(ref, method, examples, hp, 5, "c2", 3)
    assert [c["ids"] for c in model.calls] == [[100 + int(i[2:]) for i in ids] for ids in orders]
    assert stats["n_batches"] == len(losses) == 8
    assert stats["train_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
    assert max(losses) - min(losses) > 0.05  # a mean, not one batch's loss
    assert stats["n_tokens"] == n_tokens == 2 * sum(len(e["labels"]) for e in examples)
    assert stats["n_kd_tokens"] == n_kd
    assert stats["kd_fraction"] == pytest.approx(n_kd / n_tokens)
    if method == "AdaFedSelectKD":
        assert 0 < n_kd < n_tokens
    assert torch.allclose(model.stacks["local"][1].weight, ref.stacks["local"][1].weight, atol=1e-5)
    # round 4 of the same client draws other permutations
    other = Stub(1)
    local_update(other, get_method(method), examples, hp,
                 torch.optim.SGD(other.stacks["local"].parameters(), lr=hp.lr), 5, "c2", 4, PAD, START)
    assert [c["ids"] for c in other.calls] != [c["ids"] for c in model.calls]


def test_local_update_of_a_client_without_examples():
    model = Stub(0)
    stats = local_update(model, get_method("AdaFedSelectKD"), [], _hp(),
                         torch.optim.SGD(model.stacks["local"].parameters(), lr=0.1), 0, "c", 1, PAD, START)
    assert stats["n_batches"] == stats["n_tokens"] == stats["n_kd_tokens"] == 0
    assert stats["train_loss"] == 0.0 and stats["kd_fraction"] == 0.0


def test_batches_step_timer_and_precision_use_the_models_device(monkeypatch):
    """Each batch is moved to the device of the model's parameters, and the step timer (it
    synchronises CUDA before reading the clock), the precision's region (TF32 on CUDA) and its
    autocast (bf16 autocast of that device type) are told that device."""
    moved, timed, regions, autocasts, keys = [], [], [], [], []
    to_device = devices.to_device
    region, autocast = Precision.region, Precision.autocast

    def spy_region(self, device):
        regions.append(device)
        return region(self, device)

    def spy_autocast(self, device):
        autocasts.append(device)
        return autocast(self, device)

    def spy_to_device(batch, device):
        moved.append(device)
        return to_device(batch, device)

    class SpyTimer(devices.StepTimer):
        def __init__(self, device=None, **kwargs):
            timed.append(device)
            keys.append(kwargs.get("flop_key"))
            super().__init__(device, **kwargs)

    monkeypatch.setattr(devices, "to_device", spy_to_device)
    monkeypatch.setattr(devices, "StepTimer", SpyTimer)
    monkeypatch.setattr(Precision, "region", spy_region)
    monkeypatch.setattr(Precision, "autocast", spy_autocast)
    model = Stub(0)
    local_update(model, get_method("AdaFedKD"), _examples(3), _hp(), torch.optim.SGD(
        model.stacks["local"].parameters(), lr=0.1), 0, "c", 1, PAD, START, precision="bf16-mixed")
    cpu = torch.device("cpu")
    assert len(moved) == len(autocasts) == 4 and len(timed) == len(regions) == 1
    assert keys == ["adafedseleckd:AdaFedKD"]  # FLOPs counted per method (fedrepro.devices)
    for seen in (moved, timed, regions, autocasts):
        assert all(d is not None and torch.device(d) == cpu for d in seen), seen


class FakePrefixCache:
    """A prefix cache's interface: begin(model, client, examples), batch_prefix(model, host
    batch, device batch) -> the frozen prefix (here: an offset the stub adds to the logits)."""

    def __init__(self):
        self.begun: list[tuple] = []
        self.asked: list[tuple] = []

    def begin(self, model, client, examples):
        self.begun.append((model, client, examples))

    def batch_prefix(self, model, batch, device_batch):
        prefix = ((torch.linspace(-2.0, 2.0, V),), {"n": len(self.asked)})
        self.asked.append((model, batch, device_batch, prefix))
        return prefix


def test_prefix_cache_is_begun_per_client_and_feeds_every_step():
    examples = _examples(4)
    hp = _hp(local_epochs=1)
    model, ref = Stub(2), Stub(2)
    cache = FakePrefixCache()
    stats = local_update(model, get_method("AdaFedSelectKD"), examples, hp,
                         torch.optim.SGD(model.stacks["local"].parameters(), lr=hp.lr), 1, "c7", 2, PAD, START,
                         prefix_cache=cache)
    assert len(cache.begun) == 1
    begun_model, begun_client, begun_examples = cache.begun[0]
    assert begun_model is model and begun_client == "c7" and begun_examples is examples
    assert len(cache.asked) == len(model.calls) == stats["n_batches"] == 2
    for (m, host, dev, prefix), call in zip(cache.asked, model.calls):
        assert m is model and call["prefix"] is prefix
        assert torch.equal(host["labels"], dev["labels"]) and "ids" in host
    # the prefix reached the loss: the trained weights equal a hand run with the offset
    opt = torch.optim.SGD(ref.stacks["local"].parameters(), lr=hp.lr)
    offset = torch.linspace(-2.0, 2.0, V)
    for batch in iterate_batches(examples, 2, PAD, START, derive_seed(1, "c7", 2, 0)):
        s = ref.logits("local", batch["decoder_input_ids"]) + offset
        t = ref.logits("global", batch["decoder_input_ids"]).detach() + offset
        loss, _, _ = hand_kd(s, t, batch["labels"], hp.lam, hp.tau)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.allclose(model.stacks["local"][1].weight, ref.stacks["local"][1].weight, atol=1e-5)


def test_step_asks_for_the_local_student_and_the_global_teacher():
    batch = next(iterate_batches(_examples(2), 2, PAD, START))
    for method, teacher in (("AdaFedKD", "global"), ("AdaFedAvg", None)):
        model = Stub(0)
        _step(model, get_method(method), batch, "cpu", _hp(), math.inf,
              torch.optim.SGD(model.stacks["local"].parameters(), lr=0.1))
        assert [(c["student"], c["teacher"]) for c in model.calls] == [("local", teacher)]


def test_only_hard_kd_reads_the_pos_mask():
    """Examples may carry kd_allowed (here: nothing allowed); AdaFedKD still distils every token."""
    examples = _examples(3, kd_allowed=True)
    n_tokens = sum(len(e["labels"]) for e in examples)
    for method, expected in (("AdaFedKD", n_tokens), ("AdaFedHardKD", 0)):
        model = Stub(0)
        stats = local_update(model, get_method(method), examples, _hp(local_epochs=1),
                             torch.optim.SGD(model.stacks["local"].parameters(), lr=0.1), 0, "c", 1, PAD, START)
        assert stats["n_tokens"] == n_tokens and stats["n_kd_tokens"] == expected, method


def test_fedprox_with_mu_zero_needs_no_received_adapter_and_is_fedavg():
    batch = next(iterate_batches(_examples(2), 2, PAD, START))
    a, b = Stub(0), Stub(0)
    la, *_ = _step(a, get_method("AdaFedAvg"), batch, "cpu", _hp(), math.inf,
                   torch.optim.SGD(a.stacks["local"].parameters(), lr=0.1))
    lb, *_ = _step(b, get_method("AdaFedProx"), batch, "cpu", _hp(prox_mu=0.0), math.inf,
                   torch.optim.SGD(b.stacks["local"].parameters(), lr=0.1), proximal_to=None)
    assert torch.equal(la, lb)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_parameter_outside_a_steps_graph_is_not_touched_by_adamw():
    """Gradients are reset to None (zero_grad(set_to_none=True)): a parameter the step's loss does
    not reach is skipped by AdamW -- no weight decay, no step on its old moments."""
    batch = next(iterate_batches(_examples(2), 2, PAD, START))
    model = Stub(0, extra=True)
    opt = torch.optim.AdamW(model.stacks["local"].parameters(), lr=0.1, weight_decay=0.5)
    _step(model, get_method("AdaFedAvg"), batch, "cpu", _hp(), math.inf, opt)
    extra = model.stacks["local"].extra.detach().clone()
    emb = model.stacks["local"][0].weight.detach().clone()
    model.use_extra = False
    _step(model, get_method("AdaFedAvg"), batch, "cpu", _hp(), math.inf, opt)
    assert model.stacks["local"].extra.grad is None
    assert torch.equal(model.stacks["local"].extra, extra)
    assert not torch.equal(model.stacks["local"][0].weight, emb)  # the step did train


def test_hparams_from_config_read_prox_mu():
    cfg = {"lr": "2e-4", "weight_decay": 0.01, "batch_size": "16", "local_epochs": 1, "lam": 0.2, "tau": 5}
    hp = TrainHParams.from_config(cfg)
    assert hp == TrainHParams(2e-4, 0.01, 16, 1, 0.2, 5.0, 0.0) and isinstance(hp.prox_mu, float)
    assert TrainHParams.from_config({**cfg, "prox_mu": "0.01"}).prox_mu == 0.01


def test_bf16_mixed_runs_forward_and_loss_under_cpu_autocast():
    """precision="bf16-mixed": each step's forward and loss under bf16 autocast (the stub's linear
    layer gives bf16 logits), the update in float32 -- a hand loop under torch.autocast; fp32
    differs from it."""
    examples = _examples(5)
    hp = _hp()
    model, ref, plain = Stub(3), Stub(3), Stub(3)
    local_update(model, get_method("AdaFedSelectKD"), examples, hp,
                 torch.optim.SGD(model.stacks["local"].parameters(), lr=hp.lr), 2, "c", 1, PAD, START,
                 precision="bf16-mixed")
    _hand_local_update(ref, "AdaFedSelectKD", examples, hp, 2, "c", 1, autocast=True)
    local_update(plain, get_method("AdaFedSelectKD"), examples, hp,
                 torch.optim.SGD(plain.stacks["local"].parameters(), lr=hp.lr), 2, "c", 1, PAD, START)
    w, w_ref, w_plain = (m.stacks["local"][1].weight for m in (model, ref, plain))
    assert w.dtype == torch.float32
    assert torch.allclose(w, w_ref, atol=1e-4)
    assert not torch.allclose(w, w_plain, atol=1e-4)
