"""Count Sketch kernels: sketching, the median query and the heavy-coordinate screening.

The torch reference of each is in :class:`gssgd.sketch.CountSketch` (``GSSGD_KERNELS=off``):

* :func:`sketch_accumulate` = ``CountSketch.accumulate``: the same table up to the order of
  the float additions (atomic adds land in no fixed order);
* :func:`query` = ``CountSketch.query``: bit for bit (the same gathers, the same min/max
  networks for 3 and 5 rows, the same order statistic otherwise);
* :func:`candidates` = the screening step of ``CountSketch.heavy_hitters``: the same
  coordinates, ascending.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gssgd.kernels.hash import BLOCK, compact, params_tensor, row_value, signed_bucket

__all__ = ["candidates", "query", "sketch_accumulate"]

#: torch.minimum/maximum propagate NaN, so the median networks must too (a constexpr global:
#: what a compiled kernel may read).
_NAN = tl.constexpr(tl.PropagateNan.ALL)


@triton.jit(do_not_specialize=["d", "cols"])
def _sketch_kernel(vec_ptr, acc_ptr, params_ptr, d, cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """acc[r, bucket_r(i)] += sign_r(i) * vec[i] for this program's block of coordinates."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    value = tl.load(vec_ptr + offs, mask=mask, other=0.0).to(acc_ptr.dtype.element_ty)
    idx = offs.to(tl.uint64, bitcast=True)
    for r in tl.static_range(ROWS):
        bucket, negative = signed_bucket(idx, params_ptr, r, cols)
        signed = tl.where(negative, -value, value)
        tl.atomic_add(acc_ptr + r * cols + bucket, signed, mask=mask, sem="relaxed")


def sketch_accumulate(
    table: torch.Tensor, vec: torch.Tensor, params: list[tuple[int, int, int, int]]
) -> None:
    """``table += sketch(vec)`` in place, hashes computed in the kernel.

    Contiguous float32 and float64 tables take the atomic adds directly; any other table
    (16-bit, or a strided view) gets a float32 sketch added once at the end (16-bit atomic
    adds are neither portable nor accurate).

    Args:
        table: ``(rows, cols)`` float table, ``rows == len(params)``.
        vec: 1-D float vector on the table's device (any float dtype).
        params: :func:`gssgd.sketch.count_sketch.sketch_hash_params` of the sketch.
    """
    rows, cols = _check_table(table, params)
    _check_same_device(table, vec, "vec")
    if vec.dim() != 1:
        raise ValueError(f"vec must be 1-D; got shape {tuple(vec.shape)}: flatten it first.")
    direct = table.dtype in (torch.float32, torch.float64) and table.is_contiguous()
    acc = table if direct else torch.zeros(rows, cols, dtype=torch.float32, device=table.device)
    d = vec.numel()
    grid = (triton.cdiv(d, BLOCK),)
    _sketch_kernel[grid](
        vec.contiguous(), acc, params_tensor(params, table.device), d, cols, ROWS=rows, BLOCK=BLOCK
    )
    if acc is not table:
        table += acc.to(table.dtype)


@triton.jit
def _median(table_ptr, params_ptr, idx, cols, mask, ROWS: tl.constexpr):
    """Median over rows of the signed bucket values: the min/max networks of
    :func:`gssgd.sketch.median_of_rows` for 1, 3 and 5 rows, else the order statistic by
    counting (rows x rows comparisons; NaN if any row is NaN, as ``torch.median``).
    The min/max propagate NaN, as torch.minimum/maximum do."""
    if ROWS == 1:
        med = row_value(table_ptr, params_ptr, idx, 0, cols, mask)
    elif ROWS == 3:
        a = row_value(table_ptr, params_ptr, idx, 0, cols, mask)
        b = row_value(table_ptr, params_ptr, idx, 1, cols, mask)
        c = row_value(table_ptr, params_ptr, idx, 2, cols, mask)
        lo = tl.minimum(a, b, propagate_nan=_NAN)
        hi = tl.maximum(a, b, propagate_nan=_NAN)
        med = tl.maximum(
            lo, tl.minimum(hi, c, propagate_nan=_NAN), propagate_nan=_NAN
        )
    elif ROWS == 5:
        a = row_value(table_ptr, params_ptr, idx, 0, cols, mask)
        b = row_value(table_ptr, params_ptr, idx, 1, cols, mask)
        c = row_value(table_ptr, params_ptr, idx, 2, cols, mask)
        d = row_value(table_ptr, params_ptr, idx, 3, cols, mask)
        e = row_value(table_ptr, params_ptr, idx, 4, cols, mask)
        # Neither the least nor the greatest of a..d can be the median of five.
        x = tl.maximum(
            tl.minimum(a, b, propagate_nan=_NAN), tl.minimum(c, d, propagate_nan=_NAN),
            propagate_nan=_NAN,
        )
        y = tl.minimum(
            tl.maximum(a, b, propagate_nan=_NAN), tl.maximum(c, d, propagate_nan=_NAN),
            propagate_nan=_NAN,
        )
        med = tl.maximum(
            tl.minimum(x, y, propagate_nan=_NAN),
            tl.minimum(tl.maximum(x, y, propagate_nan=_NAN), e, propagate_nan=_NAN),
            propagate_nan=_NAN,
        )
    else:
        half = ROWS // 2
        med = row_value(table_ptr, params_ptr, idx, 0, cols, mask)
        any_nan = med != med
        for j in tl.static_range(ROWS):
            vj = row_value(table_ptr, params_ptr, idx, j, cols, mask)
            any_nan = any_nan | (vj != vj)
            below = tl.zeros_like(idx).to(tl.int32)
            at_most = tl.zeros_like(idx).to(tl.int32)
            for i in tl.static_range(ROWS):
                vi = row_value(table_ptr, params_ptr, idx, i, cols, mask)
                below += (vi < vj).to(tl.int32)
                at_most += (vi <= vj).to(tl.int32)
            med = tl.where((below <= half) & (at_most > half), vj, med)
        med = tl.where(any_nan, float("nan"), med)
    return med


