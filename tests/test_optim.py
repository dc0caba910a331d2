"""FrozenVarianceAdamW: AdamW until the freeze, then a step on the arriving momentum with
the variance it had at the freeze."""

from __future__ import annotations

import copy

import pytest
import torch

from gssgd.optim import FrozenVarianceAdamW

FREEZE = 4


def _grads(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return [torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)]


def _params() -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(99)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=gen)),
            torch.nn.Parameter(torch.randn(3, generator=gen))]


def _step(opt: torch.optim.Optimizer, params: list, grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    opt.step()


def test_before_the_freeze_it_is_adamw() -> None:
    ours, theirs = _params(), _params()
    settings = dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)
    frozen = FrozenVarianceAdamW(ours, freeze_step=FREEZE, **settings)
    adamw = torch.optim.AdamW(theirs, **settings)
    for t in range(FREEZE):
        _step(frozen, ours, _grads(t))
        _step(adamw, theirs, _grads(t))
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_after_the_freeze_it_steps_on_the_momentum_with_the_frozen_variance() -> None:
    lr, wd, eps, (b1, b2) = 0.01, 0.1, 1e-8, (0.9, 0.99)
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                              freeze_step=FREEZE)
    v = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE):
        _step(opt, params, _grads(t))
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, _grads(t), strict=True)]
    frozen = [opt.state[p]["exp_avg_sq"].clone() for p in params]
    for vi, f in zip(v, frozen, strict=True):
        torch.testing.assert_close(vi, f)
    for t in range(FREEZE, FREEZE + 3):
        before = [p.detach().clone() for p in params]
        momentum = _grads(100 + t)  # what the hook returns: the compressed momentum m
        _step(opt, params, momentum)
        for p, x, m, vi in zip(params, before, momentum, v, strict=True):
            want = x * (1 - lr * wd) - lr * m / ((vi / (1 - b2**FREEZE)).sqrt() + eps)
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        for p, f in zip(params, frozen, strict=True):
            assert torch.equal(opt.state[p]["exp_avg_sq"], f)  # the variance stays frozen


def test_a_moving_variance_follows_the_gradient_the_momentum_implies() -> None:
    """variance="moving": after the freeze v keeps moving on g_hat = (m - b1*m_prev)/(1-b1),
    with m_prev = 0 at the switch (the aggregator's momentum starts there), and the step
    divides by v's bias correction at the current step."""
    lr, wd, eps, (b1, b2) = 0.01, 0.1, 1e-8, (0.9, 0.99)
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                              freeze_step=FREEZE, variance="moving")
    v = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE):
        _step(opt, params, _grads(t))
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, _grads(t), strict=True)]
    previous = [torch.zeros_like(p) for p in params]
    for t in range(FREEZE, FREEZE + 3):
        before = [p.detach().clone() for p in params]
        momentum = _grads(100 + t)
        _step(opt, params, momentum)
        implied = [(m - b1 * m0) / (1 - b1) for m, m0 in zip(momentum, previous, strict=True)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, implied, strict=True)]
        for p, x, m, vi in zip(params, before, momentum, v, strict=True):
            want = x * (1 - lr * wd) - lr * m / ((vi / (1 - b2 ** (t + 1))).sqrt() + eps)
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
        previous = momentum


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"freeze_step": 0}, r"freeze_step=0 is invalid: it must be an integer >= 1"),
        ({"lr": 0.0}, r"lr=0.0 is invalid"),
        ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) is invalid"),
        ({"variance": "slow"}, r"variance='slow' is invalid: it must be one of \('frozen', "),
    ],
)
def test_bad_settings_are_refused(settings: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FrozenVarianceAdamW(_params(), **settings)


# ------------------------------------------------------------------ mutations the math must kill
def test_weight_decay_reaches_every_coordinate_of_a_sparse_momentum() -> None:
    """The compressed momentum is sparse (k of d coordinates): decoupled weight decay still
    shrinks all d, not only those with a nonzero update."""
    lr, wd = 0.01, 0.1
    p = torch.nn.Parameter(torch.linspace(1, 2, 12))
    opt = FrozenVarianceAdamW([p], lr=lr, weight_decay=wd, freeze_step=1)
    p.grad = torch.ones(12)
    opt.step()  # the dense step
    before = p.detach().clone()
    sparse = torch.zeros(12)
    sparse[3] = 0.5
    p.grad = sparse
    opt.step()
    untouched = torch.arange(12) != 3
    torch.testing.assert_close(p.detach()[untouched], before[untouched] * (1 - lr * wd),
                               rtol=0, atol=0)


def test_eps_is_added_outside_the_square_root() -> None:
    """``m / (sqrt(v_hat) + eps)``: with gradients of 1e-6, ``sqrt(v_hat + eps)`` would be a
    hundred times larger (the usual tests, with v of order 1, cannot tell them apart)."""
    lr, eps, (b1, b2) = 0.01, 1e-8, (0.9, 0.999)
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = FrozenVarianceAdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=0.0,
                              freeze_step=1)
    g = torch.full((4,), 1e-6, dtype=torch.float64)
    p.grad = g.clone()
    opt.step()  # AdamW's first step: m_hat = g, v_hat = g^2
    torch.testing.assert_close(p.detach(), -lr * g / (g.abs() + eps), rtol=1e-12, atol=0)
    before = p.detach().clone()
    m = torch.full((4,), 2e-6, dtype=torch.float64)
    p.grad = m.clone()
    opt.step()  # frozen: m / (sqrt(v_hat) + eps), v_hat = g^2 after one step
    torch.testing.assert_close(p.detach(), before - lr * m / (g.abs() + eps), rtol=1e-12, atol=0)


