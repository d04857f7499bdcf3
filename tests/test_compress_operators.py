"""PowerSGD's low-rank contract, and property tests (hypothesis) for top-k ties and sign packing."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.compress import BadParts, Compressed, ErrorFeedback, RngKey, SpecError, from_spec
from protocols.compress.powersgd import plan
from protocols.compress.sign import pack_signs, unpack_signs

KEY = RngKey(seed=1, peer="p00", step=0)
SHAPES = [(40, 30), (40,), (16, 3, 3, 3), (16,), (5, 4), (60, 50)]


def low_rank_model(rank: int, seed: int = 0) -> torch.Tensor:
    """A flat model whose matrix-shaped layers all have rank exactly ``rank``."""
    generator = torch.Generator().manual_seed(seed)
    pieces = []
    for shape in SHAPES:
        if len(shape) >= 2:
            rows, cols = shape[0], math.prod(shape[1:])
            a, b = torch.randn(rows, rank, generator=generator), torch.randn(cols, rank, generator=generator)
            pieces.append((a @ b.T).reshape(-1))
        else:
            pieces.append(torch.randn(shape, generator=generator))
    return torch.cat(pieces)


# ---------------------------------------------------------------- PowerSGD


def test_powersgd_plan_sends_small_and_one_dimensional_tensors_exactly() -> None:
    layers = plan(SHAPES, sum(math.prod(s) for s in SHAPES), rank=3)
    assert [layer.low_rank for layer in layers] == [True, False, True, False, False, True]
    assert (layers[2].rows, layers[2].cols) == (16, 27)  # conv: out-channels x the rest


@pytest.mark.parametrize("rank", [1, 3])
def test_powersgd_reconstructs_an_exactly_rank_r_model(rank: int) -> None:
    x = low_rank_model(rank)
    op = from_spec(f"powersgd:rank={rank}", shapes=SHAPES)
    c = op.compress(x, KEY)
    y = op.decompress(c)
    assert float((y - x).norm() / x.norm()) < 1e-5
    assert c.payload_bytes < x.numel() * 4 / 2


def test_powersgd_small_tensors_are_exact_and_factors_are_orthonormal() -> None:
    x = low_rank_model(5, seed=3)  # rank 5 > 2: not exactly representable
    op = from_spec("powersgd:rank=2", shapes=SHAPES)
    c = op.compress(x, KEY)
    y = op.decompress(c)
    bias = slice(40 * 30, 40 * 30 + 40)
    assert torch.equal(y[bias], x[bias])
    p_first = c.parts["p"][: 40 * 2].view(40, 2)
    assert torch.allclose(p_first.T @ p_first, torch.eye(2), atol=1e-5)


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation() -> None:
    generator = torch.Generator().manual_seed(4)
    u, _ = torch.linalg.qr(torch.randn(60, 60, generator=generator))
    v, _ = torch.linalg.qr(torch.randn(50, 50, generator=generator))
    singular = torch.tensor([10.0, 6.0, 1.0, 0.5] + [0.1] * 46)
    matrix = u[:, :50] @ torch.diag(singular) @ v.T
    op = from_spec("powersgd:rank=2", shapes=[(60, 50)])
    errors = []
    for step in range(8):
        y = op.decompress(op.compress(matrix.reshape(-1), RngKey(1, "p", step)))
        errors.append(float((y - matrix.reshape(-1)).norm()))
    best = float(singular[2:].norm())  # Eckart-Young: the optimal rank-2 error
    assert errors[-1] == pytest.approx(best, rel=1e-3)
    assert errors[-1] < errors[0]


def test_powersgd_state_is_per_slot_and_restorable() -> None:
    x = low_rank_model(4, seed=5)
    ef = ErrorFeedback(from_spec("powersgd:rank=2", shapes=SHAPES))
    for step in range(3):
        ef.compress(x, RngKey(1, "p", step), slot="left")
    ef.compress(-x, RngKey(1, "p", 0), slot="right")
    state = ef.export_state()
    assert {"residual/left", "residual/right"} <= set(state)
    assert any(name.startswith("operator/left/q.") for name in state)
    twin = ErrorFeedback(from_spec("powersgd:rank=2", shapes=SHAPES))
    twin.restore_state(state)
    a = ef.compress(x, RngKey(1, "p", 9), slot="left")
    b = twin.compress(x, RngKey(1, "p", 9), slot="left")
    assert all(torch.equal(a.parts[name], b.parts[name]) for name in a.parts)


def test_powersgd_rejects_bad_parts_and_shapes() -> None:
    op = from_spec("powersgd:rank=2", shapes=SHAPES)
    x = low_rank_model(2)
    c = op.compress(x, KEY)
    with pytest.raises(BadParts) as info:
        op.decompress(Compressed(c.op, c.numel + 1, c.parts))
    assert info.value.reason == "wrong_numel"
    p = c.parts["p"].clone()
    p[0] = float("nan")
    with pytest.raises(BadParts) as info:
        op.decompress(Compressed(c.op, c.numel, {**c.parts, "p": p}))
    assert info.value.reason == "nonfinite"
    with pytest.raises(BadParts) as info:
        op.decompress(Compressed(c.op, c.numel, {**c.parts, "q": c.parts["q"][1:]}))
    assert info.value.reason == "wrong_length"
    with pytest.raises(ValueError, match="shapes hold"):
        op.compress(x[1:], KEY)
    with pytest.raises(SpecError, match="rank"):
        from_spec("powersgd:rank=0")


def test_powersgd_without_shapes_uses_a_near_square_matrix() -> None:
    generator = torch.Generator().manual_seed(6)
    matrix = torch.randn(100, 1, generator=generator) @ torch.randn(1, 101, generator=generator)
    op = from_spec("powersgd:rank=1")
    y = op.decompress(op.compress(matrix.reshape(-1), KEY))  # 10,100 = 100 x 101: no padding
    assert torch.allclose(y, matrix.reshape(-1), atol=1e-4)


# ---------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(-4, 4), min_size=1, max_size=400),
    fraction=st.floats(0.001, 1.0),
)
def test_topk_is_the_stable_top_k_under_ties(values: list[int], fraction: float) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    op = from_spec(f"topk:fraction={fraction}")
    c = op.compress(x, KEY)
    k = min(len(values), max(1, round(fraction * len(values))))
    # Reference: sort by (-|x|, index), keep the first k, in index order.
    expected = sorted(sorted(range(len(values)), key=lambda i: (-abs(values[i]), i))[:k])
    assert kept_positions(c).tolist() == expected
    assert c.parts["values"].tolist() == [float(values[i]) for i in expected]


def kept_positions(c: Compressed) -> torch.Tensor:
    indices = c.parts["indices"].to(torch.int64)
    return indices + 32768 if c.parts["indices"].dtype == torch.int16 else indices


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    distinct=st.integers(1, 50),
    numel=st.integers(1, 60_000),
    fraction=st.sampled_from([0.001, 0.01, 0.05, 0.2]),
)
def test_topk_approx_contract_under_ties(seed: int, distinct: int, numel: int, fraction: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-distinct, distinct + 1, (numel,), generator=generator).float()
    op = from_spec(f"topk-approx:fraction={fraction},slack=0.1")
    c = op.compress(x, KEY)
    positions = kept_positions(c)
    k = min(numel, max(1, round(fraction * numel)))
    assert min(k, math.floor(k * 0.9)) <= positions.numel() <= min(numel, math.ceil(k * 1.1))
    kept = torch.zeros(numel, dtype=torch.bool)
    kept[positions] = True
    assert torch.equal(x[kept], c.parts["values"])
    if bool((~kept).any()):
        assert float(x[~kept].abs().max()) <= float(x[kept].abs().min())


@settings(max_examples=100, deadline=None)
@given(signs=st.lists(st.booleans(), min_size=0, max_size=300), scale=st.floats(0.0, 1e30))
def test_sign_pack_round_trip(signs: list[bool], scale: float) -> None:
    x = torch.tensor([-1.0 if negative else 1.0 for negative in signs], dtype=torch.float32)
    packed = pack_signs(x)
    assert packed.numel() == -(-len(signs) // 8)
    y = unpack_signs(packed, len(signs), scale)
    assert y.tolist() == [torch.tensor(-scale if negative else scale).float().item() for negative in signs]
