"""The adapter bank: switching adapters parks and restores every bit of training state."""

from __future__ import annotations

import pytest
import torch

from arctic_platform.rl.api import InvalidRequestError, NotFoundError
from arctic_rl_engines.ds_adapter_bank import AdapterBank, fresh_lora_weights


class Lora(torch.nn.Module):
    """Two LoRA matrices around a frozen base, named as peft names them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.base = torch.nn.Linear(6, 5, bias=False).requires_grad_(False)
        self.A = torch.nn.Parameter(torch.randn(2, 6) * 0.1)
        self.B = torch.nn.Parameter(torch.zeros(5, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.A.T @ self.B.T

    def lora(self) -> dict[str, torch.nn.Parameter]:
        return {"m.q_proj.lora_A.weight": self.A, "m.q_proj.lora_B.weight": self.B}


def _setup():
    model = Lora()
    optimizer = torch.optim.AdamW(list(model.lora().values()), lr=0.05, foreach=True)
    counters = {"steps": 0}
    bank = AdapterBank(
        model.lora(),
        optimizer,
        counters=lambda: dict(counters),
        set_counters=lambda c: counters.update(c),
    )
    return model, optimizer, bank, counters


def _backward(model: Lora, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 5, generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()


def _step(model, optimizer, counters, seed: int) -> None:
    _backward(model, seed)
    optimizer.step()
    optimizer.zero_grad()
    counters["steps"] += 1


def test_an_adapter_parked_and_restored_trains_on_as_if_never_parked():
    ref_model, ref_opt, _, ref_counters = _setup()
    for seed in range(4):
        _step(ref_model, ref_opt, ref_counters, seed)
    _backward(ref_model, 99)  # a gradient pending when the switch comes

    model, opt, bank, counters = _setup()
    for seed in range(4):
        _step(model, opt, counters, seed)
    _backward(model, 99)
    bank.add("other", seed=3)
    assert bank.use("other") and bank.live == "other"
    assert counters["steps"] == 0 and model.A.grad is None and not opt.state.get(model.A)
    assert torch.equal(model.B, torch.zeros(5, 2)), "a new adapter starts equal to the base"
    for seed in range(10, 13):
        _step(model, opt, counters, seed)
    other_b = model.B.detach().clone()
    assert bank.use("default") and not bank.use("default")
    assert counters["steps"] == 4
    for p, q in zip(model.lora().values(), ref_model.lora().values(), strict=True):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
    opt.step()
    ref_opt.step()
    for p, q in zip(model.lora().values(), ref_model.lora().values(), strict=True):
        assert torch.equal(p, q), "the first step after the switch equals the unswitched one"
    bank.use("other")
    assert torch.equal(model.B, other_b) and counters["steps"] == 3
    assert bank.names() == ["other", "default"] and bank.parked_bytes() > 0


def test_learning_rate_and_betas_are_kept_per_adapter():
    _, opt, bank, _ = _setup()
    bank.add("b")
    opt.param_groups[0]["lr"] = 0.5
    bank.use("b")
    assert opt.param_groups[0]["lr"] == 0.05
    opt.param_groups[0]["betas"] = (0.5, 0.6)
    bank.use("default")
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_bad_names_are_refused_and_change_nothing():
    _, _, bank, _ = _setup()
    with pytest.raises(InvalidRequestError, match="already exists"):
        bank.add("default")
    for bad in ("", "a@v1"):
        with pytest.raises(InvalidRequestError):
            bank.add(bad)
    with pytest.raises(NotFoundError, match="holds \\['default'\\]"):
        bank.use("missing")
    bank.add("b")
    bank.remove("b")
    bank.remove("default")
    assert bank.names() == [] and bank.live is None


def test_fresh_weights_are_seeded_kaiming_a_and_zero_b():
    model = Lora()
    one = fresh_lora_weights(model.lora(), seed=1)
    again = fresh_lora_weights(model.lora(), seed=1)
    other = fresh_lora_weights(model.lora(), seed=2)
    a = one["m.q_proj.lora_A.weight"]
    assert torch.equal(a, again["m.q_proj.lora_A.weight"])
    assert not torch.equal(a, other["m.q_proj.lora_A.weight"])
    assert a.abs().max() <= 1 / 6**0.5 and a.abs().max() > 0
    assert torch.count_nonzero(one["m.q_proj.lora_B.weight"]) == 0
