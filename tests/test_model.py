"""
The README's math ("The math") as tests of model.py.

Tolerances. The exact equivalences (README "Exact equivalences" 1, 3, 4) and the comparison with the loop-by-loop
transcription run in float64 with every LayerNorm's epsilon set to 0: then the math says the two
sides are equal, and all that separates them is float64 rounding (unit 1e-16; a few hundred
rounding steps through the network stay far below 1e-9). With the default epsilon 1e-5,
equivalence 1 only holds "up to the pre-norm epsilon": attnres feeds LayerNorm h/m, and
LN(h/m) = (h - mean) / sqrt(var + eps m^2), which differs from LN(h) when var is not >> eps m^2
(test_zero_queries_default_eps_bound measures this).
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import perturb_norms_and_biases, randomise_queries, tiny_config
from checkpoint import converts_exactly, load_model, load_state_into, model_args, save_checkpoint
from common import routing_summary
from model import (GPT, CausalSelfAttention, DepthSources, GPTConfig, LayerNormOfUpcast, LowRankLinear, js_divergence,
                   choose_next_token, reference_route, routing_logits)

ROUTED = ("attnres", "delta", "rd")
LINEARS = {  # name -> config overrides
    "dense": {},
    "lowrank": {"lowrank_rank": 8},
    "dlr": {"lowrank_rank": 8, "dlr": True},
}
EXACT = 1e-9  # float64, eps = 0: see the module docstring


def make_model(seed=0, exact=True, **overrides):
    """A model with random non-trivial weights (LayerNorm gains and biases too)."""
    torch.manual_seed(seed)
    model = perturb_norms_and_biases(GPT(tiny_config(**overrides)))
    if exact:
        model.double()
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = 0.0
    return model.eval()


def batch(seed=0, b=3, t=16, vocab=64):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, t), generator=g)


def all_logits(model, idx):
    logits, _ = model(idx, targets=torch.zeros_like(idx))  # targets: logits at every position
    return logits


def max_diff(a, b):
    return (a - b).abs().max().item()


# -----------------------------------------------------------------------------
# The exact equivalences (README "Exact equivalences")

@pytest.mark.parametrize("linear", LINEARS)
@pytest.mark.parametrize("res_blocks", [0, 2, 3, 6])
@pytest.mark.parametrize("mode", ROUTED)
def test_zero_queries_equal_standard(mode, res_blocks, linear):
    """Equivalence 1: with zero pseudo-queries every routed mode is the standard model, at every granularity."""
    standard = make_model(**LINEARS[linear])
    routed = make_model(residual=mode, res_blocks=res_blocks, **LINEARS[linear])
    missing, unexpected = routed.load_state_dict(standard.state_dict(), strict=False)
    assert not unexpected and missing and all("res_query" in k for k in missing)
    idx = batch()
    assert max_diff(all_logits(routed, idx), all_logits(standard, idx)) < EXACT


def test_zero_queries_default_eps_bound():
    """With LayerNorm's eps the equivalence is approximate; the gap shrinks as the stream's variance grows."""
    gaps = []
    for scale in (1.0, 30.0):
        standard = make_model(exact=False)
        with torch.no_grad():  # a bigger position embedding = a stream with a bigger variance (wte is the head)
            standard.transformer.wpe.weight.mul_(scale)
        routed = make_model(exact=False, residual="attnres")
        routed.load_state_dict(standard.state_dict(), strict=False)
        idx = batch()
        gaps.append(max_diff(all_logits(routed, idx), all_logits(standard, idx)))
    print(f"attnres vs standard, eps=1e-5, float32: max |logit diff| {gaps[0]:.2e} (wpe std 0.02), "
          f"{gaps[1]:.2e} (wpe std 0.6)")
    assert gaps[1] < gaps[0] / 3 and gaps[1] < 1e-3


def test_which_conversions_keep_the_function():
    """checkpoint.converts_exactly: a standard checkpoint in any mode, attnres as rd at its granularity (with
    a value route of its own, not a fixed one), any mode as itself (res_blocks = 2L being res_blocks = 0),
    low-rank linears with the same activation and DLR, with the same number of heads; nothing else. Missing
    settings (GPT-2's) are the defaults."""
    def args(residual, res_blocks=0):
        return dict(residual=residual.removesuffix("_fixedv"), res_blocks=res_blocks, n_layer=3,
                    fixed_value_route=residual.endswith("_fixedv"))
    exact = [(args("standard"), args("rd", 2)), (args("standard", 3), args("delta")), (args("attnres", 3), args("rd", 3)),
             (args("attnres", 6), args("rd", 0)), (args("delta", 2), args("delta", 2)), (args("rd"), args("rd", 6))]
    changed = [(args("attnres"), args("delta")), (args("attnres", 2), args("rd", 3)), (args("rd"), args("attnres")),
               (args("delta"), args("standard")), (args("attnres", 2), args("attnres", 3)), (args("attnres"), args("rd_fixedv")),
               (args("rd_fixedv", 2), args("rd"))]
    # rd's own w_v loads as it was, fixed or not
    exact += [(args("standard"), args("rd_fixedv")), (args("rd_fixedv"), args("rd")), (args("rd"), args("rd_fixedv"))]
    lowrank = dict(lowrank_rank=8, lowrank_act="silu", dlr=False, dlr_alpha=1.0)
    exact += [({**args("standard"), **lowrank}, {**args("rd"), **lowrank}), (dict(n_layer=3), args("delta"))]  # GPT-2's args
    changed += [({**args("standard"), **lowrank, **source}, {**args("standard"), **lowrank, **target}) for source, target in
                ((dict(), dict(dlr=True)), (dict(dlr=True), dict(dlr=True, dlr_alpha=0.5)), (dict(), dict(lowrank_act="identity")))]
    exact += [({**args("standard"), **lowrank}, {**args("standard"), **lowrank, "dlr_alpha": 0.5})]  # no DLR: no scale
    changed += [({**args("attnres"), "n_head": 4}, {**args("attnres"), "n_head": 2})]  # heads: no weight shows them
    assert all(converts_exactly(*pair) for pair in exact) and not any(converts_exactly(*pair) for pair in changed)
    fixed = make_model(residual="rd", fixed_value_route=True)  # its value route stays uniform: w_v is not taken from w_qk
    attnres = make_model(residual="attnres")
    randomise_queries(attnres)
    missing, _ = load_state_into(fixed, attnres.state_dict())
    assert missing and all(k.endswith("attn_res_query_v") for k in missing)
    assert all(not block.attn_res_query_v.any() for block in fixed.transformer.h)


def test_load_state_into_checks_names_and_shapes():
    """load_state_into takes a compiled model's state dict (every name prefixed '_orig_mod.') as the model's
    own, bit for bit; a parameter the model lacks (a third layer into two) or one of another shape (n_embd 64
    into 32) is a one-line error naming it, raised before anything is loaded."""
    source, target = make_model(exact=False), make_model(seed=1, exact=False)
    assert load_state_into(target, {"_orig_mod." + k: v for k, v in source.state_dict().items()}) == ([], [])
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in target.state_dict().items())
    refused = [(make_model(exact=False, n_layer=2), source.state_dict(), r"unexpected parameter transformer\.h\.2\."),
               (target, make_model(exact=False, n_embd=64).state_dict(),
                r"transformer\.wte\.weight has shape \(64, 64\) in the checkpoint but \(64, 32\) in the model")]
    for model, state, message in refused:
        before = copy.deepcopy(model.state_dict())
        with pytest.raises(ValueError, match=message) as err:
            load_state_into(model, state)
        assert "\n" not in str(err.value)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_load_model_overrides_convert_a_checkpoint(tmp_path):
    """checkpoint.load_model(path, residual="delta") builds the checkpoint's model in the mode the override
    names: a standard checkpoint becomes a delta model with the standard model's function (README "Exact
    equivalences" 2; compared in float64 with eps = 0, where EXACT holds, see the module docstring)."""
    standard = make_model(exact=False)
    save_checkpoint(dict(model=standard.state_dict(), model_args=model_args(standard)), tmp_path / "ckpt.pt")
    delta, _ = load_model(tmp_path / "ckpt.pt", residual="delta")
    assert delta.config.residual == "delta" and delta.config.n_layer == standard.config.n_layer
    for model in (standard, delta):
        model.double().eval()
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = 0.0
    idx = batch()
    assert max_diff(all_logits(delta, idx), all_logits(standard, idx)) < EXACT


