"""Matrix products whose rows do not depend on how many rows share them (docs/algorithm.md section 7).

A BLAS picks its kernel by the product's shape, and kernels sum a row's K products in different orders. Measured
with MKL and oneDNN in torch 2.13: float32 runs one kernel for a single row, another up to about 15 rows and a blocked
one above, and each rounds a row differently; on a CPU with AVX-512, float16 rounds a single row differently from two
or more, and oneDNN's bfloat16 kernels change with the row count for some weights (the shipped model's 768 x 256 down
projection: one value in a few thousand, from 33 rows on); with AVX2 only, neither does. A row of a linear layer then
rounds differently when the batch, the window or the prompt chunk around it changes.

So each product runs by a route that gives a row the same bits at every row count, the cheapest that does (ROUTES):
a call takes at least a route's fewest rows (zero rows appended: a row of a product reads only its own row of the
left operand, so with 16 the one-row and small-matrix kernels never run) and at most its most rows (a longer product
runs in blocks, the last one padded too); float16 and bfloat16 may also run in float32 (exact products of the
widened values, rounded once to the dtype). Every call then has a row count in the range the probe measured: the
first product with a given right operand (shape, dtype, layout, torch's thread count) is computed at every row
count up to 64, every 8th up to 128 and a few up to MAX_ROWS and beyond, and every row compared bit for bit with the
same row in a product of 16 rows, and 64 rows alone too. The shipped model's products with AVX-512: float32 and
float16 take 16 to 1024 rows a call; bfloat16 takes 1 to 1024, and 64 to 128 for that down projection (oneDNN rounds
it one way up to 32 rows, another from 33 to 255, a third from 256); with AVX2 only, float32 takes 16 to 1024 and
the others 1 to 1024. A product no route makes invariant is refused with one line naming it.
"""

import weakref

import torch

MIN_ROWS = 16  # the fewest rows a call needs to stay off the one-row and small-matrix kernels
MAX_ROWS = 1024  # the most rows of a call: longer products run in blocks of rows, each a count the probe measured
# Every count up to 64 (oneDNN's kernel choice changes at irregular counts there), every 8th up to 128, then sparser
# up to the most rows of a call, and one that splits into two calls.
PROBE_ROW_COUNTS = (*range(1, 65), *range(72, 129, 8), 160, 192, 256, 384, 512, 768, MAX_ROWS, MAX_ROWS + 76)
_REDUCED = (torch.float16, torch.bfloat16)
# (fewest rows of a call, in float32, most rows of a call): the ways a product may run, cheapest first
ROUTES = tuple(
    (fewest, widen, most)
    for widen in (False, True)
    for most in (MAX_ROWS, 128, 32)
    for fewest in ((1, MIN_ROWS, 64) if not widen else (MIN_ROWS,))
    if fewest < most
)
_ROUTES: dict[tuple, tuple] = {}  # probed right operands -> their route
# id of a weight -> (the weight, weakly; its version; the view's layout; the view in float32), dropped with the weight
_WIDENED: dict[int, tuple] = {}


def original_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch's own kernel for a @ b, reached through `mm.out`, an overload the switch leaves alone."""
    return torch.mm(a, b, out=a.new_empty((a.shape[0], b.shape[1])))


def invariant_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b, each row of the result the same bits whatever the other rows of `a` and however many there are."""
    if a.dtype != b.dtype or not a.dtype.is_floating_point:
        return original_mm(a, b)  # torch's own error or integer kernels, which are exact anyway
    return product(_route(b), a, b)


def invariant_addmm(bias, a, b, *, beta=1, alpha=1) -> torch.Tensor:
    """beta * bias + alpha * (a @ b) with the product of `invariant_mm`; the rest is elementwise."""
    out = invariant_mm(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:  # addmm's rule: the bias is not read (nor its NaNs)
        return out
    return out + (bias if beta == 1 else bias * beta)


def padded(a: torch.Tensor, rows: int = MIN_ROWS) -> torch.Tensor:
    """`a` with zero rows appended up to `rows` rows (as it is when it has as many)."""
    if a.shape[0] >= rows:
        return a
    return torch.cat([a, a.new_zeros((rows - a.shape[0], *a.shape[1:]))])


def product(route: tuple, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b the way `route` says (ROUTES): every call of torch's kernel with between its fewest and most rows (zero
    rows appended, longer products in blocks), in float32 or not."""
    fewest, widen, most = route
    rows, dtype = a.shape[0], a.dtype
    if widen:
        a, b = a.float(), widened(b)
    if rows <= most:
        out = original_mm(padded(a, fewest), b)
    else:
        out = torch.cat([original_mm(padded(part, fewest), b) for part in a.split(most)])
    if out.shape[0] != rows:
        out = out[:rows]
    return out.to(dtype) if widen else out


def widened(b: torch.Tensor) -> torch.Tensor:
    """`b` in float32; a view of a weight (a linear layer passes `weight.t()`) widened once and kept while the
    weight is alive and unchanged, instead of at every product."""
    weight = b._base
    if not isinstance(weight, torch.nn.Parameter):
        return b.float()
    layout = (b.shape, b.stride(), b.storage_offset())
    held = _WIDENED.get(id(weight))
    if held is None or held[0]() is not weight or held[1:3] != (weight._version, layout):
        if held is None:
            weakref.finalize(weight, _WIDENED.pop, id(weight), None)
        held = _WIDENED[id(weight)] = (weakref.ref(weight), weight._version, layout, b.float())
    return held[3]


def route_name(route: tuple) -> str:
    fewest, widen, most = route
    return f"{'float32' if widen else 'native'}, {fewest} to {most} rows a call"


def _route(b: torch.Tensor) -> tuple:
    key = (b.device.type, b.dtype, *b.shape, *b.stride(), torch.get_num_threads())
    route = _ROUTES.get(key)
    if route is None:
        route = _ROUTES[key] = probe_route(b)
    return route


def probe_route(b: torch.Tensor, run=product) -> tuple:
    """The first of ROUTES (the float32 ones for float16 and bfloat16 only) whose rows agree at every probed row
    count; a ValueError naming the product where none does. `run(route, a, b)` computes one (tests pass a fake)."""
    generator = torch.Generator(device=b.device).manual_seed(0)  # its own: the model's random state is left alone
    a = torch.randn((max(PROBE_ROW_COUNTS), b.shape[0]), generator=generator, device=b.device).to(b.dtype)
    for route in ROUTES:
        if route[1] and b.dtype not in _REDUCED:
            continue
        if rows_agree(lambda rows, route=route: run(route, rows, b), a):
            return route
    dtype = str(b.dtype).removeprefix("torch.")
    raise ValueError(
        f"batch_invariant(): {dtype} matrix products with a {b.shape[0]} x {b.shape[1]} operand round a row "
        f"differently with the number of rows on this {b.device.type} (torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads), so their rows cannot be made batch-invariant here: leave the switch off."
    )


def rows_agree(run, a: torch.Tensor) -> bool:
    """Whether every row of `run(a[:m])`, for m in PROBE_ROW_COUNTS, and each of the first 64 rows run alone, has
    the bits of the same row in a product of MIN_ROWS rows. Every row is compared, and many alone: in float16 and
    bfloat16 a different summation order shows only where it moves a rounding (one value in a few thousand)."""
    reference = torch.cat([run(a[start : start + MIN_ROWS]) for start in range(0, a.shape[0], MIN_ROWS)])
    if not all(torch.equal(run(a[i : i + 1])[0], reference[i]) for i in range(64)):
        return False
    return all(torch.equal(run(a[:rows]), reference[:rows]) for rows in PROBE_ROW_COUNTS)