# ------------------------------------------------------------------ coordinates v never saw
def test_a_parameter_unused_in_the_warm_up_steps_no_more_than_adamw_would() -> None:
    """A parameter with no gradient through the dense steps has v = 0 at the freeze. Frozen,
    its first momentum would step lr * m / eps (1e5 * lr here); its v keeps moving instead
    (bias-corrected from the freeze), so the step is AdamW's size: at most a few lr."""
    lr, (b1, b2) = 0.01, (0.9, 0.999)
    used, unused = torch.nn.Parameter(torch.zeros(5)), torch.nn.Parameter(torch.zeros(5))
    opt = FrozenVarianceAdamW([used, unused], lr=lr, betas=(b1, b2), weight_decay=0.0,
                              freeze_step=FREEZE)
    for t in range(FREEZE):
        used.grad, unused.grad = _grads(t)[0][:, 0].clone(), torch.zeros(5)
        opt.step()
    assert torch.equal(unused.detach(), torch.zeros(5))
    for t in range(3):
        m = torch.full((5,), 1e-3 * (t + 1))  # the first momenta that reach it
        before = unused.detach().clone()
        used.grad, unused.grad = torch.zeros(5), m
        opt.step()
        moved = (unused.detach() - before).abs().max()
        assert 0 < moved <= 1.5 * lr, f"step {t}: moved {float(moved)} (AdamW's size: ~lr)"
    assert bool(opt.state[unused]["unseen"].all()) and "unseen" not in opt.state[used]
    # and it is the documented rule: v moves on the implied gradient from the freeze
    v = torch.zeros(5)
    previous = torch.zeros(5)
    for t in range(3):
        m = torch.full((5,), 1e-3 * (t + 1))
        implied = (m - b1 * previous) / (1 - b1)
        v = b2 * v + (1 - b2) * implied * implied
        previous = m
    torch.testing.assert_close(opt.state[unused]["exp_avg_sq"], v)


def test_a_checkpoint_keeps_the_unseen_coordinates_and_the_freeze() -> None:
    """load_state_dict casts tensors to the parameter's dtype: the mask still works after
    a round trip, and the freeze step is kept."""
    p = torch.nn.Parameter(torch.zeros(4))
    opt = FrozenVarianceAdamW([p], lr=0.01, freeze_step=2)
    for g in (torch.tensor([1.0, 0, 0, 0]), torch.tensor([1.0, 0, 0, 0]), torch.ones(4)):
        p.grad = g
        opt.step()
    q = torch.nn.Parameter(p.detach().clone())
    again = FrozenVarianceAdamW([q], lr=0.01, freeze_step=2)
    again.load_state_dict(copy.deepcopy(opt.state_dict()))  # as torch.save would
    assert again.state[q]["frozen_at"] == 2
    for o, x in ((opt, p), (again, q)):
        x.grad = torch.full((4,), 0.5)
        o.step()
    assert torch.equal(p.detach(), q.detach())
    assert again.state[q]["unseen"].dtype == torch.bool


