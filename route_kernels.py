"""
The route as fused Triton kernels: model.reference_route's math, one pass over the sources.

Per token, with m sources s_i (each [B, T, d]) and the route's pseudo-query w ([d]):

    r_i     = (|s_i|^2 / d + eps)^(-1/2)       gainless rmsnorm, as a scale: no normalised copy of s_i
    logit_i = r_i (s_i . w)                    = w . rmsnorm(s_i)
    a       = softmax_i(logit)                 over depth, per token
    mix     = sum_i a_i s_i

Backward, with g = dL/dmix:

    gs_i    = g . s_i                          = dL/da_i
    gmix    = g . mix                          (= sum_k a_k gs_k; with bf16 sources, of the mix as stored)
    delta_i = a_i (gs_i - gmix)                = dL/dlogit_i, the softmax backward
    dL/ds_i = a_i g + delta_i r_i (w - logit_i r_i s_i / d)
    dL/dw   = sum over tokens of sum_i delta_i r_i s_i

dL/ds_i is the mix's direct term a_i g plus delta_i dlogit_i/ds_i, where dlogit_i/ds_i = r_i w + (s_i . w)
dr_i/ds_i and dr_i/ds_i = -r_i^3 s_i / d: so r_i (w - logit_i r_i s_i / d). gmix is read from the stored mix,
not summed over the sources: it is then known before the first source is read, and each source's gradient
is written as the source is read, in one pass (sum_k a_k gs_k would take a pass of its own).

Why: the eager route is memory-bound, a chain of passes over [B, T, d] per source in each direction.
Here the forward reads each source once and writes the mix; the backward reads g, the mix and each
source once and writes each source's gradient. Nothing [B, T, d]-sized is saved beyond the mix
(one tensor per route, the size of one source): per token, one float32 log-sum-exp. Logits and inverse
RMS are recomputed in the backward from the source it reads anyway (a few flops, no extra bytes).
All math is float32; sources may be stored in bfloat16 (half the bytes).

Two routes over the same sources (rd's Q/K route and value route of a layer) run as one: each source
is loaded once and feeds two running softmaxes forward; backward, both routes' parts of dL/ds_i are
added in registers and written once. Two separate routes would read every source twice each way and
write two gradients per source, which autograd then adds up: (3m + 6) elements of B T d moved per
pair, against (9m + 6).

fused_route(query, sources[, query2]) is the entry point; it calls the custom op nanoattnres::route,
so torch.compile sees one node per route (or pair). model.reference_route is the definition it is tested against
(tests/test_route_kernels.py); `python route_kernels.py` times it on a GPU against its byte floor, and
`python route_kernels.py --compile_for=90` compiles it for a GPU on any machine and reports what the
GPU would run (registers, spills, barriers, vector widths).
"""

import contextlib
import os
import re
import time
import types
from typing import List, Sequence  # typing's, not collections.abc's or list[]: torch 2.4's custom_op infers schemas from these only

import torch

from model import ROUTING_RMS_EPS

try:
    import triton
    import triton.language as tl
    # the sources reach the kernels as one tuple argument (see bucket), which Triton has from 3.3 on;
    # CUDA builds of older torch bring older Tritons: they take the plain route
    HAVE_TRITON = tuple(int(v) for v in triton.__version__.split(".")[:2]) >= (3, 3)
except ImportError:  # the module still imports (the op registers, available() says False); the kernels are never called
    HAVE_TRITON = False
    triton = types.SimpleNamespace(jit=lambda fn: fn, next_power_of_2=None, cdiv=None)
    tl = types.SimpleNamespace(constexpr=None)

DTYPES = (torch.float32, torch.bfloat16)  # source dtypes the kernels are tested with
# A program's tile: BLOCK_T tokens x BLOCK_D >= d features, TILE_ELEMENTS in all over NUM_WARPS warps
# (32 float32 values per thread of each tile-sized temporary). Compiled by Triton 3.6 for sm_90 at
# d = 768 with 25 sources, this is 115 registers in the forward and 128 in the backward, no spills:
# 4 programs (16 warps) per multiprocessor, 24 kB of loads in flight. Each token's features span all
# 4 warps, so its sums cross warps through shared memory: about 6 barriers per source slot forward,
# 9 backward. A one-warp tile (1024:1) needs none, at 90-92 registers forward and 128 backward. Not
# yet timed against each other on a GPU (`python route_kernels.py --tiles=1024:1` does);
# `--compile_for=90` prints these counts on any machine.
TILE_ELEMENTS = 4096
NUM_WARPS = 4
# PREFETCH: each slot issues the next source's load before its own sums, so two sources are in flight a
# program. At 4096:4 the next load then overlaps this source's barriers; with one warp, ptxas places it
# late in the slot anyway (`--compile_for=90 --sass=DIR` writes the machine code). Off until a GPU times it (4096:4:prefetch).
PREFETCH = False
# rd's two routes in one pass hold twice a route's state per token: at 1024:1 the paired backward compiles to
# 240 registers, one route's to 128. So pairs may run best at a tile of their own: PAIRED_TILE, (elements,
# warps, prefetch), or None for the tile above (tools/gpu_check.sh times both; bench.py --paired_route_tile).
PAIRED_TILE = None
# tools/gpu_check.sh benches the model with the fastest tile of its route benchmark (fastest_tile), where
# another tile beats the default by this much or more: a smaller gain could be the timer's noise
FASTER_BY = 0.03
MAX_BLOCK_T = 16  # at small d, still several programs (and at test sizes, several tiles)
MAX_TOKENS = 2 ** 30  # token indices are int32, and a pair's second lse row starts n_tokens past its first


MIN_CAPABILITY = (7, 0)  # Triton compiles for Volta and newer; a P100 (6.0), say, takes the plain route
# the compute capabilities (times ten) of NVIDIA's GPUs from Volta on: --compile_for takes these only, as
# LLVM aborts the process on a number that names no GPU (95, say)
CUDA_CAPABILITIES = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


def available(device):
    """Whether fused_route can run on `device`: Triton on a CUDA GPU it compiles for, or Triton's interpreter
    on the CPU (TRITON_INTERPRET=1, set before this module is imported: see interpreted)."""
    device = torch.device(device)
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY
    return device.type == "cpu" and interpreted()


