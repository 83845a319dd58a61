"""
route_kernels.fused_route against model.reference_route, the definition it fuses: forward, the query's and
every source's gradient, on a GPU when there is one, else on the CPU through Triton's interpreter.

Shapes are tiny (the interpreter runs each program in numpy) but cover the edges: widths 24, 33, 40
(not powers of two: masked feature columns), 26 and 150 tokens (2 and 10 tiles of 16, the last one
part-masked: the backward's per-tile dL/dw partials are summed), and 1 to 9 sources across
the kernel's power-of-two buckets (slots past m are padding the kernel must skip). Queries are random
and nonzero: a zero query gives uniform weights, which hide softmax and logit bugs.

Tolerances, relative to the largest magnitude of what is compared (the reference runs in float64):
- float32 sources: the kernel's sums (over d <= 40 features, m <= 9 sources, in another order than
  the reference's) round at float32's 6e-8; measured up to 7e-7 of the scale (these cases, 4 seeds,
  interpreter). Allowed: 1e-5.
- bfloat16 sources (float32 math, bfloat16 storage): the output is rounded once to 8 significant
  bits; the GPU rounds to nearest (2^-8 relative), the interpreter truncates (2^-7): allowed 2^-7 of
  the scale. The gradients also see the bfloat16-stored mix through g . mix, which enters
  delta_i = a_i (g . s_i - g . mix) as the difference of two dot products over d terms: measured up
  to 1.3% of the scale. Allowed: 3%. Dropping the rmsnorm's derivative from dL/ds_i (the smallest
  wrong kernel tried) is off by 8% to 24%; dropping g . mix, by 57% or more; r_i from dL/dw, by 18% or more.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")  # without a GPU, in the interpreter: conftest.py sets TRITON_INTERPRET=1 first

import route_kernels as kernels  # noqa: E402
from helpers import perturb_norms_and_biases, randomise_queries, tiny_config  # noqa: E402
from model import GPT, ROUTING_RMS_EPS, reference_route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]
CASES = [  # (m sources, B, T, d)
    (1, 2, 13, 24), (2, 2, 13, 33), (3, 2, 13, 40), (4, 2, 13, 24), (5, 2, 13, 33), (8, 2, 13, 24),
    (9, 2, 13, 40), (5, 3, 50, 24),
]


def make_route(m, B, T, d, dtype=torch.float32, seed=0):
    """A random route: sources at different scales (so the rmsnorm matters), a query whose logits have
    std ~1.5 (weights that choose, but not one-hot), and an output gradient."""
    g = torch.Generator().manual_seed(seed)
    sources = [(torch.randn(B, T, d, generator=g) * (0.5 + 2 * torch.rand(1, generator=g))).to(DEVICE, dtype)
               for _ in range(m)]
    query = (torch.randn(d, generator=g) * 1.5 / d ** 0.5).to(DEVICE)
    grad = torch.randn(B, T, d, generator=g).to(DEVICE, dtype)
    return query, sources, grad


def route_and_grads(route, query, sources, grad, dtype=None):
    """route(query, sources) and d(mix . grad) with respect to the query and every source."""
    query = query.detach().to(dtype or query.dtype).requires_grad_()
    sources = [s.detach().to(dtype or s.dtype).requires_grad_() for s in sources]
    mix = route(query, sources)
    return [mix.detach()] + [t.detach() for t in torch.autograd.grad(mix, [query, *sources], grad.to(mix.dtype))]


def assert_close(fused, reference, tol, what):
    scale = reference.abs().max().item()
    err = (fused.double() - reference).abs().max().item()
    assert err <= tol * scale + 1e-12, f"{what}: error {err:.3g} against scale {scale:.3g} (allowed {tol:.3g} of it)"


def check_against_reference(m, B, T, d, dtype, tol_mix, tol_grad):
    query, sources, grad = make_route(m, B, T, d, dtype)
    fused = route_and_grads(kernels.fused_route, query, sources, grad)
    reference = route_and_grads(reference_route, query, sources, grad, dtype=torch.float64)
    assert fused[0].dtype == dtype and all(ds.dtype == dtype for ds in fused[2:]) and fused[1].dtype == torch.float32
    names = ["mix", "dL/dw"] + [f"dL/ds_{i}" for i in range(m)]
    for name, f, r, tol in zip(names, fused, reference, [tol_mix] + [tol_grad] * (m + 1)):
        assert_close(f, r, tol, f"m={m} d={d} {name}")


@pytest.mark.parametrize("m, B, T, d", CASES)
def test_fused_route_equals_reference_float32(m, B, T, d):
    """With float32 sources the fused route and all its gradients equal the reference to float32 rounding."""
    check_against_reference(m, B, T, d, torch.float32, 1e-5, 1e-5)


@pytest.mark.parametrize("m, B, T, d", [CASES[2], CASES[6], CASES[7]])
def test_fused_route_equals_reference_bfloat16(m, B, T, d):
    """With bfloat16 sources (float32 math inside) the route and its gradients are within bfloat16 storage error."""
    check_against_reference(m, B, T, d, torch.bfloat16, 2 ** -7, 0.03)


def paired_and_grads(route_pair, queries, sources, grads, dtype=None):
    """route_pair(w, w2, sources) -> (mix, mix2), and d(mix . g + mix2 . g2) with respect to both queries
    and every source."""
    queries = [q.detach().to(dtype or q.dtype).requires_grad_() for q in queries]
    sources = [s.detach().to(dtype or s.dtype).requires_grad_() for s in sources]
    mixes = route_pair(*queries, sources)
    grads = torch.autograd.grad(mixes, [*queries, *sources], [g.to(mixes[0].dtype) for g in grads])
    return [mix.detach() for mix in mixes] + list(grads)


@pytest.mark.parametrize("m, B, T, d, dtype", [c + (torch.float32,) for c in (CASES[0], CASES[3], CASES[6], CASES[7])]
                         + [CASES[7] + (torch.bfloat16,)])
def test_paired_routes_equal_two_reference_routes(m, B, T, d, dtype):
    """Two routes over the same sources in one pass (rd's Q/K and value routes): both mixes, both
    queries' gradients and every source's gradient (the sum of the two routes' parts, written once)
    equal two reference routes, to the tolerances of one route."""
    query, sources, grad = make_route(m, B, T, d, dtype)
    query2, _, grad2 = make_route(m, B, T, d, dtype, seed=1)
    fused = paired_and_grads(lambda w, w2, s: kernels.fused_route(w, s, w2), (query, query2), sources, (grad, grad2))
    reference = paired_and_grads(lambda w, w2, s: (reference_route(w, s), reference_route(w2, s)), (query, query2),
                                 sources, (grad, grad2), dtype=torch.float64)
    tol_mix, tol_grad = (1e-5, 1e-5) if dtype == torch.float32 else (2 ** -7, 0.03)
    names = ["mix", "mix2", "dL/dw", "dL/dw2"] + [f"dL/ds_{i}" for i in range(m)]
    for name, f, r, tol in zip(names, fused, reference, [tol_mix] * 2 + [tol_grad] * (m + 2)):
        assert_close(f, r, tol, f"paired m={m} d={d} {name}")
    # where a pair's program holds as many tokens over as many warps as one route's (so the same order of
    # every sum), the mixes are the bits of two separate fused routes: the second route rides along, changing nothing
    single, pair = kernels._launch(sources, 1)[2], kernels._launch(sources, 2)[2]
    if (single["BLOCK_T"], single["num_warps"]) == (pair["BLOCK_T"], pair["num_warps"]):
        assert torch.equal(fused[0], kernels.fused_route(query, sources))
        assert torch.equal(fused[1], kernels.fused_route(query2, sources))


def test_a_pair_whose_second_mix_is_unused_has_the_gradients_of_its_first_route():
    """fused_route(w, s, w2) with only the first mix in the loss: autograd hands the op a zero gradient for
    the other (it materialises the gradients of unused outputs), so every gradient is the single route's
    and w2's is zero."""
    query, sources, grad = make_route(*CASES[3])
    query2 = make_route(*CASES[3], seed=1)[0]
    paired = paired_and_grads(lambda w, w2, s: (kernels.fused_route(w, s, w2)[0],), (query, query2), sources, (grad,))
    single = route_and_grads(kernels.fused_route, query, sources, grad)
    assert torch.equal(paired[2], torch.zeros_like(query2))
    for name, p, s, tol in zip(["mix", "dL/dw"] + [f"dL/ds_{i}" for i in range(len(sources))],
                               [paired[0], paired[1], *paired[3:]], single, [1e-5] * (len(sources) + 2)):
        assert_close(p, s, tol, f"unused second mix, {name}")


def test_single_source_is_the_source():
    """One source: the route returns it and passes the gradient through (a = exp(logit - lse) = 1 up to
    one float32 rounding of the exp: the interpreter's is exact, a GPU's fast exp is within 2 ulp), and
    the query's gradient, delta = a (g.s - g.mix) with mix = s, vanishes to that rounding too."""
    query, sources, grad = make_route(1, 2, 13, 33)
    mix, dw, ds = route_and_grads(kernels.fused_route, query, sources, grad)
    assert torch.allclose(mix, sources[0], rtol=2.5e-7, atol=0) and torch.allclose(ds, grad, rtol=2.5e-7, atol=0)
    assert dw.abs().max() <= 1e-5 * sources[0].abs().max() * grad.abs().max() * sources[0].shape[:-1].numel()


def test_sum_loss_gradient():
    """mix.sum() as the loss (its gradient reaches the op expanded, not contiguous) gets the reference's gradients."""
    query, sources, _ = make_route(3, 2, 13, 24, seed=4)
    grads = []
    for route, dtype in ((kernels.fused_route, None), (reference_route, torch.float64)):
        w = query.detach().to(dtype or query.dtype).requires_grad_()
        s = [x.detach().to(dtype or x.dtype).requires_grad_() for x in sources]
        route(w, s).sum().backward()
        grads.append([w.grad] + [x.grad for x in s])
    for fused, reference in zip(*grads):
        assert_close(fused, reference, 1e-5, "sum loss")


def test_backward_is_deterministic():
    """The same inputs give the same bits for the query's gradient (no atomics) and every source's."""
    query, sources, grad = make_route(5, 3, 50, 24, seed=1)
    first, second = (route_and_grads(kernels.fused_route, query, sources, grad) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_logits_beyond_float32_exp_range_route_like_the_reference():
    """The online softmax subtracts the running max before each exp: logits hundreds apart (a long query),
    or all far below zero (sources that point against the query), give the reference's route with no inf
    or NaN, where exp of a raw logit or of a drop from one source's logit to the next would overflow
    float32 past 88.7 (or underflow to 0 below -103.9). Tolerances: the mix of the spread case is that of
    one source or two (weights near 0 or 1), to float32 rounding (1e-5); its gradients are checked only
    to be finite, as delta_i = a_i (g . s_i - g . mix) cancels to nearly nothing at one-hot weights and
    leaves float32's rounding of the two dot products as the whole of dL/dw. In the all-below case logits
    of about -250 carry float32 rounding of 250 x 2^-24, up to a few times 1e-5 of each weight (measured:
    up to 3.2e-5 of the scale, 3 seeds): allowed 1e-4."""
    m, B, T, d = 5, 1, 13, 24  # 13 tokens: one part-masked tile
    g = torch.Generator().manual_seed(0)
    direction = torch.randn(d, generator=g)
    direction = direction / direction.norm()
    scales = [0.5 + 2 * torch.rand(1, generator=g) for _ in range(m)]
    grad = torch.randn(B, T, d, generator=g).to(DEVICE)
    spread = [(torch.randn(B, T, d, generator=g) * c).to(DEVICE) for c in scales]  # logits +-400 at |w| = 150
    below = [((-3 * direction + 0.3 * torch.randn(B, T, d, generator=g)) * c).to(DEVICE) for c in scales]
    for query, sources, tol_grad in ((150 * direction, spread, None), (60 * direction, below, 1e-4)):
        query = query.to(DEVICE)
        logits = torch.stack([(s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + ROUTING_RMS_EPS)) @ query for s in sources])
        if tol_grad is None:  # a drop from one source's logit to the next past float32's exp range, in most tokens
            assert ((logits[:-1] - logits[1:]).amax(0) > 100).float().mean() > 0.5
        else:
            assert logits.max() < -200
        fused = route_and_grads(kernels.fused_route, query, sources, grad)
        reference = route_and_grads(reference_route, query, sources, grad, dtype=torch.float64)
        assert all(t.isfinite().all() for t in fused)
        assert_close(fused[0], reference[0], 1e-5, f"mix, logits {logits.min():.0f} to {logits.max():.0f}")
        if tol_grad is not None:
            for name, f, r in zip(["dL/dw"] + [f"dL/ds_{i}" for i in range(m)], fused[1:], reference[1:]):
                assert_close(f, r, tol_grad, f"all logits below -200: {name}")


def test_a_route_over_no_tokens():
    """An empty batch (no tokens: no program to launch) routes to an empty mix, alone and paired, with
    empty source gradients and a zero gradient for each query, as the reference's (a sum over no tokens)."""
    for B, T in ((2, 0), (0, 5)):
        query, sources, grad = make_route(3, B, T, 24)
        query2 = make_route(3, B, T, 24, seed=1)[0]
        mix, dw, *ds = route_and_grads(kernels.fused_route, query, sources, grad)
        assert mix.shape == (B, T, 24) and all(d.shape == (B, T, 24) for d in ds)
        assert dw.shape == (24,) and not dw.any()
        mix, mix2, dw, dw2, *ds = paired_and_grads(lambda w, w2, s: kernels.fused_route(w, s, w2), (query, query2),
                                                   sources, (grad, grad))
        assert mix.shape == mix2.shape == (B, T, 24) and all(d.shape == (B, T, 24) for d in ds)
        assert dw.shape == dw2.shape == (24,) and not dw.any() and not dw2.any()


def inside_guards(shape, dtype, fill=float("nan"), guard=float("nan"), pad=1024):
    """A contiguous tensor of `shape` filled with `fill`, a view into a buffer that holds `pad` elements of
    `guard` on each side of it: (the view, the buffer)."""
    buffer = torch.full((shape.numel() + 2 * pad,), guard, dtype=dtype, device=DEVICE)
    view = buffer[pad:pad + shape.numel()].view(shape)
    view.fill_(fill)
    return view, buffer


@pytest.mark.parametrize("routes", [1, 2])
def test_kernels_read_and_write_only_inside_their_tensors(routes):
    """The kernels launched on tensors with NaN on both sides and NaN-filled outputs: a read past a source,
    a query or g (or into a feature column or token past the end: d = 33 pads to 64, 17 tokens to 2 tiles of
    16) would turn up as NaN in the outputs; a write past an output would change a guard; an output element
    left unwritten (of the mix, lse, a gradient or a tile's dL/dw partial) would stay NaN. The tests above
    see only what lands inside the outputs, which torch.empty allocates with whatever the memory held."""
    m, N, d, guard = 5, 17, 33, 1234.0
    g = torch.Generator().manual_seed(0)

    def filled(shape, dtype=torch.float32, scale=1.0):
        view, _ = inside_guards(torch.Size(shape), dtype)
        view.copy_(torch.randn(shape, generator=g) * scale)
        return view

    sources = [filled((N, d), scale=0.5 + i) for i in range(m)]
    queries = filled((routes, d), scale=1.5 / d ** 0.5)
    grads_out = [filled((N, d)) for _ in range(routes)]
    (lse, lse_buffer), *mixes = [inside_guards(torch.Size(shape), torch.float32, guard=guard)
                                 for shape in [(routes, N)] + [(N, d)] * routes]
    grid, n, constants = kernels._launch(sources, routes)
    assert grid == (2,) and constants["BLOCK_D"] == 64  # a part-masked tile, padded columns
    outputs = [lse_buffer] + [b for _, b in mixes]
    mixes = [v for v, _ in mixes]
    kernels._route_fwd_kernel[grid](kernels._padded(sources), mixes[0], mixes[-1], lse, queries, m, n, **constants)
    grads = [inside_guards(torch.Size((N, d)), torch.float32, guard=guard) for _ in range(m)]
    dw, dw_buffer = inside_guards(torch.Size((routes, grid[0], d)), torch.float32, guard=guard)
    outputs += [b for _, b in grads] + [dw_buffer]
    grads = [v for v, _ in grads]
    kernels._route_bwd_kernel[grid](grads_out[0], mixes[0], grads_out[-1], mixes[-1], lse, queries,
                                    kernels._padded(sources), kernels._padded(grads), dw, m, n, **constants)
    for buffer in outputs:
        assert (buffer[:1024] == guard).all() and (buffer[-1024:] == guard).all(), "a write past an output"
    for t in [lse, *mixes, *grads, dw]:
        assert t.isfinite().all(), "an output element read NaN from outside its inputs, or was never written"
    reference = paired_and_grads(lambda *ws_and_sources: tuple(reference_route(w, ws_and_sources[-1])
                                                               for w in ws_and_sources[:-1]),
                                 list(queries), sources, grads_out, dtype=torch.float64)
    for fused, ref in zip([*mixes, *dw.sum(dim=1), *grads], reference):
        assert_close(fused, ref, 1e-5, f"{routes} route(s), guarded")


@pytest.mark.parametrize("paired", [False, True])
def test_compiled_route_is_one_node_each_way(paired):
    """torch.compile sees one nanoattnres::route node in the forward graph and one route_backward in the
    backward, for one route and for a pair."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm)
        return compiler

    query, sources, grad = make_route(3, 2, 13, 24, seed=2)
    query2 = make_route(3, 2, 13, 24, seed=3)[0]
    route = (lambda w, s: sum(kernels.fused_route(w, s, query2))) if paired else kernels.fused_route
    torch._dynamo.reset()
    compiled = torch.compile(route, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")), fullgraph=True)
    got = route_and_grads(compiled, query, sources, grad)
    want = route_and_grads(route, query, sources, grad)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert sum("nanoattnres.route." in t for t in graphs["fw"]) == 1, graphs["fw"]
    assert sum("nanoattnres.route_backward." in t for t in graphs["bw"]) == 1, graphs["bw"]


def test_route_op_registrations_agree():
    """torch.library.opcheck: each op's schema, fake (shape) function and autograd registration are consistent."""
    query, sources, _ = make_route(3, 2, 5, 24, seed=3)
    query2 = make_route(3, 2, 5, 24, seed=4)[0]
    sources = [s.requires_grad_() for s in sources]
    for queries in (query[None], torch.stack([query, query2])):  # one route, and a pair
        torch.library.opcheck(torch.ops.nanoattnres.route.default, (queries.requires_grad_(), sources))
        with torch.no_grad():  # the backward op has no backward of its own (no double backward)
            mixes, lse = torch.ops.nanoattnres.route(queries, sources)
        grads = [torch.randn_like(mix) for mix in mixes]
        torch.library.opcheck(torch.ops.nanoattnres.route_backward.default,
                              (grads, mixes, lse, queries.detach(), [s.detach() for s in sources]))


def strided_like(x, how):
    """x's values in a non-row-major layout: its batch and token dimensions swapped in memory, or a slice of
    wider rows (row stride > d)."""
    if how == "swapped":
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    return torch.cat([x, torch.full_like(x, float("nan"))], dim=-1)[..., :x.size(-1)]


def test_route_ops_read_any_layout_they_are_given():
    """fused_route hands the ops row-major tensors, but a compiler may give them other strides (torch before
    2.8 let Inductor choose a custom op's input layout): the ops then compute what they compute on
    row-major copies, bit for bit, forward and backward, for sources of mixed layouts and a strided output
    gradient, and return row-major tensors as their fake functions say."""
    query, sources, grad = make_route(3, 2, 13, 24, seed=5)
    queries = query[None]
    layouts = [strided_like(sources[0], "swapped"), sources[1], strided_like(sources[2], "sliced")]
    results = []
    for srcs, g in ((sources, grad), (layouts, strided_like(grad, "sliced"))):
        w = queries.detach().requires_grad_()
        srcs = [x.detach().requires_grad_() for x in srcs]
        (mix,), lse = torch.ops.nanoattnres.route(w, srcs)
        results.append([mix, lse, *torch.autograd.grad(mix, [w, *srcs], g)])
    assert not layouts[0].is_contiguous() and not layouts[2].is_contiguous()
    for got, want in zip(*results):
        assert torch.equal(got, want) and got.is_contiguous()


def test_rejects_mismatched_sources():
    """Sources of different dtypes, shapes or a non-contiguous one are refused with a message, not misread."""
    query, sources, _ = make_route(2, 2, 13, 24)
    strided = sources[1].transpose(0, 1).contiguous().transpose(0, 1)  # the right shape, not contiguous
    for bad in ([sources[0], sources[1].double()], [sources[0], sources[1][:, :7]], [sources[0], strided], []):
        with pytest.raises(ValueError):
            kernels.fused_route(query, bad)


def test_more_tokens_than_int32_indices_reach_is_refused():
    """Past 2^30 tokens a pair's second lse row (n_tokens + token, in int32) would wrap: one line, not a wrong
    write. Meta tensors have the shape and no memory."""
    sources = [torch.empty(2, 2 ** 29 + 1, 4, device="meta")]
    with pytest.raises(ValueError, match=r"^nanoattnres::route takes at most 2\^30 tokens a call .* got 1,073,741,826;"):
        kernels.fused_route(torch.zeros(4, device="meta"), sources)
    kernels._check_sources([torch.empty(2, 2 ** 29, 4, device="meta")])  # exactly 2^30: taken


def test_fused_route_refuses_what_its_kernels_do_not_take():
    """Sources on two devices, sources of a dtype the kernels are not tested with, and queries of another
    shape, device or of two dtypes are refused with fused_route's message; the op refuses queries that are
    not [1 or 2, d] even where their first two sizes would pass (a [1, d, d] query)."""
    query, sources, _ = make_route(2, 2, 13, 24)
    with pytest.raises(ValueError, match="on one device"):
        kernels.fused_route(query, [sources[0], sources[1].to("meta")])
    for dtype in (torch.float64, torch.float16):
        with pytest.raises(ValueError, match="supported are"):
            kernels.fused_route(query.to(dtype), [s.to(dtype) for s in sources])
    for w, w2 in ((query[:20], None), (query.to("meta"), None), (query, query.double()), (query, query[:20])):
        with pytest.raises(ValueError, match="fused_route: a query is"):
            kernels.fused_route(w, sources, w2)
    with pytest.raises(ValueError, match="takes 1 or 2 queries as wide as the sources"):
        torch.ops.nanoattnres.route(torch.randn(1, 24, 24, device=DEVICE), sources)


def test_available_where_triton_runs():
    """available() is True on a GPU, and on the CPU under the interpreter; False on a device Triton cannot run."""
    assert kernels.available(DEVICE)
    assert not kernels.available("meta")


def test_a_gpu_triton_does_not_compile_for_takes_the_plain_route(monkeypatch):
    """A CUDA GPU older than Volta (a P100: compute capability 6.0) is not available, and says why; Volta
    and newer are. (The capability is the only thing asked of the GPU: faked here, on any machine.)"""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100")
    capability = (6, 0)
    assert not kernels.available("cuda")
    assert kernels.why_unavailable("cuda") == ("Tesla P100 has compute capability 6.0, and Triton compiles for 7.0 "
                                               "and newer: use the plain route (fused_route=False)")
    for capability in ((7, 0), (9, 0)):
        assert kernels.available("cuda:1")


# -----------------------------------------------------------------------------
# Through GPT.forward: every mode and granularity on the fused route against the plain one

@pytest.fixture
def fused_calls(monkeypatch):
    """The number of route_kernels.fused_route calls since the test began: the fused tests check that the
    kernels really ran, rather than the plain route compared with itself."""
    real, calls = kernels.fused_route, RouteCalls()

    def counting(query, sources, query2=None):
        calls.extend([len(sources)] * (1 if query2 is None else 2))  # one entry per route computed
        calls.paired += query2 is not None
        return real(query, sources, query2)
    monkeypatch.setattr(kernels, "fused_route", counting)
    return calls


class RouteCalls(list):
    """m for every route the kernels computed; `paired`: how many calls computed two routes at once."""

    def __init__(self):
        super().__init__()
        self.paired = 0

    def clear(self):
        super().clear()
        self.paired = 0


def fused_and_plain(model, x, y, calls):
    """(logits, loss, {parameter: gradient}) of one forward and backward, with the fused route and with the
    plain one; the fused forward sends every route of the model (route_table) to the kernels."""
    out = []
    for fused in (True, False):
        model.fused_route = fused
        model.zero_grad(set_to_none=True)
        calls.clear()
        logits, loss = model(x, y)
        loss.backward()
        assert sorted(calls) == (sorted(m for _, _, m in model.routes) if fused else [])  # m sources per route
        # rd: each layer's Q/K and value routes in one call
        assert calls.paired == (model.config.n_layer if fused and model.config.residual == "rd" else 0)
        out.append((logits.float(), loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters()
                                                  if p.grad is not None}))
    return out


def routed_model(**overrides):
    torch.manual_seed(0)
    model = GPT(tiny_config(**overrides))
    return randomise_queries(perturb_norms_and_biases(model), seed=0, scale=1.0).to(DEVICE)


def tokens(b=2, t=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, 64, (b, t), generator=g).to(DEVICE) for _ in range(2))


