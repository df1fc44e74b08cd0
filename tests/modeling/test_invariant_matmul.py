"""Matrix products under the switch: a row's bits do not depend on the other rows, dtype by dtype."""

import pytest
import torch

from wedlm_hf.modeling import invariant_matmul
from wedlm_hf.modeling.invariant_matmul import (
    MIN_ROWS,
    invariant_addmm,
    invariant_mm,
    original_mm,
    probe_route,
    product,
    route_name,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# The shipped model's products (hidden -> q/o, k/v, MLP up, MLP down, the head); counts a decoding step feeds.
SHAPES = [(256, 256), (256, 128), (256, 768), (768, 256), (256, 4096)]
ROW_COUNTS = [1, 2, 5, 15, 16, 17, 33, 70, 130, 300]


def operands(k: int, n: int, dtype, rows: int = 300):
    generator = torch.Generator().manual_seed(k * 7 + n)
    weight = torch.randn((n, k), generator=generator).to(dtype)
    return torch.randn((rows, k), generator=generator).to(dtype), weight.t()  # as a linear layer passes them


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_gets_the_same_bits_among_any_number_of_rows(dtype):
    for k, n in SHAPES:
        a, b = operands(k, n, dtype)
        alone = torch.cat([invariant_mm(a[i : i + 1], b) for i in range(a.shape[0])])
        for rows in ROW_COUNTS:
            assert torch.equal(invariant_mm(a[:rows], b), alone[:rows]), (dtype, k, n, rows)
        shuffled = torch.randperm(a.shape[0], generator=torch.Generator().manual_seed(0))
        assert torch.equal(invariant_mm(a[shuffled], b), alone[shuffled])  # a row's place does not matter either


def test_torch_own_float32_product_rounds_a_row_alone_differently():
    """What the routes are for: a single float32 row takes another kernel (the first test would fail without
    padding). Every CPU measured so far does this; float16 and bfloat16 depend on the CPU (next test)."""
    a, b = operands(256, 768, torch.float32)
    assert not torch.equal(original_mm(a[:1], b)[0], original_mm(a[:MIN_ROWS], b)[0])


def test_every_product_of_the_shipped_model_has_a_route_here():
    """Each of the shipped model's products has a route on this CPU in every dtype, float32's padded to 16 rows a
    call. Which one float16 and bfloat16 take depends on the CPU (docs/algorithm.md section 7.b): with AVX-512,
    float16 pads to 16 rows and bfloat16's 768 x 256 down projection takes 64 to 128 rows a call; with AVX2 only,
    both take 1 to 1,024. Where a route pads, torch's own kernel does round some row differently with fewer rows."""
    for dtype in DTYPES:
        for k, n in SHAPES:
            b = operands(k, n, dtype)[1]
            fewest, widen, most = route = probe_route(b)
            assert dtype != torch.float32 or route == (MIN_ROWS, False, invariant_matmul.MAX_ROWS), route_name(route)
            if fewest > 1 and not widen:  # padding that is needed: the same calls without it disagree somewhere
                unpadded = (1, False, most)
                assert not invariant_matmul.rows_agree(lambda rows, b=b, u=unpadded: product(u, rows, b), b_rows(b))


def b_rows(b: torch.Tensor) -> torch.Tensor:
    """Left operands for `rows_agree`, as the probe draws them."""
    generator = torch.Generator().manual_seed(0)
    count = max(invariant_matmul.PROBE_ROW_COUNTS)
    return torch.randn((count, b.shape[0]), generator=generator).to(b.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_products_stay_close_to_torch_own(dtype):
    a, b = operands(256, 768, dtype)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(invariant_mm(a, b), original_mm(a, b), atol=tolerance, rtol=tolerance)


def test_rows_agree_on_two_threads():
    torch.set_num_threads(2)  # the conftest puts the count back after the test
    a, b = operands(256, 4096, torch.float32)
    alone = torch.cat([invariant_mm(a[i : i + 1], b) for i in range(20)])
    assert torch.equal(invariant_mm(a, b)[:20], alone)


def test_addmm_adds_the_bias_to_the_invariant_product():
    a, b = operands(256, 128, torch.float32)
    bias = torch.randn(128)
    product = invariant_mm(a[:3], b)
    assert torch.equal(invariant_addmm(bias, a[:3], b), product + bias)
    assert torch.equal(invariant_addmm(bias, a[:3], b, beta=0.5, alpha=2), product * 2 + bias * 0.5)
    assert torch.equal(invariant_addmm(torch.full((128,), float("nan")), a[:3], b, beta=0), product)  # not read


def test_the_probe_takes_the_first_route_whose_rows_agree():
    _, b = operands(256, 128, torch.bfloat16)

    def native_varies(route, a, b):  # a kernel that rounds with the row count unless the product runs in float32
        out = product(route, a, b)
        return out if route[1] else out + a.shape[0]

    assert route_name(probe_route(b, run=native_varies)) == "float32, 16 to 1024 rows a call"

    def one_row_differs(route, a, b):  # a kernel that rounds a single row differently unless it is padded
        out = original_mm(a, b)
        return out + 1 if a.shape[0] == 1 and route[0] == 1 else out

    assert route_name(probe_route(b, run=one_row_differs)) == "native, 16 to 1024 rows a call"

    def blocks_needed(route, a, b):  # a kernel that rounds differently above 40 rows unless calls have fewer
        out = original_mm(a, b)
        return out + 1 if a.shape[0] > 40 and route[2] > 40 else out

    assert route_name(probe_route(b, run=blocks_needed)) == "native, 1 to 32 rows a call"
    assert route_name(probe_route(b, run=lambda route, a, b: original_mm(a, b))) == "native, 1 to 1024 rows a call"


def test_a_product_no_route_makes_invariant_is_refused_in_one_line():
    _, b = operands(256, 128, torch.float32)
    with pytest.raises(
        ValueError, match=r"^batch_invariant\(\): float32 matrix products with a 256 x 128 operand"
    ) as e:
        probe_route(b, run=lambda route, a, b: original_mm(a, b) + a.shape[0])
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError):  # float32 operands have no wider route to fall back on
        probe_route(b, run=lambda route, a, b: original_mm(a, b) * (1.0 if route[1] else 1 + a.shape[0] * 1e-3))


def test_routes_are_probed_once_per_operand_shape(monkeypatch):
    probed = []
    monkeypatch.setattr(invariant_matmul, "_ROUTES", {})
    monkeypatch.setattr(invariant_matmul, "probe_route", lambda b: probed.append(b.shape) or (16, False, 128))
    a, b = operands(256, 128, torch.float32)
    for rows in (1, 40, 3):
        invariant_mm(a[:rows], b)
    assert probed == [b.shape]


def test_integer_products_are_torch_own():
    a = torch.randint(-5, 5, (3, 4))
    b = torch.randint(-5, 5, (4, 2))
    assert torch.equal(invariant_mm(a, b), a @ b)
