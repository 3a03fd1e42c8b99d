"""The optimizer and its schedule (studylib.run.optim)."""
from __future__ import annotations

import pytest

from _tiny import tiny_preset
from studylib.config import ConfigError, TrainConfig
from studylib.nn.model import Decoder
from studylib.run import optim as O


def test_lr_schedule_warmup_peak_end():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_frac=0.1)
    total = 100
    assert O.warmup_steps(total, cfg) == 10
    assert O.lr_at(0, total, cfg) == pytest.approx(1e-3 / 11)  # first step: small, not zero
    assert O.lr_at(10, total, cfg) == pytest.approx(1e-3)  # end of warmup: peak
    assert O.lr_at(9, total, cfg) < O.lr_at(10, total, cfg)
    assert O.lr_at(total - 1, total, cfg) == pytest.approx(1e-4)  # last step: min_lr
    assert O.lr_at(5 * total, total, cfg) == pytest.approx(1e-4)
    mid = 10 + (total - 1 - 10) / 2
    assert O.lr_at(mid, total, cfg) == pytest.approx((1e-3 + 1e-4) / 2)  # cosine midpoint
    lrs = [O.lr_at(s, total, cfg) for s in range(total)]
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # warmup rises
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    # the paper's schedule: 26,073 steps, 3% warmup
    paper = TrainConfig()
    assert O.warmup_steps(26073, paper) == 782
    assert O.lr_at(782, 26073, paper) == pytest.approx(3e-4)
    assert O.lr_at(26072, 26073, paper) == pytest.approx(3e-5)
    # no warmup: the first step is at the peak
    assert O.lr_at(0, 50, TrainConfig(warmup_frac=0.0)) == pytest.approx(3e-4)


def test_weight_decay_only_on_matrices():
    cfg = tiny_preset().model_config("moe")
    model = Decoder(cfg)
    groups = O.param_groups(model, 0.1)
    decay, no_decay = groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert "tok_emb.weight" in decay["names"]  # the (tied) embedding, once
    assert any("w_in_EFD" in n for n in decay["names"]) and any("router" in n for n in decay["names"])
    assert all("norm" in n for n in no_decay["names"]) and "norm.weight" in no_decay["names"]
    assert sum(p.numel() for g in groups for p in g["params"]) == model.num_params()
    opt = O.make_optimizer(model, tiny_preset().train)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_one_epoch_keeps_the_last_partial_batch():
    """Steps per epoch = ceil(windows / (batch x accumulation)): the paper's 834,322 windows at
    16 x 2 are 26,073 steps (26,072.6; flooring dropped 18 windows), whose 3% warmup is 782."""
    paper = TrainConfig()
    assert O.total_steps_for(paper, 834_322) == 26_073
    assert O.warmup_steps(O.total_steps_for(paper, 834_322), paper) == 782  # round(782.19)
    assert O.total_steps_for(paper, 834_304) == 26_072  # an exact multiple: no partial step
    assert O.total_steps_for(paper, 32) == 1 and O.total_steps_for(paper, 33) == 2
    assert O.total_steps_for(TrainConfig(max_steps=7), 834_322) == 7
    with pytest.raises(ConfigError, match="exceeds the 31 training windows"):
        O.total_steps_for(paper, 31)



def test_the_router_lr_scale_moves_the_routers_at_that_multiple_of_the_lr():
    """Adam's first step moves every weight by lr x sign(grad) (m / sqrt(v) = +-1): with
    ``router_lr_scale`` 0.1 the routers move by a tenth of what the other matrices move."""
    import dataclasses

    import torch

    cfg = tiny_preset().model_config("moe")
    torch.manual_seed(0)
    model = Decoder(cfg)
    tcfg = dataclasses.replace(tiny_preset().train, router_lr_scale=0.1, weight_decay=0.0)
    opt = O.make_optimizer(model, tcfg)
    assert [g.get("lr_scale", 1.0) for g in opt.param_groups] == [1.0, 1.0, 0.1]
    O.set_lr(opt, 1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    model(idx, idx.roll(-1, 1)).loss.backward()
    opt.step()
    for n, p in model.named_parameters():
        moved = (p.detach() - before[n]).abs()
        moved = moved[moved > 0]
        want = 1e-3 if n.endswith("router.weight") else 1e-2
        # at most lr x scale, and that for the typical entry (eps shrinks the step of a tiny gradient)
        assert len(moved) and float(moved.max()) == pytest.approx(want, rel=1e-3), n
        assert float(moved.median()) == pytest.approx(want, rel=1e-2), n
    default = O.make_optimizer(model, tiny_preset().train)
    assert len(default.param_groups) == 2  # scale 1: the groups as before the key existed
    with pytest.raises(ConfigError, match="train.router_lr_scale: must be a positive finite number"):
        TrainConfig(router_lr_scale=0.0).validate()