@pytest.mark.parametrize("linear", LINEARS)
@pytest.mark.parametrize("res_blocks", [0, 3])
def test_rd_tied_equals_attnres(res_blocks, linear):
    """Equivalence 3: rd with w_v tied to w_qk is attnres, for random non-zero queries. So an attnres
    checkpoint loads into rd (checkpoint.load_state_into) with each w_v starting as its layer's w_qk."""
    attnres = make_model(residual="attnres", res_blocks=res_blocks, **LINEARS[linear])
    randomise_queries(attnres)
    rd = make_model(residual="rd", res_blocks=res_blocks, **LINEARS[linear])
    assert load_state_into(rd, attnres.state_dict()) == ([], [])  # no query starts at zero, none is dropped
    assert all(torch.equal(block.attn_res_query_v, block.attn_res_query) for block in rd.transformer.h)
    idx = batch()
    assert max_diff(all_logits(rd, idx), all_logits(attnres, idx)) < EXACT
    with torch.no_grad():  # and untying them changes the function, far beyond float64 rounding
        for block in rd.transformer.h:
            block.attn_res_query_v.copy_(3 * torch.randn_like(block.attn_res_query_v))
    assert max_diff(all_logits(rd, idx), all_logits(attnres, idx)) > 1e-10  # rounding here is ~1e-15


@pytest.mark.parametrize("res_blocks", [0, 3])
def test_fixed_value_route_starts_as_rd_and_keeps_uniform_values(res_blocks):
    """The RD paper's control: at init it computes exactly what rd computes (same seed, same weights);
    under training its value pseudo-queries stay zero (V reads a uniform mix) while the other queries move."""
    torch.manual_seed(0)
    rd = GPT(tiny_config(residual="rd", res_blocks=res_blocks))
    torch.manual_seed(0)
    fixed = GPT(tiny_config(residual="rd", res_blocks=res_blocks, fixed_value_route=True))
    idx = batch()
    assert torch.equal(all_logits(fixed, idx), all_logits(rd, idx))
    opt = fixed.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu")
    for step in range(3):
        _, loss = fixed(batch(step), batch(step + 10))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    queries, counts = fixed.route_queries().detach(), fixed.route_source_counts()
    for name, w, m in zip(fixed.route_names(), queries, counts):
        if name.endswith(".v"):
            assert torch.all(w == 0), name
        elif m > 1:  # a route over one source has a constant softmax: its query gets no gradient
            assert w.abs().max() > 1e-3, name
    assert all(block.attn_res_query_v.grad is None for block in fixed.transformer.h)
    with torch.no_grad():
        fixed(idx, collect_routing=True)
    for name, stats in fixed.last_routing.items():
        if name.endswith(".v"):  # a zero query: every source weighs exactly 1/m
            assert stats["weights"] == pytest.approx([1 / stats["sources"]] * stats["sources"], abs=1e-6)


@pytest.mark.parametrize("linear", ["dense", "dlr"])
@pytest.mark.parametrize("mode", ROUTED)
def test_res_blocks_2L_equals_per_sublayer(mode, linear):
    """Equivalence 4: res_blocks = 2L (blocks of one sublayer) is per-sublayer routing (res_blocks = 0)."""
    per_sublayer = make_model(residual=mode, res_blocks=0, **LINEARS[linear])
    randomise_queries(per_sublayer)
    blocks_2L = make_model(residual=mode, res_blocks=6, **LINEARS[linear])
    blocks_2L.load_state_dict(per_sublayer.state_dict())
    idx = batch()
    assert max_diff(all_logits(blocks_2L, idx), all_logits(per_sublayer, idx)) < EXACT


# -----------------------------------------------------------------------------
# The README's equations, transcribed loop by loop with model.reference_route, independently of DepthSources

@pytest.mark.parametrize("per_block", [1, 2, 3])
def test_fast_route_equals_reference_route(per_block):
    """DepthSources.route (logit table, running sum p, addcmul chain; and its no-grad stacked path)
    equals reference_route over the same sources, for every row, with blocks of per_block outputs."""
    torch.manual_seed(0)
    d, R = 16, 5
    queries = 2 * torch.randn(R, d, dtype=torch.float64)
    e = torch.randn(2, 7, d, dtype=torch.float64)
    outs = [torch.randn(2, 7, d, dtype=torch.float64) * (j + 1) for j in range(6)]
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            depth, completed, partial = DepthSources(e, queries), [e], []
            for j, out in enumerate(outs):
                sources = completed + ([sum(partial)] if partial else [])
                for r in range(R):
                    assert max_diff(depth.route(r), reference_route(queries[r], sources)) < EXACT
                depth.add(out)
                partial.append(out)
                if (j + 1) % per_block == 0:
                    depth.end_block()
                    completed.append(sum(partial))
                    partial = []


