"""Matrix products whose rows do not depend on how many rows share them (docs/algorithm.md section 7).

A BLAS picks its kernel by the product's shape, and kernels sum a row's K products in different orders. Measured on
this project's CPU (MKL and oneDNN in torch 2.13): float32 runs one kernel for a single row, another up to about 15
rows and a blocked one above, and each rounds a row differently; float16 rounds a single row differently from two or
more; oneDNN's bfloat16 kernels change with the row count for some weights (the shipped model's 768 x 256 down
projection: one value in a few thousand, from 33 rows on). A row of a linear layer then rounds differently when the
batch, the window or the prompt chunk around it changes.

So each product runs by a route that gives a row the same bits at every row count, the cheapest that does (ROUTES):
as it is; with at least MIN_ROWS rows (zero rows appended: a row of a product reads only its own row of the left
operand, so the one-row and small-matrix kernels never run); in blocks of at most BLOCK_ROWS rows (for kernels that
change again above some count, as that down projection does); and, for float16 and bfloat16, in float32 (exact
products of the widened values, rounded once to the dtype). Which route holds is measured where it runs, not
assumed: the first product with a given right operand (shape, dtype, layout, torch's thread count) is computed at
every row count up to 64 and at a few above, and every row compared bit for bit with the same row in a product of
MIN_ROWS rows. A product no route makes invariant is refused with one line naming it.
"""

import weakref

import torch

MIN_ROWS = 16
BLOCK_ROWS = 32
# Every count up to 64 (oneDNN's kernel choice changes at irregular counts there), then a few larger ones.
PROBE_ROW_COUNTS = (*range(1, 65), 96, 128, 192, 256)
_REDUCED = (torch.float16, torch.bfloat16)
# (padded to MIN_ROWS rows, in float32, in blocks of BLOCK_ROWS rows): the ways a product may run, cheapest first
ROUTES = (
    (False, False, False),
    (True, False, False),
    (False, False, True),
    (True, False, True),
    (True, True, False),
    (True, True, True),
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


def padded(a: torch.Tensor) -> torch.Tensor:
    """`a` with zero rows appended up to MIN_ROWS rows (as it is when it has as many)."""
    if a.shape[0] >= MIN_ROWS:
        return a
    return torch.cat([a, a.new_zeros((MIN_ROWS - a.shape[0], *a.shape[1:]))])


def product(route: tuple, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b the way `route` says (ROUTES): padded to MIN_ROWS rows or not, in float32 or not, in blocks of
    BLOCK_ROWS rows (the last one padded too, with padding) or whole."""
    pad, widen, blocks = route
    rows, dtype = a.shape[0], a.dtype
    if pad and rows < MIN_ROWS:
        a = padded(a)
    if widen:
        a, b = a.float(), widened(b)
    if blocks and a.shape[0] > BLOCK_ROWS:
        parts = [padded(part) if pad else part for part in a.split(BLOCK_ROWS)]
        out = torch.cat([original_mm(part, b) for part in parts])
    else:
        out = original_mm(a, b)
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
    pad, widen, blocks = route
    parts = ["float32" if widen else "native"]
    parts += [f"at least {MIN_ROWS} rows"] if pad else []
    parts += [f"in blocks of {BLOCK_ROWS} rows"] if blocks else []
    return ", ".join(parts)


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
    bfloat16 a different summation order shows only where it moves a rounding, in about one value in a thousand."""
    reference = torch.cat([run(a[start : start + MIN_ROWS]) for start in range(0, a.shape[0], MIN_ROWS)])
    if not all(torch.equal(run(a[i : i + 1])[0], reference[i]) for i in range(64)):
        return False
    return all(torch.equal(run(a[:rows]), reference[:rows]) for rows in PROBE_ROW_COUNTS)