@triton.jit(do_not_specialize=["n", "cols"])
def _query_kernel(
    table_ptr, params_ptr, idx_ptr, out_ptr, n, cols,
    HAS_IDX: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[j] = median over rows of the signed bucket values of coordinate idx[j] (or j)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if HAS_IDX:  # noqa: SIM108 (a constexpr branch, resolved when compiling)
        idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    else:
        idx = offs
    med = _median(table_ptr, params_ptr, idx.to(tl.uint64, bitcast=True), cols, mask, ROWS)
    tl.store(out_ptr + offs, med.to(out_ptr.dtype.element_ty), mask=mask)


def query(
    table: torch.Tensor,
    params: list[tuple[int, int, int, int]],
    d: int,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Median-of-rows estimates of ``indices`` (all ``d`` coordinates when None).

    Args:
        table: ``(rows, cols)`` float table.
        params: the sketch's hash parameters (one tuple per row).
        d: the sketch's vector length (used when ``indices`` is None).
        indices: 1-D integer tensor of coordinates on the table's device (not range-checked
            here: :meth:`CountSketch.query` checks them).

    Returns:
        1-D tensor in the table's dtype, bit for bit ``CountSketch.query``.
    """
    rows, cols = _check_table(table, params)
    table = table.contiguous()
    if indices is not None:
        _check_same_device(table, indices, "indices")
        indices = indices.to(torch.int64).contiguous()
    n = d if indices is None else indices.numel()
    out = torch.empty(n, dtype=table.dtype, device=table.device)
    if n:
        grid = (triton.cdiv(n, BLOCK),)
        _query_kernel[grid](
            table, params_tensor(params, table.device), out if indices is None else indices,
            out, n, cols, HAS_IDX=indices is not None, ROWS=rows, BLOCK=BLOCK,
        )
    return out


@triton.jit(do_not_specialize=["d", "cols", "majority"])
def _candidates_kernel(
    table_ptr, params_ptr, tau_ptr, counts_ptr, offsets_ptr, out_ptr, d, cols, majority,
    WRITE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Coordinates with ``|signed bucket value| >= tau`` in at least ``majority`` rows:
    count them per block (WRITE False) or store them in order (WRITE True)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    idx = offs.to(tl.uint64, bitcast=True)
    tau = tl.load(tau_ptr)  # in the table's dtype; compared in float32 as row_value's
    if tau.dtype != tl.float64:
        tau = tau.to(tl.float32)
    votes = tl.zeros([BLOCK], dtype=tl.int32)
    for r in tl.static_range(ROWS):
        value = row_value(table_ptr, params_ptr, idx, r, cols, mask)
        votes += (tl.abs(value) >= tau).to(tl.int32)
    keep = mask & (votes >= majority)
    if WRITE:
        slot = tl.load(offsets_ptr + pid) + tl.cumsum(keep.to(tl.int64), axis=0) - 1
        tl.store(out_ptr + slot, offs, mask=keep)
    else:
        tl.store(counts_ptr + pid, tl.sum(keep.to(tl.int64), axis=0))


def candidates(
    table: torch.Tensor,
    params: list[tuple[int, int, int, int]],
    d: int,
    tau: torch.Tensor,
    majority: int,
) -> torch.Tensor:
    """The coordinates whose bucket has ``|value| >= tau`` in at least ``majority`` rows.

    A coordinate whose median estimate reaches ``tau`` has such a bucket in a majority of
    rows, so with ``majority = (rows + 1) // 2`` no coordinate with ``|estimate| >= tau``
    is missed. With one row this is the whole recovery: the bucket threshold gives the
    candidate coordinates.

    Args:
        table: ``(rows, cols)`` float table.
        params: the sketch's hash parameters.
        d: the sketch's vector length.
        tau: 0-d (or one-element) tensor in the table's dtype, on its device.
        majority: votes needed, ``1 <= majority <= rows``.

    Returns:
        int64 tensor of coordinates, ascending.
    """
    rows, cols = _check_table(table, params)
    if not 1 <= majority <= rows:
        raise ValueError(f"majority={majority} must be in [1, rows={rows}]")
    _check_same_device(table, tau, "tau")
    table = table.contiguous()
    tau = tau.reshape(1).to(table.dtype)
    hashes = params_tensor(params, table.device)

    def launch(grid, counts, offsets, out, write):
        _candidates_kernel[grid](
            table, hashes, tau, counts, offsets, out, d, cols, majority,
            WRITE=write, ROWS=rows, BLOCK=BLOCK,
        )

    return compact(launch, d, table.device)


def _check_table(table: torch.Tensor, params: list) -> tuple[int, int]:
    if table.dim() != 2 or not table.dtype.is_floating_point:
        raise ValueError(
            f"table must be a 2-D float tensor (rows, cols); got shape "
            f"{tuple(table.shape)}, dtype {table.dtype}; pass CountSketch.table."
        )
    rows, cols = table.shape
    if rows != len(params):
        raise ValueError(
            f"table has {rows} rows but params has {len(params)}; pass "
            "sketch_hash_params(seed, rows) of the same sketch."
        )
    return rows, cols


def _check_same_device(table: torch.Tensor, other: torch.Tensor, name: str) -> None:
    if other.device != table.device:
        raise ValueError(
            f"{name} is on {other.device} but the table is on {table.device}; move one of them."
        )