# ------------------------------------------------------------------ following a hook
class _Hook:
    """What the optimizer reads of a hook state: its iteration count, last kind and the
    parameters it skipped."""

    def __init__(self) -> None:
        self.iter, self.last_iteration, self.last_skipped = 0, "none", frozenset()

    def ran(self, kind: str, skipped: frozenset[int] = frozenset()) -> None:
        self.iter += 1
        self.last_iteration, self.last_skipped = kind, skipped


def test_following_a_hook_the_variance_freezes_at_its_first_compressed_iteration() -> None:
    """A step the scaler skipped in the warm-up (the hook ran, the optimizer did not) does
    not shift the switch: the first compressed momentum is stepped on as a momentum, with
    the variance of the dense steps actually taken."""
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=0.01, freeze_step=FREEZE)
    hook = _Hook()
    opt.follow(hook)
    for t in range(FREEZE):
        hook.ran("dense")
        if t == 1:
            continue  # the scaler skipped this optimizer step
        _step(opt, params, _grads(t))
    hook.ran("compressed")
    v = [opt.state[p]["exp_avg_sq"].clone() for p in params]
    momentum = _grads(50)
    _step(opt, params, momentum)
    for p, m, vi in zip(params, momentum, v, strict=True):
        assert opt.state[p]["frozen_at"] == FREEZE - 1
        assert torch.equal(opt.state[p]["exp_avg"], m)  # taken as m, not folded into AdamW's
        assert torch.equal(opt.state[p]["exp_avg_sq"], vi)  # and v did not absorb m^2


@pytest.mark.parametrize("variance", ["frozen", "moving"])
def test_a_skipped_iteration_moves_nothing(variance: str) -> None:
    """The hook returned zeros for a non-finite step: parameters and both moments stay."""
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=0.01, freeze_step=1, variance=variance)
    hook = _Hook()
    opt.follow(hook)
    for t, kind in enumerate(["dense", "compressed", "compressed"]):
        hook.ran(kind)
        _step(opt, params, _grads(t))
    before = {k: [opt.state[p][k].clone() for p in params] for k in ("exp_avg", "exp_avg_sq")}
    weights = [p.detach().clone() for p in params]
    hook.ran("skipped")
    _step(opt, params, [torch.zeros_like(p) for p in params])
    for key, saved in before.items():
        for p, s in zip(params, saved, strict=True):
            assert torch.equal(opt.state[p][key], s), key
    for p, w in zip(params, weights, strict=True):
        assert torch.equal(p.detach(), w)


def _after_one_dense_step() -> tuple[list, FrozenVarianceAdamW, _Hook]:
    """An optimizer following a hook, after the hook's one dense iteration and its step."""
    params = _params()
    opt = FrozenVarianceAdamW(params, lr=0.01, freeze_step=1)
    hook = _Hook()
    opt.follow(hook)
    hook.ran("dense")
    _step(opt, params, _grads(0))
    return params, opt, hook


def test_a_second_step_on_the_same_iteration_is_refused() -> None:
    params, opt, _ = _after_one_dense_step()
    with pytest.raises(RuntimeError, match=r"ran twice on iteration 0 of its hook"):
        _step(opt, params, _grads(1))


def _unused_after_freeze(unseen: str) -> tuple[FrozenVarianceAdamW, torch.nn.Parameter,
                                                 torch.nn.Parameter]:
    """A tensor half of whose coordinates had no gradient in the FREEZE dense steps, then
    one compressed step with a momentum on every coordinate."""
    p = torch.nn.Parameter(torch.zeros(6))
    other = torch.nn.Parameter(torch.zeros(2))
    opt = FrozenVarianceAdamW([p, other], lr=0.01, weight_decay=0.0, freeze_step=FREEZE,
                              unseen=unseen)
    for t in range(FREEZE + 1):
        grad = torch.zeros(6)
        grad[:3] = torch.tensor([1.0, -2.0, 0.5]) * (t + 1)
        p.grad, other.grad = (grad, torch.ones(2)) if t < FREEZE else (torch.full((6,), 0.1),
                                                                      torch.ones(2))
        opt.step()
    return opt, p, other