def interpreted():
    """Whether the kernels run in Triton's interpreter: Triton reads TRITON_INTERPRET as each kernel is
    defined, when this module is imported, not as it runs; set later, it changes nothing."""
    return HAVE_TRITON and not isinstance(_route_fwd_kernel, triton.runtime.jit.JITFunction)


def why_unavailable(device):
    """Why available(device) is False, as what to do about it."""
    if "triton" not in globals() or isinstance(triton, types.SimpleNamespace):
        return "Triton is not installed (pip install triton; CUDA builds of torch bring it)"
    if not HAVE_TRITON:
        return f"Triton {triton.__version__} is older than 3.3, which the kernels need (pip install -U triton)"
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return (f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}, and Triton compiles "
                f"for {'.'.join(map(str, MIN_CAPABILITY))} and newer: use the plain route (fused_route=False)")
    return (f"Triton runs on CUDA GPUs, and on the CPU only in its interpreter (TRITON_INTERPRET=1 before route_kernels "
            f"is imported); on {device} use the plain route (fused_route=False)")


def bucket(m):
    """The number of source slots a kernel is compiled for: m rounded up to a power of two.

    The sources reach the kernel as one tuple argument, padded to this size with sources[0], and the
    real count m as a runtime int: the kernel loops over the slots with tl.static_range and skips
    slot i >= m with a runtime `if`, so the padding is never read. A model whose routes read 1..25
    sources compiles 6 variants per direction and width, not 25 (times Triton's own specialisations,
    such as whether the token count is a multiple of 16), with no stack or concatenation of the
    sources (a per-route stack would copy every source, and keep the copies for backward).
    Tuples of pointers as kernel arguments: checked with Triton 3.6 (the GPUs' version; compiled for
    sm_90 and in the interpreter) and 3.9. Unlike a table of pointers in memory, they also run in the
    interpreter, and unlike a fixed number of pointer arguments they need no chained launches.
    """
    return triton.next_power_of_2(m)


# -----------------------------------------------------------------------------
# The kernels

@triton.jit
def _logit(s, r, w):
    return r * tl.sum(s * w[None, :], axis=1)  # logit_i = r_i (s_i . w), per token of the tile


@triton.jit
def _slot_mask(rows, i, m):
    """[BLOCK_T] of (i < m): slot i holds a source, the same for every token. A tensor, not a scalar
    condition: a runtime branch around a load lets the compiler move the load back down to its use, and
    the interpreter rejects a scalar in a load's mask."""
    return tl.full(rows.shape, i, tl.int32) < m


@triton.jit
def _softmax_accumulate(logit, s, run_max, run_sum, acc):
    """One source into a running softmax-weighted sum: the new (max, sum of exp(logit - max), sum of
    exp(logit - max) s), both sums relative to the running max, rescaled whenever it grows."""
    new_max = tl.maximum(run_max, logit)
    rescale = tl.exp(run_max - new_max)  # 0 at the first source (run_max = -inf)
    p = tl.exp(logit - new_max)
    return new_max, run_sum * rescale + p, acc * rescale[:, None] + p[:, None] * s