@pytest.mark.parametrize("mode", ["attnres", "delta", "rd"])
@pytest.mark.parametrize("res_blocks", [0, 2])
def test_fused_model_equals_plain_model(mode, res_blocks, fused_calls):
    """GPT.forward on the fused route computes the plain route's logits, loss and every parameter's gradient
    (float32; the two differ only in the order of float32 sums: allowed 1e-4 of each tensor's scale)."""
    model = routed_model(residual=mode, res_blocks=res_blocks)
    assert_same_model(*fused_and_plain(model, *tokens(), fused_calls))


def assert_same_model(fused, plain):
    """(logits, loss, gradients by name) of the fused and the plain route: equal but for the order of float32 sums."""
    (f_logits, f_loss, f_grads), (p_logits, p_loss, p_grads) = fused, plain
    assert (f_logits - p_logits).abs().max() <= 1e-4 * p_logits.abs().max()
    assert f_loss == pytest.approx(p_loss, rel=1e-5)
    assert f_grads.keys() == p_grads.keys()
    for name, g in p_grads.items():
        assert (f_grads[name] - g).abs().max() <= 1e-4 * g.abs().max() + 1e-7, name


def test_fused_model_with_low_rank_dlr_and_fixed_value_route(fused_calls):
    """rd with DLR low-rank linears and a value route that never trains: the same logits, loss and
    gradients on both routes, and the fixed value queries get no gradient on the fused route either."""
    model = routed_model(residual="rd", res_blocks=3, lowrank_rank=8, dlr=True, fixed_value_route=True)
    fused, plain = fused_and_plain(model, *tokens(t=16), fused_calls)
    assert_same_model(fused, plain)
    assert not any("res_query_v" in name for name in fused[2])