def test_the_mask_rule_never_steps_a_coordinate_the_warm_up_did_not_see() -> None:
    opt, p, _ = _unused_after_freeze("mask")
    assert torch.equal(p.detach()[3:], torch.zeros(3))
    assert bool((p.detach()[:3] != 0).all())


def test_the_floor_rule_gives_unseen_coordinates_the_mean_variance_of_their_tensor() -> None:
    opt, p, _ = _unused_after_freeze("floor")
    v = opt.state[p]["exp_avg_sq"]
    torch.testing.assert_close(v[3:], v[:3].mean().expand(3))
    assert "unseen" not in opt.state[p]  # frozen from the freeze on, like the rest


def test_the_frozen_rule_is_the_old_lr_m_over_eps_step() -> None:
    """What the default rule prevents: 0.01 * 0.1 / 1e-8 = 1e5 per step."""
    opt, p, _ = _unused_after_freeze("frozen")
    assert float(p.detach()[3:].abs().min()) > 1e4


def test_an_unknown_unseen_rule_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unseen='zero' is invalid: it must be one of "
                       r"\('moving', 'mask', 'floor', 'frozen'\)"):
        FrozenVarianceAdamW(_params(), unseen="zero")


@pytest.mark.parametrize("unseen", ["moving", "mask", "floor", "frozen"])
def test_a_first_step_that_is_already_compressed_stays_finite(unseen: str) -> None:
    """The hook compressed before the optimizer took any dense step (every warm-up step
    skipped by the scaler): no variance at all, yet no NaN from a zero bias correction."""
    p = torch.nn.Parameter(torch.ones(4))
    opt = FrozenVarianceAdamW([p], lr=0.01, freeze_step=2, unseen=unseen)
    hook = _Hook()
    opt.follow(hook)
    hook.ran("dense")
    hook.ran("dense")  # both dense steps skipped by the scaler
    hook.ran("compressed")
    p.grad = torch.full((4,), 0.1)
    opt.step()
    assert bool(torch.isfinite(p.detach()).all())
    assert opt.state[p]["frozen_at"] == 0


def test_a_hook_dense_for_longer_than_freeze_step_freezes_at_its_switch() -> None:
    """Streaming gs runs a process's first two iterations dense whatever start_iter says:
    with freeze_step=1 the optimizer takes two dense steps, then freezes (and marks the
    coordinates it never saw) at the first compressed one."""
    used, unused = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    opt = FrozenVarianceAdamW([used, unused], lr=0.01, weight_decay=0.0, freeze_step=1)
    hook = _Hook()
    opt.follow(hook)
    for kind in ("dense", "dense", "compressed"):
        hook.ran(kind)
        used.grad, unused.grad = torch.ones(3), (torch.zeros(3) if kind == "dense"
                                                 else torch.full((3,), 0.1))
        opt.step()
    assert opt.state[used]["frozen_at"] == opt.state[unused]["frozen_at"] == 2
    assert bool(opt.state[unused]["unseen"].all())
    assert float(unused.detach().abs().max()) <= 0.015  # AdamW's size, not lr * m / eps


def test_a_state_saved_without_frozen_at_froze_at_freeze_step() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = FrozenVarianceAdamW([p], lr=0.01, freeze_step=2)
    for _ in range(4):
        p.grad = torch.ones(2)
        opt.step()
    for steps, want in ((4, 2), (2, -1)):  # past the freeze step, or not yet
        old = copy.deepcopy(opt.state_dict())
        for state in old["state"].values():
            del state["frozen_at"]
            state["step"] = torch.tensor(float(steps), dtype=torch.float64)
        again = FrozenVarianceAdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.01,
                                    freeze_step=2)
        again.load_state_dict(old)
        assert next(iter(again.state.values()))["frozen_at"] == want


def test_parameters_of_a_skipped_bucket_do_not_move() -> None:
    """Per-bucket hooks skip bucket by bucket: the others step, the skipped stay."""
    params, opt, hook = _after_one_dense_step()
    before = [p.detach().clone() for p in params]
    moments = [opt.state[p]["exp_avg"].clone() for p in params]
    hook.ran("compressed", skipped=frozenset({id(params[1])}))
    _step(opt, params, [_grads(1)[0], torch.zeros(3)])
    assert not torch.equal(params[0].detach(), before[0])
    assert torch.equal(params[1].detach(), before[1])
    assert torch.equal(opt.state[params[1]]["exp_avg"], moments[1])