@triton.jit
def _route_fwd_kernel(
    sources,  # tuple of NB pointers, each to an [N, D] source (slots >= m pad with the first)
    mix_ptr, mix2_ptr,  # [N, D] out, the sources' dtype (mix2: the second route's, PAIRED only)
    lse_ptr,  # [NQ, N] out, float32: log-sum-exp of the logits: with the logits it recomputes, the backward's a_i
    query_ptr,  # [NQ, D]: NQ = 2 routes over the same sources when PAIRED, else 1
    m, n_tokens,
    # the floats are constexpr: a Python float passed as a runtime argument becomes float64 under Inductor
    D: tl.constexpr, EPS: tl.constexpr, INV_D: tl.constexpr, PAIRED: tl.constexpr, PREFETCH: tl.constexpr,
    NB: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_tokens
    mask = row_ok[:, None] & (cols < D)[None, :]
    offs = rows[:, None].to(tl.int64) * D + cols[None, :]  # int64: N * D can pass 2^31
    # rows past n_tokens and columns past D (BLOCK_D pads D to a power of two) load zeros: they add nothing to
    # |s|^2 or s . w (INV_D is 1 / D, not 1 / BLOCK_D), and none of their mix or lse is stored
    w = tl.load(query_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    w2 = w
    if PAIRED:
        w2 = tl.load(query_ptr + D + cols, mask=cols < D, other=0.0).to(tl.float32)

    # online softmax over the sources: running max, running sum of exp, running weighted sum (per route)
    run_max = tl.full([BLOCK_T], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_T], tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    run_max2, run_sum2, acc2 = run_max, run_sum, acc
    if PREFETCH:
        s_next = tl.load(sources[0] + offs, mask=mask, other=0.0)
    for i in tl.static_range(NB):
        # padded slots are skipped, never read. Slot 0 always holds a source (m >= 1) and runs outside the
        # runtime branch: the compiler then moves w into the sources' register layout there, once, not in
        # every slot's branch (it cost 2 barriers a slot at the default tile with bfloat16 sources)
        if (i == 0) or (i < m):
            if PREFETCH:  # the next source's load is issued before this one's sums: two in flight
                s = s_next.to(tl.float32)
                if i + 1 < NB:  # past m the slot pads with sources[0]: the mask only saves the read
                    s_next = tl.load(sources[i + 1] + offs, mask=mask & _slot_mask(rows, i + 1, m)[:, None], other=0.0)
            else:
                s = tl.load(sources[i] + offs, mask=mask, other=0.0).to(tl.float32)
            r = tl.rsqrt(tl.sum(s * s, axis=1) * INV_D + EPS)  # r_i = (|s_i|^2 / d + eps)^(-1/2)
            run_max, run_sum, acc = _softmax_accumulate(_logit(s, r, w), s, run_max, run_sum, acc)
            if PAIRED:  # the second route reads the source already loaded: one pass over the sources for both
                run_max2, run_sum2, acc2 = _softmax_accumulate(_logit(s, r, w2), s, run_max2, run_sum2, acc2)
    mix = acc / run_sum[:, None]  # sum_i a_i s_i, a_i = exp(logit_i - max) / sum_k exp(logit_k - max)
    tl.store(mix_ptr + offs, mix.to(mix_ptr.dtype.element_ty), mask=mask)
    tl.store(lse_ptr + rows, run_max + tl.log(run_sum), mask=row_ok)  # a_i = exp(logit_i - lse)
    if PAIRED:
        tl.store(mix2_ptr + offs, (acc2 / run_sum2[:, None]).to(mix2_ptr.dtype.element_ty), mask=mask)
        tl.store(lse_ptr + n_tokens + rows, run_max2 + tl.log(run_sum2), mask=row_ok)


@triton.jit
def _route_part_grad(s, r, w, g, gmix, lse, INV_D: tl.constexpr):
    """One route's part of dL/ds_i for the tile, and of dL/dw (summed over the tile's tokens)."""
    logit = _logit(s, r, w)
    a = tl.exp(logit - lse)  # a_i
    delta = a * (tl.sum(g * s, axis=1) - gmix)  # delta_i = a_i (g . s_i - g . mix)
    delta_r = delta * r
    # dL/ds_i = a_i g + delta_i r_i (w - logit_i r_i s_i / d);   dL/dw += delta_i r_i s_i
    ds = a[:, None] * g + delta_r[:, None] * (w[None, :] - (logit * r * INV_D)[:, None] * s)
    return ds, tl.sum(delta_r[:, None] * s, axis=0)


@triton.jit
def _route_bwd_kernel(
    grad_ptr, mix_ptr, grad2_ptr, mix2_ptr,  # g and mix [N, D] of each route (2: PAIRED only)
    lse_ptr, query_ptr,  # lse [NQ, N], w [NQ, D]
    sources, grads,  # tuples of NB pointers: the sources [N, D] and their gradients [N, D] (out)
    dw_ptr,  # [NQ, tiles, D] out, float32: each tile's part of dL/dw, summed by the caller (no atomics)
    m, n_tokens,
    D: tl.constexpr, EPS: tl.constexpr, INV_D: tl.constexpr, PAIRED: tl.constexpr, PREFETCH: tl.constexpr,
    NB: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_tokens
    col_ok = cols < D
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * D + cols[None, :]
    # masked rows load zeros (s, g, mix; lse = 0), so a_i = 1 and delta_i = 0 there; masked columns of s, w and
    # g load zeros, which add nothing to any sum and give 0 in ds and dw there: no NaN, no stray dw
    w = tl.load(query_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    gmix = tl.sum(g * tl.load(mix_ptr + offs, mask=mask, other=0.0).to(tl.float32), axis=1)  # g . mix
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    dw = tl.zeros([BLOCK_D], tl.float32)
    w2, g2, gmix2, lse2, dw2 = w, g, gmix, lse, dw  # route 2's: dw2 starts at 0, the rest are loaded when PAIRED
    if PAIRED:
        w2 = tl.load(query_ptr + D + cols, mask=col_ok, other=0.0).to(tl.float32)
        g2 = tl.load(grad2_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        gmix2 = tl.sum(g2 * tl.load(mix2_ptr + offs, mask=mask, other=0.0).to(tl.float32), axis=1)
        lse2 = tl.load(lse_ptr + n_tokens + rows, mask=row_ok, other=0.0)
    if PREFETCH:
        s_next = tl.load(sources[0] + offs, mask=mask, other=0.0)
    for i in tl.static_range(NB):
        if (i == 0) or (i < m):  # as in the forward: slot 0 outside the branch
            if PREFETCH:  # as in the forward
                s = s_next.to(tl.float32)
                if i + 1 < NB:  # past m the slot pads with sources[0]: the mask only saves the read
                    s_next = tl.load(sources[i + 1] + offs, mask=mask & _slot_mask(rows, i + 1, m)[:, None], other=0.0)
            else:
                s = tl.load(sources[i] + offs, mask=mask, other=0.0).to(tl.float32)
            r = tl.rsqrt(tl.sum(s * s, axis=1) * INV_D + EPS)  # r_i, recomputed as in the forward
            ds, dw_i = _route_part_grad(s, r, w, g, gmix, lse, INV_D)
            dw += dw_i
            if PAIRED:  # both routes' parts summed here: one gradient written per source, not two to add up
                ds2, dw2_i = _route_part_grad(s, r, w2, g2, gmix2, lse2, INV_D)
                ds += ds2
                dw2 += dw2_i
            tl.store(grads[i] + offs, ds.to(grads[i].dtype.element_ty), mask=mask)
    # int64 as the sources' offsets: partials are [NQ, programs, D], and a pair at one token a program passes
    # 2^31 elements where 2 N D does (N = 524k tokens at d = 2048)
    tl.store(dw_ptr + pid.to(tl.int64) * D + cols, dw, mask=col_ok)
    if PAIRED:
        tl.store(dw_ptr + (tl.num_programs(0) + pid).to(tl.int64) * D + cols, dw2, mask=col_ok)


# -----------------------------------------------------------------------------
# Launches

def _padded(tensors):
    return tuple(tensors) + (tensors[0],) * (bucket(len(tensors)) - len(tensors))


def tile_for(routes):
    """(tile elements, warps, prefetch) of a launch over 1 route or 2 paired: PAIRED_TILE for a pair, where set."""
    return PAIRED_TILE if routes == 2 and PAIRED_TILE else (TILE_ELEMENTS, NUM_WARPS, PREFETCH)


def _launch(sources, routes):
    """The grid (one program per tile), the token count and the compile-time arguments for these sources
    and this many routes over them (1, or 2 paired)."""
    d = sources[0].size(-1)
    n = sources[0].numel() // d
    block_d = triton.next_power_of_2(d)
    # a paired program keeps two routes' state per token (two weighted sums forward, two output
    # gradients backward): half the tokens a program (down to one) to hold its registers down
    tile_elements, num_warps, prefetch = tile_for(routes)
    block_t = max(1, min(MAX_BLOCK_T, tile_elements // (block_d * routes)))
    constants = dict(D=d, EPS=ROUTING_RMS_EPS, INV_D=1.0 / d, PAIRED=routes == 2, PREFETCH=prefetch, NB=bucket(len(sources)),
                     BLOCK_T=block_t, BLOCK_D=block_d, num_warps=num_warps)
    return (triton.cdiv(n, block_t),), n, constants


def _on(device):
    """Triton launches on the current CUDA device: make it the tensors' own (cuda:1 in sample.py, say)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _rows(tensors):
    """Each tensor as the kernels index it, row-major ([N, d], row stride d). fused_route passes contiguous
    tensors, so this copies nothing there; but the ops also run on what a compiler hands them (torch before 2.8
    let Inductor choose a custom op's input strides), and outputs made like a permuted input would be permuted."""
    return [t.contiguous() for t in tensors]


def _empty_rows(tensor):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _forward(queries, sources):
    queries, sources = queries.contiguous(), _rows(sources)
    s0 = sources[0]
    mixes = [_empty_rows(s0) for _ in queries]
    lse = torch.empty(len(queries), *s0.shape[:-1], device=s0.device, dtype=torch.float32)
    grid, n, constants = _launch(sources, len(queries))
    if n > 0:
        with _on(s0.device):
            _route_fwd_kernel[grid](_padded(sources), mixes[0], mixes[-1], lse, queries, len(sources), n, **constants)
    return mixes, lse


def _backward(grads_out, mixes, lse, queries, sources):
    queries, lse, mixes, sources, g = queries.contiguous(), lse.contiguous(), _rows(mixes), _rows(sources), _rows(grads_out)
    grads = [_empty_rows(s) for s in sources]
    grid, n, constants = _launch(sources, len(queries))
    if n == 0:
        return torch.zeros_like(queries), grads
    # One tile per program, each writing its own row of dL/dw partials: d floats written and summed per
    # tile of (2m + 2) BLOCK_T d elements, 1 / (2 (m + 1)) more bytes at d = 768 in bf16. A program that
    # looped over several tiles (fewer partials) compiled to 200+ registers at 25 sources: the compiler
    # keeps all 64 source and gradient pointers live across the loop.
    dw = torch.empty(len(queries), grid[0], queries.size(-1), device=queries.device, dtype=torch.float32)
    with _on(queries.device):
        _route_bwd_kernel[grid](g[0], mixes[0], g[-1], mixes[-1], lse, queries, _padded(sources), _padded(grads), dw,
                                len(sources), n, **constants)
    return dw.sum(dim=1).to(queries.dtype), grads  # a fixed-order reduction of fixed-shape partials: deterministic


# -----------------------------------------------------------------------------
# The custom ops: one graph node per route (or pair of routes) for torch.compile, and autograd around it

def _check_sources(sources):
    """One or more sources of one shape, dtype and device: what the kernels index (the op and fused_route)."""
    if not sources:
        raise ValueError("nanoattnres::route takes one or more sources of one shape and dtype: got none")
    s0 = sources[0]
    if s0.dim() == 0 or s0.size(-1) == 0:
        raise ValueError(f"nanoattnres::route takes sources [..., d] with d >= 1 features: got {tuple(s0.shape)}")
    if s0.numel() // s0.size(-1) > MAX_TOKENS:
        raise ValueError(f"nanoattnres::route takes at most 2^30 tokens a call (its token indices are int32): got "
                         f"{s0.numel() // s0.size(-1):,}; route fewer tokens at a time")
    for s in sources:
        if s.shape != s0.shape or s.dtype != s0.dtype or s.device != s0.device:
            raise ValueError(f"nanoattnres::route takes one or more sources of one shape and dtype, on one device: "
                             f"{tuple(s.shape)} {s.dtype} {s.device} against {tuple(s0.shape)} {s0.dtype} {s0.device}")


def _check_op_inputs(queries, sources):
    """The op's own checks (fused_route's on the queries are friendlier): the kernels would read past a
    narrower query, and write the mixes of the first two queries only."""
    _check_sources(sources)
    if queries.dim() != 2 or queries.size(0) not in (1, 2) or queries.size(1) != sources[0].size(-1):
        raise ValueError(f"nanoattnres::route takes 1 or 2 queries as wide as the sources ({sources[0].size(-1)}), "
                         f"not {tuple(queries.shape)}")


@torch.library.custom_op("nanoattnres::route", mutates_args=())
def _route_op(queries: torch.Tensor, sources: Sequence[torch.Tensor]) -> tuple[List[torch.Tensor], torch.Tensor]:
    """([mix per query], lse [queries, ...]): the routes of queries [1 or 2, d] over the same sources, and
    their per-token log-sum-exps, kept for the backward."""
    if not HAVE_TRITON:
        raise RuntimeError(f"nanoattnres::route cannot run: {why_unavailable(queries.device)}")  # no Triton, or too old
    _check_op_inputs(queries, sources)
    return _forward(queries, sources)


@_route_op.register_fake
def _(queries, sources):
    _check_op_inputs(queries, sources)
    s0 = sources[0]
    return [_empty_rows(s0) for _ in queries], s0.new_empty(len(queries), *s0.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("nanoattnres::route_backward", mutates_args=())
def _route_backward_op(grads: Sequence[torch.Tensor], mixes: Sequence[torch.Tensor], lse: torch.Tensor,
                       queries: torch.Tensor, sources: Sequence[torch.Tensor]) -> tuple[torch.Tensor, List[torch.Tensor]]:
    """(dL/dw per query, [dL/ds_i]) from each route's g = dL/dmix, the forward's outputs and its inputs."""
    return _backward(grads, mixes, lse, queries, sources)


@_route_backward_op.register_fake
def _(grads, mixes, lse, queries, sources):
    return torch.empty_like(queries, memory_format=torch.contiguous_format), [_empty_rows(s) for s in sources]


def _setup_context(ctx, inputs, output):
    queries, sources = inputs
    mixes, lse = output
    ctx.routes = len(mixes)
    ctx.save_for_backward(queries, lse, *mixes, *sources)  # references to tensors autograd keeps anyway, no copies
    ctx.mark_non_differentiable(lse)


def _route_op_backward(ctx, grad_mixes, grad_lse):
    queries, lse, *rest = ctx.saved_tensors
    mixes, sources = rest[:ctx.routes], rest[ctx.routes:]
    # (a mix the loss does not use arrives as zeros, not None: autograd materialises the gradients of unused outputs)
    return _route_backward_op(grad_mixes, mixes, lse, queries, sources)


_route_op.register_autograd(_route_op_backward, setup_context=_setup_context)


def fused_route(query, sources, query2=None):
    """sum_i a_i s_i with a = softmax_i(w . rmsnorm(s_i)), per token: model.reference_route, fused.

    query: the route's pseudo-query w, [d]. sources: m >= 1 contiguous [B, T, d] tensors of one
    dtype (float32 or bfloat16) on one device. Returns the mix, [B, T, d], in the sources' dtype;
    the math inside is float32. Differentiable in the query and every source.
    query2: a second route over the same sources (rd's value route beside its Q/K route), computed in
    the same pass: each source is read once for both routes, and its gradient written once, where two
    routes would read it twice and leave two gradients to add up. Returns (mix, mix2) then.
    """
    sources = list(sources)
    _check_sources(sources)
    s0 = sources[0]
    if not all(s.is_contiguous() for s in sources):
        raise ValueError("fused_route: sources must be contiguous")
    if s0.dtype not in DTYPES:
        raise ValueError(f"fused_route: sources are {s0.dtype}, supported are {DTYPES}")
    for q in (query, query2):
        if q is not None and (q.shape != s0.shape[-1:] or q.device != s0.device or q.dtype != query.dtype):
            raise ValueError(f"fused_route: a query is {tuple(q.shape)} {q.dtype} on {q.device}, sources need "
                             f"[{s0.size(-1)}] on {s0.device} (both queries of one dtype)")
    if query2 is None:
        return _route_op(query.contiguous()[None], sources)[0][0]
    mix, mix2 = _route_op(torch.stack([query, query2]), sources)[0]
    return mix, mix2


# -----------------------------------------------------------------------------
# Timing against the byte floor (GPU only)

@contextlib.contextmanager
def tile_shape(tile_elements, num_warps, prefetch=False, paired=None):
    """Launch the kernels with another tile (TILE_ELEMENTS over NUM_WARPS warps, PREFETCH) inside the block;
    paired routes with `paired`, (elements, warps, prefetch), or with that same tile where None."""
    global TILE_ELEMENTS, NUM_WARPS, PREFETCH, PAIRED_TILE
    saved = TILE_ELEMENTS, NUM_WARPS, PREFETCH, PAIRED_TILE
    TILE_ELEMENTS, NUM_WARPS, PREFETCH, PAIRED_TILE = tile_elements, num_warps, prefetch, paired
    try:
        yield
    finally:
        TILE_ELEMENTS, NUM_WARPS, PREFETCH, PAIRED_TILE = saved


def tile_name(tile_elements, num_warps, prefetch=False):
    return f"{tile_elements}:{num_warps}" + (":prefetch" if prefetch else "")


def parse_tiles(spec):
    """'4096:4,1024:1:prefetch' -> [(4096, 4, False), (1024, 1, True)]: tile elements (a power of two),
    warps per program, and whether each source's load is issued before the previous one's sums."""
    tiles = []
    for item in filter(None, spec.split(",")):
        fields = item.split(":")
        try:
            elements, warps = int(fields[0]), int(fields[1])
            if fields[2:] not in ([], ["prefetch"]):
                raise ValueError
        except (ValueError, IndexError):
            raise ValueError(f"--tiles item {item!r}: write ELEMENTS:WARPS or ELEMENTS:WARPS:prefetch, e.g. 4096:4") from None
        if elements < 1 or elements & (elements - 1) or warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"--tiles item {item!r}: elements must be a power of two, warps 1, 2, 4, 8 or 16")
        tiles.append((elements, warps, fields[2:] == ["prefetch"]))
    return tiles


def benchmark_route(m=25, B=16, T=1024, d=768, dtype=torch.bfloat16, tiles=(), device="cuda", timer=None):
    """Forward and forward+backward of fused_route against the plain route in eager PyTorch, on CUDA.

    The byte floor: the forward must read m sources and write the mix, (m + 1) B T d elements; the
    backward must read g, the mix and m sources and write m gradients, (2m + 2) B T d elements.
    GB/s below is that floor divided by the measured time; the ceiling is a plain copy of as many
    bytes, timed beside it. Also timed: two routes over the sources in one pass (fused_route's query2,
    rd's layout) against two fused routes. tiles: other (tile elements, warps, prefetch) to time the fused
    route and the pair with; the fastest of each: fastest_tile, fastest_paired_tile.
    timer(fn) -> milliseconds a call, triton.testing.do_bench by default (CUDA only); the tests pass
    another to run all of this on the CPU, in the interpreter.
    """
    from common import device_name
    from model import reference_route
    if timer is None:
        assert torch.cuda.is_available(), "benchmark_route needs a CUDA GPU (or a timer of its own)"
        timer = triton.testing.do_bench
    torch.manual_seed(0)
    sources = [torch.randn(B, T, d, device=device, dtype=dtype, requires_grad=True) for _ in range(m)]
    query = (torch.randn(d, device=device) / d ** 0.5).requires_grad_()
    grad = torch.randn(B, T, d, device=device, dtype=dtype)
    element = torch.empty((), dtype=dtype).element_size()
    floor_fwd = (m + 1) * B * T * d * element
    floor_bwd = (2 * m + 2) * B * T * d * element

    query2 = (torch.randn(d, device=device) / d ** 0.5).requires_grad_()

    def fwd_bwd(route):
        def run():
            mixes = route(query, sources)
            mixes = mixes if isinstance(mixes, tuple) else (mixes,)
            torch.autograd.grad(mixes, [query, *sources], (grad,) * len(mixes))
        return run

    def eager(w, sources):  # the plain route, all in the sources' dtype (a float32 query would not multiply bf16 keys)
        return reference_route(w.to(sources[0].dtype), sources)

    result = dict(m=m, shape=[B, T, d], dtype=str(dtype), gpu=device_name(str(device)), torch=torch.__version__,
                  triton=triton.__version__, floor_bytes_fwd=floor_fwd, floor_bytes_fwd_bwd=floor_fwd + floor_bwd)
    print(f"route: m={m} sources of [{B}, {T}, {d}] {dtype}, {result['gpu']}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    start = time.perf_counter()
    fwd_bwd(fused_route)()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    result["first_call_s"] = time.perf_counter() - start
    print(f"first call (compiles bucket {bucket(m)} both ways, unless cached): {result['first_call_s']:.1f} s")
    src = torch.empty(floor_fwd // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t_copy = timer(lambda: dst.copy_(src))  # reads half the forward's floor, writes the other half
    result["copy_gb_s"] = floor_fwd / t_copy / 1e6
    print(f"  copy: {floor_fwd / 1e6:.0f} MB moved in {t_copy:.3f} ms ({result['copy_gb_s']:6.0f} GB/s, the ceiling)")

    def time_route(name, route, floor_fwd=floor_fwd, floor_bwd=floor_bwd):
        with torch.no_grad():
            t_fwd = timer(lambda: route(query, sources))
        t_all = timer(fwd_bwd(route))
        print(f"{name:>15}: forward {t_fwd:7.3f} ms ({floor_fwd / t_fwd / 1e6:6.0f} GB/s)   "
              f"forward+backward {t_all:7.3f} ms ({(floor_fwd + floor_bwd) / t_all / 1e6:6.0f} GB/s)")
        return dict(fwd_ms=t_fwd, fwd_bwd_ms=t_all, fwd_gb_s=floor_fwd / t_fwd / 1e6,
                    fwd_bwd_gb_s=(floor_fwd + floor_bwd) / t_all / 1e6)

    for name, route in (("fused", fused_route), ("eager", eager)):
        result[name] = time_route(name, route)
    # rd's two routes over the same sources: paired in one pass, against two fused routes. GB/s against the
    # pair's floor: forward m sources read, 2 mixes written; backward 2 g, 2 mixes, m sources read, m written
    floor_pair = ((m + 2) * B * T * d * element, (2 * m + 4) * B * T * d * element)
    result["floor_bytes_pair_fwd_bwd"] = sum(floor_pair)

    def paired(w, s):
        return fused_route(w, s, query2)

    fwd_bwd(paired)()  # the paired kernels compile here
    for name, route in (("paired", paired), ("2 routes", lambda w, s: (fused_route(w, s), fused_route(query2, s)))):
        result[name.replace(" ", "_")] = time_route(name, route, *floor_pair)
    speedup = result["2_routes"]["fwd_bwd_ms"] / result["paired"]["fwd_bwd_ms"]
    print(f"  paired: {speedup:.2f}x the speed of two routes, forward+backward")
    # A pair holds twice a route's state per token (at 1024:1 the paired backward compiles to 240 registers, one
    # route's to 128), so the tile that suits one route may not suit two: the pair is timed at every tile as well,
    # and runs at its own fastest. Each tile compiles its own kernels at its first call (or finds them compiled
    # by warm_route, as tools/gpu_check.sh does it, beside its tests).
    result["tiles"], result["paired_tiles"] = [], []
    for elements, warps, prefetch in tiles:
        tile = dict(tile=tile_name(elements, warps, prefetch), tile_elements=elements, num_warps=warps, prefetch=prefetch)
        with tile_shape(elements, warps, prefetch):
            fwd_bwd(fused_route)()
            fwd_bwd(paired)()
            result["tiles"].append(dict(tile, **time_route(tile["tile"], fused_route)))
            result["paired_tiles"].append(dict(tile, **time_route(f"paired {tile['tile']}", paired, *floor_pair)))
    result["default_tile"] = tile_name(*tile_for(1))
    result["default_paired_tile"] = tile_name(*tile_for(2))  # the same, unless PAIRED_TILE is set
    result["fastest_tile"] = fastest_tile(result)
    result["fastest_paired_tile"] = fastest_tile(result, paired=True)
    if tiles:
        for routes, key, default in (("one route", "fastest_tile", "default_tile"),
                                     ("paired", "fastest_paired_tile", "default_paired_tile")):
            print(f"  fastest forward+backward, {routes}: {result[key]}"
                  f"{' (the default)' if result[key] == result[default] else ''}")
    return result


def fastest_tile(result, margin=FASTER_BY, paired=False):
    """The tile whose forward+backward was fastest in a benchmark_route result, for one route (or for the
    paired routes): another tile than the default only when it beat the default's time by `margin` (a
    fraction) or more, not by timing noise."""
    timed, at_default, default = ((result["paired_tiles"], result["paired"], result["default_paired_tile"]) if paired
                                  else (result["tiles"], result["fused"], result["default_tile"]))
    best = min(timed, key=lambda t: t["fwd_bwd_ms"], default=None)
    if best is not None and best["fwd_bwd_ms"] <= (1 - margin) * at_default["fwd_bwd_ms"]:
        return best["tile"]
    return default


def warm_route(m=25, d=768, dtype=torch.bfloat16, tiles=(), device="cuda", default=True):
    """Compile, without timing, the kernels of every route over 1 to m sources of width d: one route and two
    paired, forward and backward, at the default tiles and at each of `tiles`. That is what
    benchmark_route(m=m, d=d, dtype=dtype, tiles=tiles) launches, and what a model whose routes read at most
    m sources launches at any of those tiles (a 12-layer model per sublayer: 1 to 25, tools/gpu_check.sh's
    bench part). Each launches once over 16 tokens. Triton compiles a kernel for its compile-time arguments
    (tile, bucket, width), the dtypes, whether each int is 1 or a multiple of 16 and each pointer 16-byte
    aligned (PyTorch's allocations always are), not for the ints themselves: 16 tokens and the benchmark's
    16 x 1024 get the same code, and so do 9 and 15 sources (bucket 16), but not 16, a multiple of 16.
    Launching every count covers these rules without restating them, and costs a launch where a count
    compiles nothing new. Triton's cache on disk then serves the later processes' first calls.
    tools/gpu_check.sh runs this beside the tests, so the timed parts, alone on the GPU, compile nothing: a
    process per tile, all at once, the default tile in one of them (default=False in the others)."""
    torch.manual_seed(0)
    sources = [torch.randn(1, 16, d, device=device, dtype=dtype, requires_grad=True) for _ in range(m)]
    query, query2 = (torch.randn(d, device=device, requires_grad=True) for _ in range(2))

    def one_and_a_pair():
        for count in range(1, m + 1):
            read = sources[:count]
            mixes = (fused_route(query, read), *fused_route(query, read, query2))
            torch.autograd.grad(mixes, [query, query2, *read], [torch.ones_like(mix) for mix in mixes])

    start = time.perf_counter()
    if default:
        one_and_a_pair()  # the default tile, and the pair's own where PAIRED_TILE is set
    for tile in tiles:
        with tile_shape(*tile):
            one_and_a_pair()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    names = [tile_name(*tile) for tile in tiles]
    if default:
        names.insert(0, tile_name(*tile_for(1)))
        if tile_for(2) != tile_for(1):
            names.append(f"the pair's default {tile_name(*tile_for(2))}")
    print(f"route kernels for 1 to {m} sources of width {d} {dtype}, one route and a pair, both ways, at "
          f"{', '.join(names)}: compiled (or found in Triton's cache) in {time.perf_counter() - start:.1f} s")


# -----------------------------------------------------------------------------
# Compiling for a GPU on any machine

def _signature(kernel, constants, source_type, slots):
    """Triton's type for each of a kernel's arguments: the sources, their gradients, the mixes and g in the
    sources' dtype; queries, log-sum-exps and dL/dw partials float32; the source tuples `slots` long."""
    types = {}
    for name in kernel.arg_names:
        if name in constants:
            types[name] = "constexpr"
        elif name in ("sources", "grads"):
            types[name] = (source_type,) * slots
        elif name in ("m", "n_tokens"):
            types[name] = "i32"
        else:
            types[name] = "*fp32" if name in ("lse_ptr", "query_ptr", "dw_ptr") else source_type
    return types


def _launch_specialisation(kernel, types, ints):
    """What Triton's JIT would find at a launch and compile in: every pointer 16-byte aligned (as PyTorch
    allocates), and which ints are multiples of 16 (vectorised loads depend on both)."""
    aligned = [["tt.divisibility", 16]]
    attrs = {}
    for i, name in enumerate(kernel.arg_names):
        if isinstance(types[name], tuple):
            attrs.update({(i, j): aligned for j in range(len(types[name]))})
        elif types[name].startswith("*") or (name in ints and ints[name] % 16 == 0):
            attrs[(i,)] = aligned
    return attrs


def _cuobjdump(cubin, *flags):
    """What the cuobjdump Triton ships beside ptxas (or the CUDA toolkit's) says about a compiled binary."""
    import shutil
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump not found (Triton's NVIDIA backend ships it; or put the CUDA toolkit's on PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        run = subprocess.run([tool, *flags, path], capture_output=True, text=True)
        if run.returncode:  # (this cuobjdump does not read every architecture ptxas writes, e.g. sm_70)
            raise RuntimeError(f"cuobjdump cannot read this machine code: {(run.stderr.strip() or '?').splitlines()[0]}")
        return run.stdout


def compile_for_gpu(arch, m=25, d=768, dtype=torch.bfloat16, routes=1, backward=False, tokens=16 * 1024, sass_dir=None):
    """Compile one kernel as a launch over m sources of [tokens, d] would, for the CUDA compute capability
    `arch` (90: H100, H200; 80: A100), on this machine, GPU or not: Triton's compiler and the ptxas it
    ships, no driver. What the interpreter cannot tell: that the code compiles for the GPU, and what the
    GPU would run. Returns, from the compiled code:
    - registers per thread, and bytes per thread spilled to local memory (off-chip, slow): how many
      programs fit on a multiprocessor at once, so how many loads are in flight;
    - barriers: block-wide synchronisations (BAR.SYNC) in the machine code (a sum over features that
      spans several warps goes through shared memory between two of them; a one-warp program needs none);
    - the widths of the global loads and stores in bits, from the PTX (128: full 16-byte vectors);
    - int32_row_offsets: products by d computed in int32, from Triton's IR, where a row's offset x * d
      wraps past 2^31 elements: at N d >= 2^31 (2.8M tokens at d = 768) a wrong address, on a GPU only.
    sass_dir: also write the machine code there, one file per variant, to read where loads and barriers fall."""
    from common import first_line
    if interpreted():
        raise RuntimeError("compiling for a GPU needs Triton's compiler, not its interpreter: unset TRITON_INTERPRET")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    _, _, constants = _launch([torch.empty(1, d, dtype=dtype, device="meta")] * m, routes)
    num_warps = constants.pop("num_warps")
    kernel = _route_bwd_kernel if backward else _route_fwd_kernel
    source_type = {torch.float32: "*fp32", torch.bfloat16: "*bf16"}[dtype]
    start = time.perf_counter()
    types = _signature(kernel, constants, source_type, constants["NB"])
    attrs = _launch_specialisation(kernel, types, dict(m=m, n_tokens=tokens))
    try:
        compiled = triton.compile(ASTSource(kernel, types, constants, attrs), target=GPUTarget("cuda", arch, 32),
                                  options=dict(num_warps=num_warps))
    except Exception as e:  # ptxas or the backend refusing a real architecture (say sm_101, renamed sm_110 in CUDA 13)
        raise RuntimeError(f"Triton {triton.__version__} cannot compile for sm_{arch} here ({first_line(e)})") from None
    seconds = time.perf_counter() - start
    usage = _cuobjdump(compiled.asm["cubin"], "--dump-resource-usage")
    sass = _cuobjdump(compiled.asm["cubin"], "-sass")
    variant = dict(tile=tile_name(TILE_ELEMENTS, NUM_WARPS, PREFETCH), kernel="backward" if backward else "forward",
                   routes=routes, dtype=str(dtype).removeprefix("torch."))
    if sass_dir:  # e.g. 4096-4-prefetch_forward_1_bfloat16.sass
        os.makedirs(sass_dir, exist_ok=True)
        with open(os.path.join(sass_dir, "_".join(map(str, variant.values())).replace(":", "-") + ".sass"), "w") as f:
            f.write(sass)

    def count(field):
        return int(re.search(rf"\b{field}:(\d+)", usage).group(1))

    def widths(op):
        return sorted({int(vector or 1) * int(bits) for vector, bits in
                       re.findall(rf"\b{op}\.global(?:\.[\w:]+)*?(?:\.v(\d))?\.[bfsu](\d+)\b", compiled.asm["ptx"])})
    return dict(**variant, block_t=constants["BLOCK_T"], registers=count("REG"),
                spilled_bytes=count("LOCAL"), barriers=sass.count("BAR.SYNC"), load_bits=widths("ld"),
                store_bits=widths("st"), compile_s=round(seconds, 2),
                int32_row_offsets=int32_products_by(d, compiled.asm["ttir"]))


def int32_products_by(d, ttir):
    """How many int32 multiplies in Triton's IR take the constant d (a scalar, or a tensor of it: newer Tritons
    name it after the variable, `%offs = arith.constant dense<768> : tensor<16x1xi32>`)."""
    names = set(re.findall(rf"(%[\w.]+) = arith\.constant (?:{d} : i32|dense<{d}> : tensor<[\dx]+xi32>)", ttir))
    products = re.findall(r"= arith\.muli (%[\w.]+), (%[\w.]+) : (?:i32|tensor<[\dx]+xi32>)", ttir)
    return sum(a in names or b in names for a, b in products)


def _bits(widths):
    return "/".join(map(str, widths)) or "-"


def compile_report(arch, m=25, d=768, tiles=(), sass_dir=None):
    """Every kernel variant a model at this shape launches (forward and backward, one route and two paired,
    float32 and bfloat16 sources), compiled for `arch` at the default tile and at each of `tiles`."""
    print(f"compiling for sm_{arch} with Triton {triton.__version__} (no GPU used): "
          f"{m} sources (bucket {bucket(m)}) of width {d}")
    print("(compile s: Triton's own time for the variant; about 0 when its cache, TRITON_CACHE_DIR, already held it)")
    print(f"{'tile':>15} {'kernel':>9} {'routes':>6} {'sources':>8} {'tokens':>6} {'registers':>9} "
          f"{'spilled B':>9} {'barriers':>8} {'load bits':>9} {'store bits':>10} {'compile s':>9}")
    rows = []
    for tile in [(TILE_ELEMENTS, NUM_WARPS, PREFETCH), *tiles]:
        with tile_shape(*tile):
            for backward in (False, True):
                for routes in (1, 2):
                    for dtype in (torch.bfloat16, torch.float32):
                        row = compile_for_gpu(arch, m, d, dtype, routes, backward, sass_dir=sass_dir)
                        print(f"{row['tile']:>15} {row['kernel']:>9} {routes:>6} {row['dtype']:>8} {row['block_t']:>6} "
                              f"{row['registers']:>9} {row['spilled_bytes']:>9} {row['barriers']:>8} {_bits(row['load_bits']):>9} "
                              f"{_bits(row['store_bits']):>10} {row['compile_s']:>9.1f}")
                        rows.append(row)
    return dict(arch=arch, m=m, d=d, triton=triton.__version__, kernels=rows)


if __name__ == "__main__":
    import argparse
    import json

    from common import cannot_write, git_commit, write_atomic
    parser = argparse.ArgumentParser(description="Time one fused route against its byte floor and the eager route "
                                     "(CUDA); or, with --compile_for, compile the kernels for a GPU on any machine.")
    parser.add_argument("--m", type=int, default=25, help="sources (25: the output route of a 12-layer per-sublayer model)")
    parser.add_argument("--d", type=int, default=768, help="width of each source")
    parser.add_argument("--tiles", default="", help="also time (or compile) the fused route with these tiles, "
                        "ELEMENTS:WARPS[:prefetch],... (prefetch: each source's load issued before the previous "
                        f"source's sums; default tile: {tile_name(TILE_ELEMENTS, NUM_WARPS, PREFETCH)})")
    parser.add_argument("--warm", action="store_true", help="compile, don't time: the kernels of every route over 1 "
                        "to --m sources (one route and a pair, both ways, at the default tile and each of --tiles), what "
                        "the benchmark and a model's routes launch, into Triton's cache, where later runs find them (CUDA)")
    parser.add_argument("--only_tiles", action="store_true", help="with --warm: only --tiles, not the default tile "
                        "(for processes that warm tiles at once, one of them the default)")
    parser.add_argument("--compile_for", type=int, metavar="ARCH", help="no timing, no GPU needed: compile every kernel "
                        "variant for this CUDA compute capability (90: H100, H200) and print registers and spills")
    parser.add_argument("--sass", metavar="DIR", help="with --compile_for: also write each variant's machine code to DIR")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    try:
        tiles = parse_tiles(args.tiles)
    except ValueError as e:
        parser.error(str(e))
    if args.m < 1 or args.d < 1:
        parser.error("--m and --d must be at least 1")
    if args.warm and args.compile_for is not None:
        parser.error("--warm compiles on this machine's GPU, --compile_for for another: pass one of them")
    if args.warm and args.json:
        parser.error("--warm times nothing, so it writes no --json: drop one of them")
    if args.only_tiles and not (args.warm and tiles):
        parser.error("--only_tiles warms --tiles without the default tile: pass it with --warm and --tiles")
    if args.compile_for is not None and args.compile_for not in CUDA_CAPABILITIES:
        parser.error(f"--compile_for={args.compile_for}: give a GPU's compute capability times ten, one of "
                     f"{', '.join(map(str, CUDA_CAPABILITIES))} (80: A100; 90: H100, H200)")
    if args.sass and os.path.exists(args.sass) and not os.path.isdir(args.sass):
        parser.error(f"--sass={args.sass} is a file: give a folder for the machine code")
    if args.json:  # found unwritable only after the work, the timings would be lost
        problem = cannot_write(args.json)
        if problem:
            parser.error(f"cannot write --json {args.json}: {problem}")
    if not HAVE_TRITON:  # every part below calls Triton
        parser.exit(1, f"route_kernels.py: {why_unavailable('cuda')}\n")
    if args.compile_for is None and not torch.cuda.is_available():
        parser.exit(1, f"route_kernels.py: {'--warm compiles' if args.warm else 'timing runs'} on a CUDA GPU and "
                    "torch sees none: on this machine, --compile_for=ARCH compiles the kernels without one\n")
    if args.compile_for is not None:
        try:
            results = compile_report(args.compile_for, m=args.m, d=args.d, tiles=tiles, sass_dir=args.sass)
        except RuntimeError as e:
            parser.exit(1, f"route_kernels.py: {e}\n")
        commit, dirty = git_commit()
        results.update(commit=commit, dirty=dirty, date=time.strftime("%Y-%m-%d", time.gmtime()))
    elif args.warm:
        warm_route(m=args.m, d=args.d, tiles=tiles, default=not args.only_tiles)
        results = None
    else:
        results = benchmark_route(m=args.m, d=args.d, tiles=tiles)
    if args.json and results is not None:
        write_atomic(args.json, lambda f: f.write(json.dumps(results, indent=1).encode()))