def test_bf16_sources_stay_within_bf16_rounding(fused_calls):
    """Under bfloat16 autocast the fused route stores its sources in bfloat16 (half the bytes) and adds in
    float32: logits within 4% RMS and gradients with cos >= 0.995 of the float32 plain model, the
    tolerances test_gpu.py gives bfloat16 autocast itself (bf16 keeps 8 bits: 2^-9 per rounding)."""
    model = routed_model(residual="rd", res_blocks=0)
    x, y = tokens()
    model.fused_route = False
    model.zero_grad(set_to_none=True)
    ref_logits, ref_loss = model(x, y)
    ref_loss.backward()
    ref = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.fused_route, model.bf16_sources = True, True
    assert model.route_implementation(torch.device(DEVICE)) == (kernels.fused_route, None)  # no autocast: float32 sources
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert model.route_implementation(torch.device(DEVICE)) == (kernels.fused_route, torch.bfloat16)
        logits, loss = model(x, y)
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert len(fused_calls) == len(model.routes)
    assert ((logits.float() - ref_logits).norm() / ref_logits.norm()).item() <= 0.04
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-2)
    assert torch.nn.functional.cosine_similarity(grad, ref, dim=0).item() >= 0.995


def test_sources_reach_the_kernels_in_bfloat16_only_when_asked(monkeypatch):
    """The sources (the embedding and every block sum) reach the kernels in bfloat16 under bfloat16 autocast
    with bf16_sources, and in float32 otherwise: with bf16_sources=False (the float32 side of
    tools/bf16_sources_check.sh) and under float16 autocast, whose 5 exponent bits bfloat16 does not replace."""
    model = routed_model(residual="attnres", n_layer=1).eval()
    model.fused_route = True
    real, seen = kernels.fused_route, []

    def recording(query, sources, query2=None):
        seen.extend(s.dtype for s in sources)
        return real(query, sources, query2)
    monkeypatch.setattr(kernels, "fused_route", recording)
    for autocast, bf16_sources, expected in ((torch.bfloat16, True, torch.bfloat16), (torch.bfloat16, False, torch.float32),
                                             (torch.float16, True, torch.float32), (None, True, torch.float32)):
        model.bf16_sources = bf16_sources
        seen.clear()
        with torch.no_grad(), torch.autocast(DEVICE, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            model(tokens(t=5)[0])
        assert seen and set(seen) == {expected}, (autocast, bf16_sources)


def test_fused_cached_generation_equals_uncached(fused_calls):
    """Greedy decoding on the fused route, with and without the KV cache (one-token routes), gives the same tokens."""
    model = routed_model(residual="delta", res_blocks=2).eval()
    model.fused_route = True
    prompt = tokens(b=2, t=5)[0]
    cached = torch.cat(list(model.generate_tokens(prompt, 12, temperature=0, use_cache=True)), dim=1)
    uncached = torch.cat(list(model.generate_tokens(prompt, 12, temperature=0, use_cache=False)), dim=1)
    assert torch.equal(cached, uncached) and len(fused_calls) >= 2 * 12 * len(model.routes)


def test_routing_diagnostics_read_the_plain_route():
    """collect_routing needs the depth weights, which the fused route never forms: that forward takes the plain route."""
    model = routed_model(residual="attnres").eval()
    model.fused_route = True
    with torch.no_grad():
        model(tokens()[0], collect_routing=True)
    assert model.last_routing and all(abs(sum(r["weights"]) - 1) < 1e-5 for r in model.last_routing.values())


def test_fused_route_where_it_cannot_run_is_a_clear_error(monkeypatch):
    """fused_route=True on a device the kernels cannot run on says why, rather than silently taking the plain route."""
    monkeypatch.setattr(kernels, "available", lambda device: False)
    model = routed_model(residual="attnres")
    model.fused_route = True
    with pytest.raises(RuntimeError, match="fused_route=True on"):
        model(tokens()[0])
    for value in ("yes", 1, 1.0):  # (1 == True, but it is not the bool that asks for the fused route)
        model.fused_route = value
        with pytest.raises(ValueError, match="use 'auto', True or False"):
            model(tokens()[0])


def test_the_op_without_a_triton_it_can_use_says_why(monkeypatch):
    """A Triton older than 3.3 (the CUDA builds of torch 2.4-2.6 bring 3.0-3.2) imports, but its kernels cannot run:
    called anyway, the op says which Triton it found and what to do."""
    monkeypatch.setattr(kernels, "HAVE_TRITON", False)
    query, sources, _ = make_route(*CASES[1])
    with pytest.raises(RuntimeError, match=rf"^nanoattnres::route cannot run: Triton {kernels.triton.__version__} is "
                                           r"older than 3\.3, which the kernels need \(pip install -U triton\)$"):
        kernels.fused_route(query, sources)


def test_the_op_refuses_what_its_kernels_cannot_compute():
    """The registered op checks its own inputs, as fused_route does: a third query would get no mix (the
    kernels write two) and a narrower query would be read past its end; sources must match."""
    sources = [torch.randn(2, 5, 8) for _ in range(3)]
    for queries in (torch.randn(3, 8), torch.randn(1, 6), torch.randn(8)):
        with pytest.raises(ValueError, match="takes 1 or 2 queries as wide as the sources"):
            torch.ops.nanoattnres.route(queries, sources)
    with pytest.raises(ValueError, match="one or more sources of one shape and dtype"):
        torch.ops.nanoattnres.route(torch.randn(1, 8), [*sources, torch.randn(2, 4, 8)])
    with pytest.raises(ValueError, match="d >= 1 features"):  # (the kernels' 1 / d would divide by zero)
        torch.ops.nanoattnres.route(torch.randn(1, 0), [torch.randn(2, 5, 0)])


def test_the_interpreter_is_what_the_kernels_were_made_with():
    """Triton reads TRITON_INTERPRET as each kernel is defined: set after route_kernels is imported it changes
    nothing, so available("cpu") must not say yes then (the forward would fail looking for a GPU driver)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = ("import os, route_kernels as k; os.environ['TRITON_INTERPRET'] = '1'; "
              "print(k.available('cpu'), k.interpreted())")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["False", "False"], run.stderr[-2000:]
    if DEVICE == "cpu":
        assert kernels.available("cpu") and kernels.interpreted()  # these tests: set before the import (conftest.py)
        return
    # with a GPU conftest.py leaves the interpreter off (these tests run the compiled kernels): set before the
    # import, in a process of its own
    assert not kernels.interpreted()
    script = "import route_kernels as k; print(k.available('cpu'), k.interpreted())"
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=dict(env, TRITON_INTERPRET="1"),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.split() == ["True", "True"], run.stderr[-2000:]


def test_auto_falls_back_to_the_plain_route_with_a_warning(monkeypatch):
    """fused_route='auto' on a GPU Triton cannot compile for (older than Volta; faked here) takes the plain
    route and says why once, rather than failing in the first forward; on a CPU it never asks."""
    import model as model_module
    monkeypatch.setattr(model_module, "TRITON_INSTALLED", True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100")
    model = routed_model(residual="attnres")
    assert model.fused_route == "auto" and model.route_implementation(torch.device("cpu")) == (None, None)
    with pytest.warns(UserWarning, match="plain route on cuda: Tesla P100 has compute capability 6.0"):
        assert model.route_implementation(torch.device("cuda")) == (None, None)


@pytest.mark.parametrize("tile_elements, num_warps", [(64, 1), (256, 2), (1 << 15, 8)])
def test_other_tiles_compute_the_same(tile_elements, num_warps):
    """The tile shapes `python route_kernels.py --tiles` times (1 to 16 tokens a program here, the
    backward's dL/dw summed over more or fewer tiles) all equal the reference."""
    with kernels.tile_shape(tile_elements, num_warps):
        for routes in (1, 2):  # a pair of routes: half the tokens a program
            launch = kernels._launch([torch.empty(3, 50, 24)], routes)[2]  # d = 24: 32 columns a token
            assert (launch["BLOCK_T"], launch["num_warps"]) == (max(1, min(16, tile_elements // 32 // routes)), num_warps)
        check_against_reference(5, 3, 50, 24, torch.float32, 1e-5, 1e-5)
        test_paired_routes_equal_two_reference_routes(5, 3, 50, 24, torch.float32)
    assert (kernels.TILE_ELEMENTS, kernels.NUM_WARPS) == (4096, 4)  # restored


@pytest.mark.parametrize("tile_elements, num_warps", [(64, 1), (4096, 4)])
def test_prefetching_the_next_source_computes_the_same(tile_elements, num_warps):
    """With PREFETCH each slot loads the next source before its own sums: the first source loaded ahead,
    the last slot of a bucket loading none. m = 1, a full bucket (4, 8) and one past it (5, 9), alone and
    paired, forward and every gradient. (The mask past m only saves reads: padded slots point at
    sources[0], so these results cannot show it; the machine code can.)"""
    with kernels.tile_shape(tile_elements, num_warps, prefetch=True):
        assert kernels._launch([torch.empty(2, 13, 24)], 1)[2]["PREFETCH"]
        for m in (1, 4, 5, 8, 9):  # 13 tokens: 13 programs of one token, or one part-masked tile of 16
            check_against_reference(m, 1, 13, 33, torch.float32, 1e-5, 1e-5)
        test_paired_routes_equal_two_reference_routes(5, 1, 13, 33, torch.float32)
        check_against_reference(9, 1, 13, 40, torch.bfloat16, 2 ** -7, 3e-2)
    assert not kernels.PREFETCH  # restored


def test_route_benchmark_runs_through(capsys):
    """`python route_kernels.py`, the GPU check's route part, end to end at a tiny shape on the CPU, with a
    timer that calls each function once and says 1 ms: every route it times runs (fused, eager, paired,
    two routes, each tile) and the result has what tools/gpu_check.sh's summary reads. A GPU lease is
    too short to find a typo in it."""
    timed = []
    result = kernels.benchmark_route(m=3, B=1, T=8, d=16, dtype=torch.float32, device=DEVICE,
                                     tiles=kernels.parse_tiles("64:1,1024:1:prefetch"),
                                     timer=lambda fn: timed.append(fn()) or 1.0)
    assert len(timed) == 1 + 2 * 8  # the copy, then forward and forward+backward of four routes, and two tiles of a route and a pair
    for name in ("fused", "eager", "paired", "2_routes"):
        assert result[name]["fwd_ms"] == result[name]["fwd_bwd_ms"] == 1.0
    assert [(t["tile_elements"], t["num_warps"], t["prefetch"]) for t in result["tiles"]] == [(64, 1, False), (1024, 1, True)]
    assert [t["tile"] for t in result["tiles"]] == ["64:1", "1024:1:prefetch"]
    assert result["default_tile"] == result["fastest_tile"] == "4096:4"  # all alike
    assert result["default_paired_tile"] == result["fastest_paired_tile"] == "4096:4"
    assert [t["tile"] for t in result["paired_tiles"]] == ["64:1", "1024:1:prefetch"]
    assert result["floor_bytes_fwd"] == (3 + 1) * 8 * 16 * 4 and result["shape"] == [1, 8, 16]
    out = capsys.readouterr().out
    assert "1024:1:prefetch: forward" in out and "paired: 1.00x the speed of two routes" in out
    assert (kernels.TILE_ELEMENTS, kernels.NUM_WARPS, kernels.PREFETCH) == (4096, 4, False)  # restored


@pytest.mark.parametrize("pair_ms", [0.5, 2.0])
def test_route_benchmark_times_the_pair_at_every_tile(monkeypatch, pair_ms):
    """The pair is timed at every tile too, and gets the tile that was fastest for it, which need not be one
    route's: the timer here says 0.5 ms for one route at 64:1, pair_ms for a pair at 1024:1, and 1 ms for
    the rest (the kernels' launches say which ran); a pair at 2 ms is slower than at the default."""
    launches = []
    launch = kernels._launch
    monkeypatch.setattr(kernels, "_launch", lambda sources, routes: launches.append((routes, kernels.tile_for(routes)))
                        or launch(sources, routes))

    def timer(fn):
        launches.clear()
        fn()
        if (2, (1024, 1, False)) in launches:
            return pair_ms
        return 0.5 if (1, (64, 1, False)) in launches else 1.0

    result = kernels.benchmark_route(m=3, B=1, T=8, d=16, dtype=torch.float32, device=DEVICE,
                                     tiles=kernels.parse_tiles("64:1,1024:1"), timer=timer)
    assert [t["fwd_bwd_ms"] for t in result["tiles"]] == [0.5, 1.0] and result["fastest_tile"] == "64:1"
    assert [(t["tile"], t["fwd_bwd_ms"]) for t in result["paired_tiles"]] == [("64:1", 1.0), ("1024:1", pair_ms)]
    assert result["paired"]["fwd_bwd_ms"] == 1.0  # the pair at the default tile
    assert result["fastest_paired_tile"] == ("1024:1" if pair_ms < 1.0 else "4096:4")


def record_compiles(monkeypatch):
    """The set of kernel specialisations launched from now on: what Triton compiles a kernel for at a launch
    (its compile-time arguments and warps, each pointer's dtype and whether it is 16-byte aligned, the
    source tuples' length, and whether each int is 1 or a multiple of 16), read from the launches themselves."""
    seen = set()

    def specialisation(value):
        if isinstance(value, torch.Tensor):
            return str(value.dtype), value.data_ptr() % 16 == 0
        if isinstance(value, tuple):
            return tuple(map(specialisation, value))
        return ("int", value == 1, value % 16 == 0) if isinstance(value, int) else value

    class Recorded:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **constants):
                seen.add((self.name, specialisation(args), tuple(sorted(constants.items()))))
                return self.kernel[grid](*args, **constants)
            return launch

    for name in ("_route_fwd_kernel", "_route_bwd_kernel"):
        monkeypatch.setattr(kernels, name, Recorded(name, getattr(kernels, name)))
    return seen


def test_warming_compiles_every_kernel_the_route_benchmark_launches(monkeypatch):
    """`route_kernels.py --warm --tiles=...` (tools/gpu_check.sh runs it beside the tests) launches, at 16
    tokens, every specialisation that the timed benchmark with those tiles launches over 1 to m sources at
    its token count (here 2 x 16, a multiple of 16 like the GPU's 16 x 1024), and no other: the timing runs
    then find them all in Triton's cache, and no compile was wasted."""
    tiles = kernels.parse_tiles("64:1,1024:1:prefetch")
    seen = record_compiles(monkeypatch)
    kernels.warm_route(m=3, d=16, dtype=torch.bfloat16, tiles=tiles, device=DEVICE)
    warmed = set(seen)
    benchmarked = {}
    for m in (1, 2, 3):
        seen.clear()
        kernels.benchmark_route(m=m, B=2, T=16, d=16, dtype=torch.bfloat16, device=DEVICE, tiles=tiles,
                                timer=lambda fn: (fn(), 1.0)[1])
        benchmarked[m] = set(seen)
    every = set().union(*benchmarked.values())
    assert every == warmed, f"not warmed: {every - warmed}; warmed, not run: {warmed - every}"
    assert len(benchmarked[3]) == 2 * 2 * 3  # both ways, one route and a pair, 3 tiles
    assert len(warmed) == 3 * len(benchmarked[3])  # buckets 1, 2 and 4: a kernel each
    # gpu_check.sh's processes, a tile each at once: default=False leaves the default tile to another one
    parts = []
    for options in (dict(), *(dict(tiles=[tile], default=False) for tile in tiles)):
        seen.clear()
        kernels.warm_route(m=3, d=16, dtype=torch.bfloat16, device=DEVICE, **options)
        parts.append(set(seen))
    assert set().union(*parts) == warmed and sum(map(len, parts)) == len(warmed)  # all of it, nothing twice
    # a token count that Triton specialises otherwise (not a multiple of 16) is not served by the warm-up
    seen.clear()
    kernels.benchmark_route(m=3, B=1, T=8, d=16, dtype=torch.bfloat16, device=DEVICE, timer=lambda fn: (fn(), 1.0)[1])
    assert not set(seen) <= warmed


@pytest.mark.parametrize("mode", ["rd", "delta"])
def test_warming_compiles_every_kernel_a_model_launches(monkeypatch, mode):
    """bench.py's rows after the warm-up at their tile: a model whose routes read at most m sources, trained
    under bfloat16 autocast and decoding one token a row at a batch of 16 (bench.py's token counts, all
    multiples of 16), launches only what warm_route(m) launched: the bench part compiles nothing."""
    seen = record_compiles(monkeypatch)
    with kernels.tile_shape(64, 1):
        kernels.warm_route(m=3, d=16, dtype=torch.bfloat16, device=DEVICE)
        warmed = set(seen)
        seen.clear()
        model = routed_model(residual=mode, res_blocks=0, n_layer=1, n_embd=16)  # routes over 1, 2 and 3 sources
        model.fused_route = True
        x, y = tokens(b=2, t=8)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            model(x, y)[1].backward()
            with torch.no_grad():
                prompt = tokens(b=16, t=4)[0]
                cache = model.make_cache()
                logits, _ = model(prompt, cache=cache)
                model(logits[:, -1:].argmax(-1), cache=cache)
    launched = set(seen)
    assert launched and launched <= warmed, f"not warmed: {launched - warmed}"


def test_a_paired_tile_of_its_own():
    """tile_shape(..., paired=TILE) launches pairs (rd) at TILE and single routes at the other tile; without
    it pairs follow the single routes' tile. Both equal the reference; the module's tiles are restored."""
    d24 = [torch.empty(3, 50, 24)]  # d = 24: 32 columns a token
    with kernels.tile_shape(64, 1, paired=(4096, 4, True)):
        assert kernels.tile_for(1) == (64, 1, False) and kernels.tile_for(2) == (4096, 4, True)
        single, pair = kernels._launch(d24, 1)[2], kernels._launch(d24, 2)[2]
        assert (single["BLOCK_T"], single["num_warps"], single["PREFETCH"]) == (2, 1, False)
        assert (pair["BLOCK_T"], pair["num_warps"], pair["PREFETCH"]) == (16, 4, True)  # 4096 // 32 // 2, capped at 16
        test_paired_routes_equal_two_reference_routes(5, 3, 50, 24, torch.float32)
        check_against_reference(5, 3, 50, 24, torch.float32, 1e-5, 1e-5)
        # the route benchmark names it as the pair's default: what the pair falls back to
        result = kernels.benchmark_route(m=3, B=1, T=8, d=16, dtype=torch.float32, device=DEVICE, timer=lambda fn: 1.0)
        assert (result["default_tile"], result["default_paired_tile"]) == ("64:1", "4096:4:prefetch")
        assert result["fastest_paired_tile"] == "4096:4:prefetch"
    with kernels.tile_shape(64, 1):
        assert kernels.tile_for(2) == (64, 1, False)
    assert kernels.PAIRED_TILE is None and kernels.tile_for(2) == (4096, 4, False)


def test_fastest_tile_replaces_the_default_only_by_a_margin():
    """tools/gpu_check.sh benches the model at fastest_tile: the quickest forward+backward of the tiles timed,
    where it beat the default's time by FASTER_BY or more; at a smaller gain (or none) the default."""
    def result(default_ms, **tiles_ms):
        return dict(default_tile="4096:4", fused=dict(fwd_bwd_ms=default_ms),
                    tiles=[dict(tile=name, fwd_bwd_ms=ms) for name, ms in tiles_ms.items()])
    margin = kernels.FASTER_BY
    assert kernels.fastest_tile(result(10.0)) == "4096:4"  # no other tile timed
    assert kernels.fastest_tile(result(10.0, a=9.0, b=8.0, c=9.5)) == "b"
    assert kernels.fastest_tile(result(10.0, a=10.0 * (1 - margin / 2))) == "4096:4"
    assert kernels.fastest_tile(result(10.0, a=10.0 * (1 - margin))) == "a"
    assert kernels.fastest_tile(result(10.0, a=12.0)) == "4096:4"
    # the pair's choice reads the pair's timings: at the default ("paired") and at other tiles ("paired_tiles")
    # and falls back to the pair's own default (PAIRED_TILE, where set)
    pair = dict(result(10.0, b=1.0), default_paired_tile="1024:1", paired=dict(fwd_bwd_ms=10.0),
                paired_tiles=[dict(tile="a", fwd_bwd_ms=9.0)])
    assert kernels.fastest_tile(pair, paired=True) == "a" and kernels.fastest_tile(pair) == "b"
    pair["paired_tiles"][0]["fwd_bwd_ms"] = 10.0 * (1 - margin / 2)
    assert kernels.fastest_tile(pair, paired=True) == "1024:1"


@pytest.mark.parametrize("options,message", [
    (["--compile_for=9"], "--compile_for=9: give a GPU's compute capability times ten, one of 70, 72,"),
    (["--compile_for=95"], "--compile_for=95: give a GPU's compute capability times ten, one of 70, 72,"),
    (["--compile_for=90", "--sass=a_file"], "--sass=a_file is a file: give a folder"),
    (["--compile_for=90", "--json=a_file/x.json"], "cannot write --json a_file/x.json: a_file is a file, not a folder"),
    (["--json=a_file/x.json"], "cannot write --json a_file/x.json: a_file is a file, not a folder"),
    (["--warm", "--json=x.json"], "--warm times nothing, so it writes no --json"),
    (["--warm", "--only_tiles"], "--only_tiles warms --tiles without the default tile"),
    (["--only_tiles", "--tiles=1024:1"], "--only_tiles warms --tiles without the default tile")])
def test_options_are_checked_before_anything_runs(options, message, tmp_path):
    """Options that cannot work (a compute capability LLVM would abort on, an output that cannot be written, --warm's
    options that cannot go together): a one-line error naming them, before anything compiles or runs."""
    (tmp_path / "a_file").write_text("")
    run = subprocess.run([sys.executable, str(ROOT / "route_kernels.py"), *options], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 2 and message in run.stderr.splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("options,message", [([], "timing runs on a CUDA GPU"), (["--warm"], "--warm compiles on a CUDA GPU")])
def test_timing_or_warming_without_a_gpu_is_one_line(options, message, tmp_path):
    """Timing and --warm launch kernels on a GPU: without one, a one-line error that points to --compile_for."""
    run = subprocess.run([sys.executable, str(ROOT / "route_kernels.py"), *options], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert message in run.stderr and "--compile_for=ARCH compiles the kernels without one" in run.stderr


@pytest.mark.parametrize("installed", [None, "3.2.0"])
def test_compile_for_without_a_usable_triton_is_one_line(installed, tmp_path):
    """--compile_for with no Triton, or one older than 3.3 (a stand-in package of that version): one line that
    says which, not a traceback."""
    if installed:
        (tmp_path / "triton").mkdir()
        (tmp_path / "triton" / "__init__.py").write_text(f"__version__ = {installed!r}\ndef jit(fn):\n    return fn\n")
        (tmp_path / "triton" / "language.py").write_text("constexpr = None\n")
    hide = "" if installed else "sys.modules['triton'] = None; "
    script = (f"import runpy, sys; sys.path.insert(0, {str(tmp_path)!r}); {hide}"
              f"sys.argv = ['route_kernels.py', '--compile_for=90']; "
              f"runpy.run_path({str(ROOT / 'route_kernels.py')!r}, run_name='__main__')")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert (f"Triton {installed} is older than 3.3" if installed else "Triton is not installed") in run.stderr


def test_tiles_option_is_checked():
    """--tiles takes ELEMENTS:WARPS[:prefetch] items, elements a power of two; anything else is a one-line error."""
    assert kernels.parse_tiles("4096:4,8192:8,1024:1:prefetch") == [(4096, 4, False), (8192, 8, False), (1024, 1, True)]
    for bad in ("4096", "3000:4", "4096:3", "a:b", "4096:4:pre", "4096:4:prefetch:1"):
        with pytest.raises(ValueError, match="--tiles item"):
            kernels.parse_tiles(bad)


def test_tiles_option_takes_every_warp_count_and_no_empty_tile():
    """--tiles' bounds: each of 1, 2, 4, 8 and 16 warps is taken, and a tile of 0 elements is refused
    (0 & -1 is 0: the power-of-two test alone would take it, and a launch would get no tokens a program)."""
    assert kernels.parse_tiles(",".join(f"{64 * w}:{w}" for w in (1, 2, 4, 8, 16))) == [
        (64 * w, w, False) for w in (1, 2, 4, 8, 16)]
    for bad in ("0:4", "0:1:prefetch", "-4:4"):
        with pytest.raises(ValueError, match="elements must be a power of two"):
            kernels.parse_tiles(bad)


def test_kernels_compile_for_a_gpu_without_one(tmp_path):
    """The interpreter runs the kernels' Python, not the GPU compiler, which is stricter (types, what a
    constexpr branch may hold): every variant a model launches (forward and backward, one route and a
    pair, float32 and bfloat16 sources) compiles for sm_90 (H100, H200) with Triton's own compiler and
    the ptxas it ships, on this CPU, with and without prefetching, fits in registers (nothing spilled to local memory) and reads and
    writes [N, d] tiles in 16-byte vectors, which the bandwidth a route reaches depends on, and computes
    every row offset in int64 (a test at 2^31 elements would need millions of programs). m = 5:
    bucket 8, three padded slots; d = 40: masked feature columns."""
    import triton
    if not (Path(triton.__file__).parent / "backends" / "nvidia").is_dir():
        pytest.skip("this Triton has no NVIDIA backend (a ROCm build, say)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # compiled here, not found in a cache
    out = tmp_path / "sm90.json"
    run = subprocess.run([sys.executable, "route_kernels.py", "--compile_for=90", "--m=5", "--d=40", "--tiles=4096:4:prefetch",
                          f"--json={out}", f"--sass={tmp_path / 'sass'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    kernels_compiled = json.loads(out.read_text())["kernels"]
    assert sorted((k["tile"], k["kernel"], k["routes"], k["dtype"]) for k in kernels_compiled) == sorted(
        (tile, kernel, routes, dtype) for tile in ("4096:4", "4096:4:prefetch") for kernel in ("forward", "backward")
        for routes in (1, 2) for dtype in ("bfloat16", "float32"))
    for k in kernels_compiled:
        assert 0 < k["registers"] <= 255 and k["spilled_bytes"] == 0, k
        assert k["int32_row_offsets"] == 0, k  # every offset row * d in int64: the interpreter never reaches 2^31
        # sources, mixes and gradients move in 16-byte vectors (d = 40: rows of 80 or 160 bytes); only the
        # per-token float32 scalars (log-sum-exp, dL/dw partials) are narrower
        assert set(k["load_bits"]) <= {32, 64, 128} and set(k["store_bits"]) <= {32, 64, 128}, k
        if k["kernel"] == "forward":
            assert k["load_bits"] == [128], k
        sass = (tmp_path / "sass" / f"{k['tile']}_{k['kernel']}_{k['routes']}_{k['dtype']}.sass".replace(":", "-")).read_text()
        assert sass.count("BAR.SYNC") == k["barriers"], k  # the machine code the counts come from
        assert sass.count("LDG.E.128") >= kernels.bucket(5), k  # at least one vector load per source slot
    assert "registers" in run.stdout and "sm_90" in run.stdout


def test_int32_products_by_d_are_found_however_triton_names_the_constant():
    """compile_for_gpu's int32_row_offsets counts int32 multiplies by d in Triton's IR: with d as a named scalar
    (`%c40_i32`, older Tritons) or as a tensor constant named after its variable (Triton 3.9, the IR of a row
    offset `rows[:, None] * D` without its int64 cast); an int64 product, or an int32 one by another number, is
    none. (The first form alone was looked for, so the check could not fail on Triton 3.9.)"""
    ttir_39 = """
    %offs = arith.constant dense<40> : tensor<16x1xi32> loc(#loc66)
    %cst_2 = arith.constant dense<40> : tensor<64xi32> loc(#loc6)
    %rows_4 = arith.muli %rows_3, %rows : i32 loc(#loc67)
    %offs_15 = arith.muli %offs_14, %offs : tensor<16x1xi32> loc(#loc66)"""
    ttir_old = """
    %c40_i32 = arith.constant 40 : i32 loc(#loc1)
    %c16_i32 = arith.constant 16 : i32 loc(#loc1)
    %0 = arith.muli %pid, %c16_i32 : i32 loc(#loc2)
    %1 = arith.muli %x, %c40_i32 : i32 loc(#loc3)"""
    ttir_int64 = """
    %offs = arith.constant dense<40> : tensor<16x1xi64> loc(#loc66)
    %offs_15 = arith.muli %offs_14, %offs : tensor<16x1xi64> loc(#loc66)"""
    assert kernels.int32_products_by(40, ttir_39) == 1 and kernels.int32_products_by(40, ttir_old) == 1
    assert kernels.int32_products_by(40, ttir_int64) == 0 and kernels.int32_products_by(768, ttir_39) == 0


def test_bf16_sources_cost_no_barriers_per_slot_over_float32(tmp_path):
    """At the default tile and full width (d = 768: a token's features span all 4 warps) the query is
    moved into the bfloat16 sources' register layout once, before the slots, not inside each slot's
    `i < m` branch (2 barriers a slot there: 16 at bucket 8). So for sm_90 the bfloat16 kernels have
    the float32 kernels' barriers plus at most a few outside the loop, fewer than one a slot."""
    import triton
    if not (Path(triton.__file__).parent / "backends" / "nvidia").is_dir():
        pytest.skip("this Triton has no NVIDIA backend (a ROCm build, say)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    script = ("import json, torch, route_kernels as k; print(json.dumps({f'{d}-{b}': k.compile_for_gpu("
              "90, m=5, d=768, dtype=getattr(torch, d), backward=b)['barriers'] for d in ('bfloat16', 'float32') "
              "for b in (False, True)}))")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    barriers = json.loads(run.stdout.splitlines()[-1])
    for direction in ("False", "True"):
        bf16, fp32 = barriers[f"bfloat16-{direction}"], barriers[f"float32-{direction}"]
        assert fp32 > 0 and bf16 - fp32 < kernels.bucket(5), barriers


def test_a_toolchain_that_refuses_an_architecture_is_one_line(tmp_path):
    """Where Triton's ptxas, or the cuobjdump beside it, cannot handle a real GPU's architecture (CUDA 13's drop
    sm_70 and renamed sm_101), --compile_for ends in one line naming the tool and its reason, not a traceback:
    here each fails as it would, in turn."""
    import triton
    if not (Path(triton.__file__).parent / "backends" / "nvidia").is_dir():
        pytest.skip("this Triton has no NVIDIA backend (a ROCm build, say)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    failing = {"ptxas": "triton.compile = lambda *a, **k: (_ for _ in ()).throw(ValueError('ptxas: sm_101a unknown'))",
               "cuobjdump": "import subprocess; run = subprocess.run; subprocess.run = lambda cmd, *a, **kw: "
                            "types.SimpleNamespace(returncode=1, stderr='nvdisasm fatal : SM70 is deprecated', stdout='') "
                            "if str(cmd[0]).endswith('cuobjdump') else run(cmd, *a, **kw)"}
    expected = {"ptxas": f"route_kernels.py: Triton {triton.__version__} cannot compile for sm_90 here (ValueError: "
                         "ptxas: sm_101a unknown)",
                "cuobjdump": "route_kernels.py: cuobjdump cannot read this machine code: nvdisasm fatal : SM70 is deprecated"}
    for tool, patch in failing.items():
        script = (f"import runpy, sys, types, triton; {patch}; "
                  f"sys.argv = ['route_kernels.py', '--compile_for=90', '--m=2', '--d=64']; "
                  f"runpy.run_path({str(ROOT / 'route_kernels.py')!r}, run_name='__main__')")
        run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 1 and run.stderr.splitlines()[-1] == expected[tool], (tool, run.stderr[-2000:])
        assert "Traceback" not in run.stderr


def test_compiling_for_a_gpu_asks_for_the_compiler():
    """Under the interpreter (as these tests run) the kernels are not compilable objects: a one-line error
    that says what to do."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton compiles here: the interpreter is off")
    with pytest.raises(RuntimeError, match="unset TRITON_INTERPRET"):
        kernels.compile_for_gpu(90, m=2, d=8)


def test_route_benchmark_reports_bandwidth_against_each_routes_byte_floor():
    """GB/s is a byte floor over the time. One route reads m sources and writes a mix forward, (m + 1) B T d
    elements, and reads g, the mix and m sources and writes m gradients backward, (2m + 2) B T d; a pair (and
    two routes, its comparison) reads m and writes 2 mixes forward, (m + 2) B T d, and reads 2 g, 2 mixes and m
    sources and writes m backward, (2m + 4) B T d, at the default tile and at each other tile; the copy moves
    the forward's floor. The forward alone is timed without autograd: the timer here says 2 ms for it, 3 ms
    with the backward, 0.5 ms for the copy."""
    def timer(fn):
        out = fn()
        if isinstance(out, torch.Tensor) and out.dtype == torch.uint8:
            return 0.5  # the copy: dst.copy_(src) of bytes
        return 3.0 if torch.is_grad_enabled() else 2.0
    m, B, T, d = 3, 1, 8, 16
    result = kernels.benchmark_route(m=m, B=B, T=T, d=d, dtype=torch.float32, device=DEVICE,
                                     tiles=kernels.parse_tiles("64:1"), timer=timer)
    size = B * T * d * 4  # bytes of one float32 [B, T, d]
    one, pair = ((m + 1) * size, (2 * m + 2) * size), ((m + 2) * size, (2 * m + 4) * size)  # (forward, backward)
    assert (result["floor_bytes_fwd"], result["floor_bytes_fwd_bwd"], result["floor_bytes_pair_fwd_bwd"]) == \
        (one[0], sum(one), sum(pair))
    assert result["copy_gb_s"] == pytest.approx(one[0] / 0.5 / 1e6)  # bytes per ms / 1e6: GB/s
    for timed, (fwd, bwd) in ((result["fused"], one), (result["eager"], one), (result["tiles"][0], one),
                              (result["paired"], pair), (result["2_routes"], pair), (result["paired_tiles"][0], pair)):
        assert (timed["fwd_ms"], timed["fwd_bwd_ms"]) == (2.0, 3.0)
        assert timed["fwd_gb_s"] == pytest.approx(fwd / 2.0 / 1e6)
        assert timed["fwd_bwd_gb_s"] == pytest.approx((fwd + bwd) / 3.0 / 1e6)


def test_the_pairs_tile_is_held_to_the_pairs_own_time_by_three_percent():
    """A pair takes about twice one route's time: its other tiles are held to the pair's time at its default
    tile, not one route's; and another tile replaces a default only 3% faster or more (gpu_check.sh's rule)."""
    result = dict(default_tile="4096:4", fused=dict(fwd_bwd_ms=10.0), tiles=[dict(tile="a", fwd_bwd_ms=9.69)],
                  default_paired_tile="4096:4", paired=dict(fwd_bwd_ms=20.0), paired_tiles=[dict(tile="b", fwd_bwd_ms=15.0)])
    assert kernels.fastest_tile(result, paired=True) == "b"  # 25% faster than the pair's default, slower than one route
    assert kernels.fastest_tile(result) == "a"  # 3.1% faster
    result["tiles"][0]["fwd_bwd_ms"] = 9.75  # 2.5% faster: within the timer's noise
    assert kernels.fastest_tile(result) == "4096:4"