def spec_attention(block, x_qk, x_v):
    """Causal self-attention, Q and K from n(x_qk), V from n(x_v), via the full c_attn on each input."""
    attn, C = block.attn, x_qk.size(-1)
    q, k, _ = attn.c_attn(block.ln_1(x_qk)).split(C, dim=2)
    _, _, v = attn.c_attn(block.ln_1(x_v)).split(C, dim=2)
    B, T, _ = q.shape
    q, k, v = (t.view(B, T, attn.n_head, -1).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


def spec_forward(model, idx):
    cfg = model.config
    L, mode = cfg.n_layer, cfg.residual
    S = 1 if cfg.res_blocks == 0 else 2 * L // cfg.res_blocks  # sublayers per routing block
    tr = model.transformer
    e = tr.wte(idx) + tr.wpe(torch.arange(idx.size(1)))
    h = [e]  # h_j, the stream (standard, delta)
    outs = []  # out_j
    for j in range(2 * L):
        block = tr.h[j // 2]
        k_now = j // S  # index of the current routing block
        if mode == "delta":
            # D_k = h(end of block k) - h(start of block k); P = h_j - h(start of current block)
            sources = [e] + [h[(k + 1) * S] - h[k * S] for k in range(k_now)]
            if j % S:
                sources.append(h[j] - h[k_now * S])
        else:
            # b_k = sum of the outputs of block k; p = sum of the outputs so far in the current block
            sources = [e] + [sum(outs[k * S:(k + 1) * S]) for k in range(k_now)]
            if j % S:
                sources.append(sum(outs[k_now * S:j]))
        if mode == "standard":
            x = h[j]
        else:
            w = block.attn_res_query if j % 2 == 0 else block.mlp_res_query
            x = reference_route(w, sources) + (h[j] if mode == "delta" else 0)
        if j % 2 == 0:
            x_v = reference_route(block.attn_res_query_v, sources) if mode == "rd" else x
            out = spec_attention(block, x, x_v)
        else:
            out = block.mlp(block.ln_2(x))
        outs.append(out)
        h.append(h[j] + out)
    if mode in ("attnres", "rd"):
        final = reference_route(tr.res_query_out, [e] + [sum(outs[k * S:(k + 1) * S]) for k in range(2 * L // S)])
    else:
        final = h[-1]
    return model.lm_head(tr.ln_f(final))


@pytest.mark.parametrize("linear", LINEARS)
@pytest.mark.parametrize("res_blocks", [0, 2, 3])
@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_matches_spec_transcription(mode, res_blocks, linear):
    model = make_model(residual=mode, res_blocks=res_blocks, **LINEARS[linear])
    randomise_queries(model)
    idx = batch()
    with torch.no_grad():
        assert max_diff(all_logits(model, idx), spec_forward(model, idx)) < EXACT


def test_first_sublayer_inputs():
    """README "delta": per-sublayer, the first sublayer sees only e: x_0 = e (attnres) and x_0 = 2e (delta)."""
    seen = {}
    for mode in ("attnres", "delta"):
        model = make_model(residual=mode)
        randomise_queries(model)
        hook = model.transformer.h[0].ln_1.register_forward_hook(lambda m, i, o: seen.setdefault(mode, i[0]))
        idx = batch()
        all_logits(model, idx)
        hook.remove()
        e = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))
        seen[mode] = max_diff(seen[mode], e * (2 if mode == "delta" else 1))
    assert seen["attnres"] < EXACT and seen["delta"] < EXACT


# -----------------------------------------------------------------------------
# Precision under autocast

def test_routing_logits_stay_float32_under_autocast():
    """The plain route's logits are float32 under bfloat16 autocast, as the fused route computes them
    (a bfloat16 logit of size ~40 would be off by up to 0.1, a visible change of depth weights), and
    autocast keeps no bfloat16 copy of the source for the backward: the same bits as without autocast."""
    torch.manual_seed(0)
    s = (4 * torch.randn(2, 7, 96)).requires_grad_()
    queries = (3 * torch.randn(5, 96)).requires_grad_()
    saved = []
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logits = routing_logits(s, queries)
    assert logits.dtype == torch.float32 and torch.equal(logits, routing_logits(s, queries))
    assert logits.abs().max() > 10  # large enough for bfloat16's rounding to show
    assert all(t.dtype == torch.float32 for t in saved)
    g = torch.randn_like(logits)
    for ours, theirs in zip(torch.autograd.grad(logits, (s, queries), g),
                            torch.autograd.grad(routing_logits(s, queries), (s, queries), g)):
        assert torch.equal(ours, theirs)
    # bfloat16 sources and queries without autocast (a model cast to bfloat16): float32 logits all the same, of
    # the bfloat16 values upcast. Both sides are float32 math on the same numbers, at most summed in another
    # order: float32 rounding over d = 96 terms, below 96 * 2^-24 of sum_i |s_i w_i| / rms(s) (~200 here), 1e-3;
    # logits computed in bfloat16 (up to ~75 here, where bfloat16's spacing is 0.5) would be off by up to 0.25
    s16, queries16 = s.detach().to(torch.bfloat16), queries.detach().to(torch.bfloat16)
    logits16 = routing_logits(s16, queries16)
    assert logits16.dtype == torch.float32
    torch.testing.assert_close(logits16, routing_logits(s16.float(), queries16.float()), rtol=0, atol=2e-3)


@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_bfloat16_weights_run_without_autocast(mode):
    """A model cast to bfloat16 (no autocast) runs forward and backward on the CPU: attention, which
    computes in float32 there, hands c_proj its own dtype back, and a route's float32 weights mix
    bfloat16 sources into a bfloat16 input."""
    model = make_model(exact=False, residual=mode).to(torch.bfloat16)
    targets = batch(seed=1)
    logits, loss = model(batch(), targets=targets)
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    # the loss is the float32 cross-entropy of the logits' float32 upcast (a bfloat16 log-softmax would round
    # it by up to 2^-8 relative): the same operation on the same numbers, so the same bits
    expected = F.cross_entropy(logits.detach().float().view(-1, logits.size(-1)), targets.view(-1))
    assert loss.dtype == torch.float32 and torch.equal(loss.detach(), expected)


def test_depth_sources_keep_their_dtype():
    """DepthSources stores every source in one dtype (the embedding's by default): a bfloat16 sublayer
    output (autocast's) joins a float32 running sum p as its float32 upcast, so p and the completed
    source it becomes stay float32 (the float32 sum of the upcasts, bit for bit)."""
    torch.manual_seed(0)
    depth = DepthSources(torch.randn(2, 5, 16), torch.randn(3, 16))
    outs = [torch.randn(2, 5, 16).to(torch.bfloat16) for _ in range(2)]
    depth.add(outs[0])
    assert depth.partial.dtype == torch.float32 and torch.equal(depth.partial, outs[0].float())
    depth.add(outs[1])
    assert depth.partial.dtype == torch.float32 and torch.equal(depth.partial, outs[0].float() + outs[1].float())
    depth.end_block()
    assert [s.dtype for s in depth.sources()] == [torch.float32] * 2 and depth.route(0).dtype == torch.float32


# The pre-norm of a bfloat16 mix under CUDA autocast

@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_of_upcast_is_autocasts_layer_norm_keeping_less(bias):
    """What model.LayerNorm runs for a bfloat16 input under CUDA autocast: layer_norm(x.float()), as
    autocast computes it, bit for bit, forward and every gradient (here on the CPU, the same operations);
    for the backward it keeps the bfloat16 input and per-token statistics, not a float32 copy of x."""
    torch.manual_seed(0)
    x = (3 * torch.randn(2, 5, 24) + 1).to(torch.bfloat16).requires_grad_()
    weight = (1 + torch.randn(24) / 4).requires_grad_()
    bias_ = torch.randn(24).requires_grad_() if bias else None
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = LayerNormOfUpcast.apply(x, weight, bias_, 1e-5)
    reference = F.layer_norm(x.float(), (24,), weight, bias_, 1e-5)
    assert y.dtype == torch.float32 and torch.equal(y, reference)
    inputs = [x, weight] + ([bias_] if bias else [])
    g = torch.randn(2, 5, 24)
    for ours, theirs in zip(torch.autograd.grad(y, inputs, g), torch.autograd.grad(reference, inputs, g)):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert [t for t in saved if t.shape == x.shape] == [x]  # the input itself: no float32 copy of it
    assert all(t.numel() <= 2 * 5 for t in saved if t is not x and t is not weight and t is not bias_)  # mean, 1/std


# -----------------------------------------------------------------------------
# DLR

def test_dlr_expand_layout_uneven():
    """d_out=10, r=4: K = ceil(10/4) = 3 and expand_K(z) = z[0,0,0,1,1,1,2,2,2,3]."""
    torch.manual_seed(0)
    layer = LowRankLinear(6, 10, rank=4, bias=True, act="silu", dlr=True, dlr_alpha=0.7)
    assert layer.dlr_matrix.argmax(dim=1).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert layer.dlr_matrix.sum().item() == 10  # one latent per output
    with torch.no_grad():
        layer.B.bias.normal_()
    x = torch.randn(5, 6)
    z = F.silu(layer.A(x))
    expected = layer.B(z) + 0.7 / math.sqrt(3) * z[:, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]]  # LowRankLinear's y, term by term
    assert max_diff(layer(x), expected) < 1e-6


def test_dlr_is_parameter_free_and_changes_output():
    plain = make_model(exact=False, lowrank_rank=8)
    dlr = make_model(exact=False, lowrank_rank=8, dlr=True)
    assert dlr.get_num_params() == plain.get_num_params()
    assert dlr.state_dict().keys() == plain.state_dict().keys()
    dlr.load_state_dict(plain.state_dict())
    idx = batch()
    assert max_diff(all_logits(dlr, idx), all_logits(plain, idx)) > 1e-3


def test_lowrank_init_std():
    """A and B have std r^-1/4 (d_in + d_out)^-1/4 (published DLR/CoLA recipe)."""
    torch.manual_seed(0)
    layer = LowRankLinear(512, 2048, rank=64, bias=False)
    expected = 64 ** -0.25 * (512 + 2048) ** -0.25
    for w in (layer.A.weight, layer.B.weight):
        assert abs(w.std().item() / expected - 1) < 0.02


@pytest.mark.parametrize("linear", ["dense", "lowrank"])
def test_gpt_init_std(linear):
    """GPT.init_weights' table, inside a whole model: low-rank A and B with std r^-1/4 (d_in + d_out)^-1/4 for
    their own d_in, d_out (the recipe re-applied after GPT-2's N(0, 0.02) pass over every Linear); dense c_proj
    0.02 / sqrt(2 L), the other matrices 0.02; LayerNorm gains 1, biases and pseudo-queries 0. The sample std
    of n normal draws has a relative standard deviation ~1/sqrt(2n): each matrix is held to 5 of those
    (n >= 1024 here: 11% at most; a matrix left at 0.02, or c_proj unscaled, is off by a factor 2.4 or more)."""
    torch.manual_seed(0)
    L, rank = 3, 16
    overrides = {"lowrank_rank": rank} if linear == "lowrank" else {}
    model = GPT(tiny_config(residual="rd", n_layer=L, n_embd=64, **overrides))
    kinds = set()
    for name, p in model.named_parameters():
        if p.dim() == 1:  # the only vectors named *.weight are LayerNorm gains
            assert torch.all(p == (1.0 if name.endswith(".weight") else 0.0)), name
            continue
        if name.endswith((".A.weight", ".B.weight")):
            layer = model.get_submodule(name.rsplit(".", 2)[0])
            expected = rank ** -0.25 * (layer.A.in_features + layer.B.out_features) ** -0.25
        elif name.endswith("c_proj.weight"):
            expected = 0.02 / math.sqrt(2 * L)
        else:
            expected = 0.02
        assert p.numel() >= 1024 and abs(p.std().item() / expected - 1) < 5 / math.sqrt(2 * p.numel()), name
        kinds.add(name.split(".")[-2])
    assert kinds == ({"A", "B", "wte", "wpe"} if linear == "lowrank" else {"c_attn", "c_proj", "c_fc", "wte", "wpe"})


@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_fold_keeps_logits(mode):
    """Folding DLR into B keeps the logits bit for bit, and leaves a plain low-rank model."""
    model = make_model(exact=False, residual=mode, lowrank_rank=8, dlr=True, dlr_alpha=1.3)
    randomise_queries(model)
    idx = batch()
    before = all_logits(model, idx)
    model.fold_dlr()
    after = all_logits(model, idx)
    # Before folding every forward forms B + sR in float32 (up_weight) and multiplies by it; folding stores
    # that same float32 sum in B, and the forward then multiplies by B: the same numbers through the same
    # operations, so the same bits
    assert torch.equal(before, after)
    assert not model.config.dlr
    plain = make_model(exact=False, residual=mode, lowrank_rank=8)
    assert model.get_num_params() == plain.get_num_params()
    assert sum(b.numel() for b in model.buffers()) == sum(b.numel() for b in plain.buffers())
    plain.load_state_dict(model.state_dict())  # a folded model is a plain low-rank model
    assert max_diff(all_logits(plain, idx), after) == 0.0


# -----------------------------------------------------------------------------
# Training behaviour

@pytest.mark.parametrize("res_blocks", [0, 2])
@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_gradients_reach_everything(mode, res_blocks):
    """Every parameter, every pseudo-query included, gets a non-zero gradient, even at zero queries;
    except the queries of routes with a single source (the embedding), where softmax over one is 1."""
    model = make_model(exact=False, residual=mode, res_blocks=res_blocks, lowrank_rank=8, dlr=True)
    idx = batch()
    _, loss = model(idx, targets=batch(seed=1))
    loss.backward()
    single_source = {query for _, query, m in model.routes if m == 1}  # sublayer 0 (and its value route) read only e
    assert mode == "standard" or "transformer.h.0.attn_res_query" in single_source
    for name, p in model.named_parameters():
        if name in single_source:
            assert p.grad is None or p.grad.abs().sum() == 0, name
        else:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("res_blocks", [0, 2])
@pytest.mark.parametrize("mode", ROUTED)
def test_zero_sources_give_finite_gradients(mode, res_blocks):
    """Sublayers whose output projections are zero (a common init) make sources that are exactly 0,
    where |s| has no derivative: the routing keys' 1/rms(s) must still give finite gradients."""
    model = make_model(exact=False, residual=mode, res_blocks=res_blocks)
    randomise_queries(model)
    with torch.no_grad():
        for block in model.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                proj.weight.zero_()
                proj.bias.zero_()
    _, loss = model(batch(), targets=batch(seed=1))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    assert model.transformer.h[0].attn.c_proj.weight.grad.abs().sum() > 0  # the zero sources still learn


@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_every_sublayer_output_reaches_the_loss(mode):
    """Every sublayer's output gets a gradient from the loss: no mode drops one on the way to the output
    (which earlier sources each route reads is checked against the written-out equations above)."""
    model = make_model(exact=False, residual=mode)
    outs = []
    for block in model.transformer.h:
        for mod in (block.attn, block.mlp):
            mod.register_forward_hook(lambda m, i, o: outs.append(o) or o.retain_grad())
    _, loss = model(batch(), targets=batch(seed=1))
    loss.backward()
    assert len(outs) == 2 * model.config.n_layer
    for j, out in enumerate(outs):
        assert out.grad is not None and out.grad.abs().sum() > 0, f"sublayer {j}"


@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_loss_at_init_is_log_vocab(mode):
    model = make_model(exact=False, residual=mode, vocab_size=256)
    _, loss = model(batch(vocab=256), targets=batch(seed=1, vocab=256))
    assert abs(loss.item() - math.log(256)) < 0.05


@pytest.mark.parametrize("linear", ["dense", "dlr"])
@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_overfits_one_batch(mode, linear):
    torch.manual_seed(0)
    model = GPT(tiny_config(residual=mode, n_layer=2, **LINEARS[linear]))
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95), "cpu", res_query_lr_mult=1.0)
    x, y = batch(b=4), batch(seed=1, b=4)
    for _ in range(150):
        _, loss = model(x, targets=y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3, f"{mode}/{linear}: loss {loss.item():.3f} after 150 steps on one batch"


@pytest.mark.parametrize("res_blocks", [0, 3])
@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_route_table_names_every_pseudo_query_once(mode, res_blocks):
    """route_table is the one numbering of the routes: each pseudo-query once, rows in forward's order
    (sublayer j's input route is row j), its source counts those DepthSources builds."""
    model = make_model(exact=False, residual=mode, res_blocks=res_blocks)
    queries = [q for _, q, _ in model.routes]
    assert sorted(queries) == sorted(n for n, _ in model.named_parameters() if "res_query" in n)
    assert all(model.route_row[f"L{j // 2}.{('attn', 'mlp')[j % 2]}"] == j for j in range(2 * 3) if mode != "standard")
    if mode != "standard":
        model(batch(), collect_routing=True)
        assert {n: s["sources"] for n, s in model.last_routing.items()} == dict(zip(model.route_names(), model.route_source_counts()))


def test_optimizer_groups():
    model = make_model(exact=False, residual="rd")
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu", res_query_lr_mult=10.0)
    named = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay, queries = opt.param_groups
    assert all(p.dim() == 2 and "res_query" not in named[id(p)] for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert {named[id(p)] for p in queries["params"]} == {n for n in named.values() if "res_query" in n}
    assert queries["weight_decay"] == 0.0 and queries["lr"] == pytest.approx(1e-2) and queries["lr_mult"] == 10.0
    n_grouped = sum(len(g["params"]) for g in opt.param_groups)
    assert n_grouped == len(list(model.parameters()))


def test_flops_count_routing_and_lowrank():
    dense = GPT(tiny_config())
    cfg = dense.config
    matrices = sum(p.numel() for n, p in dense.named_parameters() if p.dim() == 2 and "wpe" not in n)
    assert dense.flops_per_token() == 6 * matrices + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    per_sublayer = GPT(tiny_config(residual="attnres"))
    block = GPT(tiny_config(residual="attnres", res_blocks=2))
    assert dense.flops_per_token() < block.flops_per_token() < per_sublayer.flops_per_token()
    lowrank = GPT(tiny_config(lowrank_rank=4))
    assert lowrank.flops_per_token() < dense.flops_per_token()
    assert dense.estimate_mfu(2, 1.0, peak_flops=1e9) == pytest.approx(2 * dense.flops_per_token() * 16 / 1e9)


def test_flops_count_attnres_by_hand():
    """GPT.flops_per_token for one tiny attnres model, written out term by term from the formula in its comments:
    training = 3x forward, 6 FLOPs per matmul weight (the tied head once; vectors and wpe, a lookup, do none),
    attention's scores and weighted values 2 d T each a layer, and per route 2 d m (mix of its m sources) plus,
    per source, 2 d R (its key's logits against all R routes). Integers: exact."""
    d, T, L, V = 32, 16, 3, 64  # tiny_config
    model = GPT(tiny_config(residual="attnres", res_blocks=3))  # blocks of 2 sublayers
    weights = V * d + L * (d * 3 * d + d * d + d * 4 * d + 4 * d * d)  # head; c_attn, attn.c_proj, c_fc, mlp.c_proj
    attention = L * (2 * d * T + 2 * d * T)
    # sublayer j reads e, the completed blocks and the block in progress once it holds an output: j = 0..5 read
    # [e], [e, p], [e, b1], [e, b1, p], [e, b1, b2], [e, b1, b2, p]; the output route reads [e, b1, b2, b3]
    m = [1, 2, 2, 3, 3, 4, 4]
    R, sources = len(m), 4  # the sources with a key: e, b1, b2, b3
    routing = sum(2 * d * m_i for m_i in m) + sources * 2 * d * R
    assert (weights, attention, routing) == (38912, 6144, 3008)
    assert model.flops_per_token() == 6 * weights + 3 * attention + 3 * routing == 260928


# -----------------------------------------------------------------------------
# Routing diagnostics

def test_routing_diagnostics():
    model = make_model(exact=False, residual="rd", res_blocks=3)
    assert model.last_routing is None
    model(batch())
    assert model.last_routing is None  # only collected when asked for
    model(batch(), collect_routing=True)
    stats = model.last_routing
    counts = dict(zip(model.route_names(), model.route_source_counts()))
    for name, s in stats.items():
        assert len(s["weights"]) == counts[name] and abs(sum(s["weights"]) - 1) < 1e-5
        if counts[name] > 1:  # zero queries: uniform weights
            assert s["max_weight"] == pytest.approx(1 / counts[name]) and s["entropy"] == pytest.approx(1.0)
    assert all(s["js_qk_v"] == pytest.approx(0.0, abs=1e-9) for s in stats.values() if "js_qk_v" in s)
    randomise_queries(model, scale=5.0)
    model(batch(), collect_routing=True)
    stats = model.last_routing
    summary = routing_summary(stats)
    assert summary["mean_entropy"] < 1.0 and summary["mean_js"] > 0 and summary["deep_max_weight"] > 1 / 4
    # each rd layer's JS divergence, recomputed from the reported QK and V weights as H(mid) - (H(p) + H(q)) / 2
    # in float64 (routing_stats computes it as a mean of KLs, in float32: 1e-6 covers float32 rounding of terms ~1)
    entropy = lambda w: -sum(x * math.log(x) for x in w if x > 0)
    js_layers = [name for name, s in stats.items() if "js_qk_v" in s]
    assert js_layers == [f"L{l}.attn.v" for l in range(1, 3)]  # layer 0's routes read one source: no choice, no JS
    for name in js_layers:
        p, q = stats[name.removesuffix(".v")]["weights"], stats[name]["weights"]
        expected = entropy([(a + b) / 2 for a, b in zip(p, q)]) - (entropy(p) + entropy(q)) / 2
        assert expected > 1e-3 and stats[name]["js_qk_v"] == pytest.approx(expected, abs=1e-6), name


def test_js_divergence_known_values():
    """js_divergence against values worked out by hand: disjoint distributions are log 2 apart (its maximum);
    ([1/2, 1/2], [1, 0]) have mid (3/4, 1/4), so JS = H(mid) - (H(p) + H(q)) / 2 = (2 log 2 - (3/4) log 3) -
    (log 2) / 2 = (3/2) log 2 - (3/4) log 3; and it is symmetric, which KL is not. Float64: rounding only."""
    t = lambda *w: torch.tensor(w, dtype=torch.float64)
    assert js_divergence(t(1.0, 0.0), t(0.0, 1.0)) == pytest.approx(math.log(2), abs=1e-12)
    half, one = t(0.5, 0.5), t(1.0, 0.0)
    assert js_divergence(half, one) == pytest.approx(1.5 * math.log(2) - 0.75 * math.log(3), abs=1e-12)
    p, q = t(0.7, 0.2, 0.1), t(0.1, 0.3, 0.6)
    assert js_divergence(p, q) == pytest.approx(js_divergence(q, p), abs=1e-12) and js_divergence(p, q) > 0.1
    assert js_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


# -----------------------------------------------------------------------------
# Generation with the key-value cache

@pytest.mark.parametrize("linear", ["dense", "dlr"])
@pytest.mark.parametrize("mode,res_blocks", [("standard", 0), ("attnres", 0), ("attnres", 2),
                                             ("delta", 0), ("delta", 3), ("rd", 0), ("rd", 2)])
def test_cached_generation_equals_uncached(mode, res_blocks, linear):
    model = make_model(exact=False, residual=mode, res_blocks=res_blocks, **LINEARS[linear])
    randomise_queries(model)
    prompt = batch(b=2, t=5)
    # 20 new tokens from 5 runs past block_size=16, so the sliding window is exercised too
    cached = model.generate(prompt, 20, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


def test_low_temperature_sampling_under_float16():
    """Logits over a low temperature pass float16's largest number (65504) (here ~0.3 / 1e-6): sampling
    divides them in float32, so it runs, and gives the greedy tokens (float16's logits below 0.5 are
    2^-12 or less apart, or equal, and 2^-12 / 1e-6 = 244 nats leaves the argmax all the probability,
    bar exact ties, none here)."""
    model = make_model(exact=False, residual="rd", res_blocks=2)
    randomise_queries(model)
    prompt = batch(b=2, t=5)
    with torch.autocast("cpu", dtype=torch.float16):
        logits, _ = model(prompt)
        assert logits.dtype == torch.float16 and (logits[:, -1] / 1e-6).isinf().any()
        sampled = model.generate(prompt, 8, temperature=1e-6)
        greedy = model.generate(prompt, 8, temperature=0)
    assert torch.equal(sampled, greedy)


def test_cached_forward_matches_full_forward():
    model = make_model(residual="rd", res_blocks=2)
    randomise_queries(model)
    idx = batch(b=2, t=12)
    full = all_logits(model, idx)
    cache = model.make_cache()
    model(idx[:, :7], cache=cache)  # prefill
    for t in range(7, 12):
        step, _ = model(idx[:, t:t + 1], cache=cache)
        assert max_diff(step[:, 0], full[:, t]) < EXACT
    assert cache.position.item() == 12


def test_prompt_into_an_empty_cache_is_plain_causal_attention(monkeypatch):
    """A prompt written into an empty cache attends as a forward without a cache does (is_causal, no
    mask: flash attention on a GPU); a chunk after it attends through the cache's mask. Both give
    the logits of the full forward."""
    model = make_model(residual="rd", res_blocks=2)
    randomise_queries(model)
    idx = batch(b=2, t=12)
    full = all_logits(model, idx)
    calls, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *args, **kw: calls.append((kw["attn_mask"] is None, kw["is_causal"])) or sdpa(*args, **kw))
    cache = model.make_cache()
    for start, end, plain in ((0, 7, True), (7, 10, False), (10, 11, False)):
        calls.clear()
        logits, _ = model(idx[:, start:end], cache=cache)
        assert calls == [(plain, plain)] * model.config.n_layer
        assert max_diff(logits[:, -1], full[:, end - 1]) < EXACT


def test_cache_keeps_its_shapes():
    """The cache's buffers are allocated once at their full size and written in place: a compiled
    decode step can hold on to them (CUDA graphs need fixed addresses)."""
    model = make_model(residual="attnres")
    cache = model.make_cache()
    position, address = cache.position, cache.position.data_ptr()  # the count of written positions, a tensor
    model(batch(t=5), cache=cache)
    buffers = [(k.data_ptr(), v.data_ptr()) for k, v in zip(cache.k, cache.v)]
    assert all(k.shape == (3, model.config.n_head, model.config.block_size, model.config.n_embd // model.config.n_head)
               for k in cache.k)
    assert cache.position is position and position.item() == 5
    for written in (6, 7):  # each one-token step counts itself in place: the same tensor at the same address
        model(batch(t=1), cache=cache)
        assert [(k.data_ptr(), v.data_ptr()) for k, v in zip(cache.k, cache.v)] == buffers
        assert cache.position is position and position.data_ptr() == address and position.item() == written


@pytest.mark.parametrize("mode", ("standard", "rd"))
def test_cache_overflow_is_an_error(mode):
    """Decoding past block_size with a cache is a one-line error that says what to do, not a silent
    wrap-around, and it leaves the cache as it was: the positions already written still decode."""
    model = make_model(residual=mode)
    cache = model.make_cache()
    model(batch(t=model.config.block_size - 1), cache=cache)
    for t in (2, 3):
        with pytest.raises(ValueError, match=r"holds 16 positions, 15 are written: no room for \d more") as err:
            model(batch(t=t), cache=cache)
        assert "\n" not in str(err.value)
    assert int(cache.position) == model.config.block_size - 1
    model(batch(t=1), cache=cache)  # the last slot


def test_a_tiny_temperature_draws_the_most_likely_token():
    """logits / 1e-40 overflows float32 to inf, and the softmax of that is NaN (a traceback from the sampler);
    1e-300 is 0 in float32. At a temperature that small the draw is the greedy one, in every row."""
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 5
    for temperature in (1e-40, 1e-300):
        assert torch.equal(choose_next_token(logits, temperature=temperature), logits.argmax(dim=-1, keepdim=True))


@pytest.mark.parametrize("mode", ("standard", "rd"))
def test_more_positions_than_block_size_is_an_error(mode):
    """A forward over more than block_size positions is a one-line error that says what to pass (an
    assert would vanish under python -O and leave wpe's index error)."""
    model = make_model(residual=mode)
    with pytest.raises(ValueError, match=r"cannot forward 17 positions, block_size is 16: pass the last 16") as err:
        model(batch(t=17))
    assert "\n" not in str(err.value)


class CountingBackend:
    """A torch.compile backend that runs each captured graph as it is and counts the graphs: how
    many times dynamo compiled, without paying for Inductor."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize("mode,res_blocks", [("standard", 0), ("attnres", 0), ("delta", 2), ("rd", 0), ("rd", 2)])
def test_compiled_decoding_is_one_graph(mode, res_blocks):
    """Generation with a compiled one-token step: one graph without graph breaks (fullgraph) for
    every position and for a second generation's new cache, and the eager model's tokens, also
    past block_size (where the window slides and every step is a full eager forward)."""
    torch._dynamo.reset()
    model = make_model(residual=mode, res_blocks=res_blocks, exact=False)
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    decode_step = lambda token, cache: compiled(token, cache=cache)[0]
    for prompt in (batch(b=1, t=5), batch(b=1, t=7)[:, 2:]):  # one row: idx[:, -1:] is contiguous whatever its strides
        steps = model.config.block_size + 4  # past block_size: the window slides
        tokens = torch.cat(list(model.generate_tokens(prompt, steps, temperature=0, decode_step=decode_step)), dim=1)
        assert torch.equal(tokens, torch.cat(list(model.generate_tokens(prompt, steps, temperature=0)), dim=1))
    assert backend.graphs == 1


@pytest.mark.parametrize("mode,res_blocks", [("standard", 0), ("attnres", 0), ("delta", 2), ("rd", 2)])
def test_compiled_training_forward_is_one_graph(mode, res_blocks):
    """The training forward compiles without graph breaks, once for repeated steps."""
    torch._dynamo.reset()
    model = make_model(residual=mode, res_blocks=res_blocks, exact=False).train()
    backend = CountingBackend()
    step = torch.compile(model, backend=backend, fullgraph=True)
    idx = batch(t=16)
    for _ in range(2):
        _, loss = step(idx, targets=idx)
        loss.backward()
    assert backend.graphs == 1


@pytest.mark.parametrize("mode,res_blocks,n_layer", [("standard", 0, 3), ("attnres", 0, 3), ("attnres", 0, 5),
                                                     ("delta", 2, 3), ("rd", 0, 3), ("rd", 0, 5)])
def test_compiled_sublayers_are_two_graphs_at_any_depth(mode, res_blocks, n_layer):
    """model.compile_sublayers(): every layer runs the same two compiled sublayers, attention and MLP, so
    dynamo compiles two graphs for training whatever the depth and the mode (the whole model would unroll
    every layer and route into one). Same losses and gradients as the eager model, bit for bit: the
    backend here runs each graph as captured, the same operations in the same order. Generating with the
    key-value cache afterwards adds the MLP's graphs for evaluation, for the prompt and for one token, and
    none per layer: attention with a cache stays eager (which layer's cache it writes would tell the layers
    apart). The same tokens as the eager model's."""
    torch._dynamo.reset()
    eager = make_model(residual=mode, res_blocks=res_blocks, n_layer=n_layer, dropout=0.1, exact=False).train()
    compiled = copy.deepcopy(eager)
    backend = CountingBackend()
    assert compiled.compile_sublayers(backend=backend, fullgraph=True) is compiled
    sublayers = [(block.attn_sublayer, block.mlp_sublayer) for block in compiled.transformer.h]
    assert compiled.compile_sublayers(backend=backend) is compiled  # a second call changes nothing
    assert all(a is block.attn_sublayer and m is block.mlp_sublayer
               for (a, m), block in zip(sublayers, compiled.transformer.h))
    idx = batch(t=16)
    for model in (eager, compiled):
        for _ in range(2):
            torch.manual_seed(0)  # the same dropout masks
            _, loss = model(idx, targets=idx)
            loss.backward()
        model.final_loss = loss
    assert backend.graphs == 2
    assert torch.equal(eager.final_loss, compiled.final_loss)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), name
    prompt = batch(b=1, t=5)
    tokens = [torch.cat(list(model.eval().generate_tokens(prompt, 6, temperature=0)), dim=1) for model in (eager, compiled)]
    assert torch.equal(*tokens)
    assert backend.graphs == 4


@pytest.mark.parametrize("mode,res_blocks", [("attnres", 0), ("rd", 2)])
def test_compiled_decoding_after_compiled_sublayers_is_one_graph(mode, res_blocks):
    """bench.py --compile --compile_sublayers: the sublayers compiled for training, then the one-token step
    compiled whole (fullgraph) around them, as compile_decoding does. Dynamo traces through the compiled
    sublayers into the step's one graph, for every position, with the eager model's tokens."""
    torch._dynamo.reset()
    model = make_model(residual=mode, res_blocks=res_blocks, exact=False)
    eager = copy.deepcopy(model)
    model.compile_sublayers(backend=CountingBackend())
    backend = CountingBackend()
    step = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    decode_step = lambda token, cache: step(token, cache=cache)[0]
    prompt = batch(b=1, t=5)
    steps = model.config.block_size + 4  # past block_size: the window slides
    tokens = torch.cat(list(model.generate_tokens(prompt, steps, temperature=0, decode_step=decode_step)), dim=1)
    assert torch.equal(tokens, torch.cat(list(eager.generate_tokens(prompt, steps, temperature=0)), dim=1))
    assert backend.graphs == 1


# -----------------------------------------------------------------------------
# Bad configurations

@pytest.mark.parametrize("overrides,field", [
    ({"residual": "highway"}, "residual"),
    ({"res_blocks": 4}, "res_blocks"),  # 2L = 6
    ({"res_blocks": -1}, "res_blocks"),
    ({"lowrank_rank": -2}, "lowrank_rank"),
    ({"lowrank_act": "relu", "lowrank_rank": 4}, "lowrank_act"),
    ({"dlr": True}, "dlr"),
    ({"fixed_value_route": True, "residual": "attnres"}, "fixed_value_route"),
    ({"n_embd": 33}, "n_embd"),
    ({"dropout": 1.5}, "dropout"),
    ({"dropout": 1.0}, "dropout"),  # every activation dropped: [0, 1) excludes 1
    ({"dropout": "0.1"}, "dropout"),  # a string from a hand-written config: a clear error, not a TypeError
    ({"n_layer": 0}, "n_layer"),
    ({"n_layer": True}, "n_layer"),  # a bool is an int to Python, but not a layer count
    ({"res_blocks": True}, "res_blocks"),
    ({"lowrank_rank": 33}, "lowrank_rank"),  # n_embd = 32
    ({"dlr_alpha": float("nan"), "lowrank_rank": 4, "dlr": True}, "dlr_alpha"),
    ({"bias": "False"}, "bias"),  # a non-empty string is truthy: it would silently mean True
    ({"lowrank_act": ["silu"], "lowrank_rank": 4}, "lowrank_act"),  # not a TypeError from the dict lookup
])
def test_bad_config_raises(overrides, field):
    with pytest.raises(ValueError, match=rf"GPTConfig\.{field}=") as err:
        tiny_config(**overrides)
    assert "\n" not in str(err.value)


def test_lowrank_rank_may_be_n_embd():
    """The largest rank lowrank_rank allows is n_embd ("a rank in 1..n_embd"): the model builds and runs."""
    model = make_model(exact=False, lowrank_rank=32, dlr=True)  # tiny_config: n_embd = 32
    logits, loss = model(batch(), targets=batch(seed=1))
    assert model.transformer.h[0].mlp.c_fc.A.out_features == 32
    assert logits.shape == (3, 16, 64) and torch.isfinite(loss)


def test_unknown_config_key():
    with pytest.raises(ValueError, match="unknown GPTConfig key.*'res_block'"):
        GPTConfig.from_dict({"n_layer": 2, "res_block": 2})


# Relative RMS of the bf16 logits' error, bf16 autocast vs float32, per mode (test_bf16_autocast_close_to_float32's
# models). bf16 keeps 8 significant bits: every rounding of a matmul's inputs moves them by up to 2^-8 ~ 4e-3
# relative, and 25 matmuls (8 low-rank factors a layer, the head) round on the way to the logits. Measured over
# 12 seeds of make_model and randomise_queries: standard 0.9e-2, delta 1.0e-2 at most, so 3e-2 for a stream.
# The replacement modes route sharply: a random pseudo-query (std 2, d = 32) gives depth logits of spread
# ~2 sqrt(32) = 11, so a source rounded by ~4e-3 (every sublayer output arrives in bf16) moves a depth logit
# by up to ~0.04 and the mix by as much of the difference between sources; measured attnres 3.3e-2, rd 7.6e-2
# at most, so 0.2 there. Attending over keys in place of values (a bug in attention's float32 upcast) gives
# 0.8 or more in every mode.
BF16_LOGITS_REL_RMS = {"standard": 3e-2, "delta": 3e-2, "attnres": 0.2, "rd": 0.2}


@pytest.mark.parametrize("mode", ("standard",) + ROUTED)
def test_bf16_autocast_close_to_float32(mode):
    """Under CPU bf16 autocast (what train.py uses there) every mode trains and decodes; the logits and the
    loss move by bf16 rounding only (BF16_LOGITS_REL_RMS), and so do the key-value cache's one-token steps
    against the full forward."""
    model = make_model(exact=False, residual=mode, res_blocks=3 if mode == "rd" else 0, lowrank_rank=8, dlr=True)
    randomise_queries(model)
    x, y = batch(), batch(seed=1)
    logits32, loss32 = model(x, targets=y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits16, loss16 = model(x, targets=y)
        loss16.backward()
        cached = model.generate(x[:, :4], 8, temperature=0, use_cache=True)
        uncached = model.generate(x[:, :4], 8, temperature=0, use_cache=False)
        full = all_logits(model, uncached)  # the cache's one-token steps against the full forward, same tokens
        cache = model.make_cache()
        model(uncached[:, :4], cache=cache)
        steps = torch.cat([model(uncached[:, t:t + 1], cache=cache)[0] for t in range(4, 12)], dim=1)
    rel_rms = ((logits16.float() - logits32).norm() / logits32.norm()).item()
    assert rel_rms < BF16_LOGITS_REL_RMS[mode], f"{mode}: logits' relative RMS error {rel_rms:.2e}"
    # At init the logits are small (RMS ~0.13) and the loss is ~log(64): it moves by the logits' error weighted
    # by (softmax - one-hot), far less than that error. Measured over the same 12 seeds: 2.5e-4 relative at most
    # in the stream modes and attnres, 8.7e-4 in rd; the bound is 2e-3 relative (~8e-3 nats here)
    assert abs(loss16.item() / loss32.item() - 1) < 2e-3
    assert all(p.grad is not None for n, p in model.named_parameters() if "h.0.attn_res_query" not in n)
    # The cache's one-token steps against the full forward: bit for bit on this project's CPUs, but a matmul
    # over one row may round differently from one over many on other bf16 kernels (and flip a near-tie of
    # the greedy tokens), so what is asserted is agreement within bf16 rounding
    step_rms = ((steps.float() - full[:, 4:].float()).norm() / full[:, 4:].float().norm()).item()
    assert step_rms < BF16_LOGITS_REL_RMS[mode], f"{mode}: cached steps' relative RMS error {step_rms:.2e}"
    assert cached.shape == uncached.shape == (3, 12)


def test_cpu_bf16_attention_attends_in_float32(monkeypatch):
    """On a CPU under bf16 autocast, attention computes scaled_dot_product_attention in float32 (faster
    there, docs/speed.md) on the float32 upcasts of the bf16 q, k and v the projection made, and rounds the
    result back to bf16 for c_proj: bit for bit that computation, written out here (the same operations).
    At these sizes bf16 attention may round to the same bits, so the dtype attention is given is checked too."""
    torch.manual_seed(0)
    cfg = tiny_config()
    attn = CausalSelfAttention(cfg).eval()
    B, T, C, nh = 2, 7, cfg.n_embd, cfg.n_head
    x = torch.randn(B, T, C)
    sdpa, attended = F.scaled_dot_product_attention, []
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        with monkeypatch.context() as patch:
            patch.setattr(F, "scaled_dot_product_attention",
                          lambda q, k, v, **kw: attended.append((q.dtype, k.dtype, v.dtype)) or sdpa(q, k, v, **kw))
            y = attn(x)
        assert attended == [(torch.float32,) * 3]
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2))
        assert q.dtype == k.dtype == v.dtype == torch.bfloat16
        att = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        expected = attn.c_proj(att.to(torch.bfloat16).transpose(1, 2).reshape(B, T, C))
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected)


def test_flops_count_rd_lowrank_second_pass_of_a():
    """rd with low-rank c_attn applies the shared factor A to x_qk and to x_v: r x d more per token and
    layer than attnres. Checked against torch's own count of the forward's matmuls, with the routing's
    own work cancelled by the dense pair (dense rd and attnres do the same projection work)."""
    from torch.utils.flop_counter import FlopCounterMode
    rank, B, T = 4, 2, 16

    def counted(**overrides):
        model = GPT(tiny_config(**overrides)).eval()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(torch.zeros(B, T, dtype=torch.long))
        return counter.get_total_flops(), model.flops_per_token()

    (rd_lr, rd_lr_est), (at_lr, at_lr_est), (rd, rd_est), (at, at_est) = (
        counted(residual=mode, lowrank_rank=r) for mode, r in (("rd", rank), ("attnres", rank), ("rd", 0), ("attnres", 0)))
    cfg = tiny_config()
    second_pass = 2 * cfg.n_layer * rank * cfg.n_embd  # forward FLOPs per token of one more A
    assert (rd_lr - at_lr) - (rd - at) == B * T * second_pass
    assert (rd_lr_est - at_lr_est) - (rd_est - at_est) == 3 * second_pass
