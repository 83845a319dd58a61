"""
One GPT with switchable residual connections, in one file.

    standard   h_{j+1} = h_j + f_j(n_j(h_j))                   the GPT-2 residual stream
    attnres    x_j = route(w_j, sources)                        Attention Residuals (no stream)
    delta      x_j = h_j + route(w_j, sources)                  Delta Attention Residuals
    rd         attnres, with a second route for the values      Role-Decoupled AttnRes

A "sublayer" is half a transformer block: j = 0 .. 2L-1, even j attention, odd j MLP.
`route` is a softmax over depth (one weight per source, per token) with a learned
pseudo-query per route: one per sublayer input, plus rd's value routes and the output
route of attnres and rd. The sources are the embedding and what earlier sublayers
(or blocks of sublayers) added to the model. Optional low-rank linears (W = B A) with
a Duplicated Latent Residual (DLR). The math, equation by equation, is in the README.
"""

import importlib.util
import math
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

RESIDUAL_MODES = ("standard", "attnres", "delta", "rd")
LOWRANK_ACTIVATIONS = {"silu": F.silu, "identity": lambda z: z}
ROUTING_RMS_EPS = 1e-6  # eps of the gainless rmsnorm applied to routing keys
# The fused route for GPUs is route_kernels.py (Triton), imported only where a forward uses it: importing
# Triton costs about a second, which a CPU run never needs
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linears and LayerNorms, like GPT-2
    residual: str = "standard"  # standard | attnres | delta | rd
    res_blocks: int = 0  # how many routing blocks (2 * n_layer / res_blocks sublayers each); 0 = one per sublayer
    fixed_value_route: bool = False  # rd only: the value pseudo-queries stay zero (a uniform value route)
    lowrank_rank: int = 0  # 0 = dense linears, r > 0 = W = B A with rank r
    lowrank_act: str = "silu"  # activation between A and B: silu | identity
    dlr: bool = False  # add the Duplicated Latent Residual to every low-rank linear
    dlr_alpha: float = 1.0  # alpha in the DLR term (alpha / sqrt(K)) expand_K(z): fixed, not learned

    def __post_init__(self):
        def need(ok, field, allowed):
            if not ok:
                raise ValueError(f"GPTConfig.{field}={getattr(self, field)!r} is not allowed: {allowed}")

        def is_int(x):  # not a bool: True would pass as 1
            return isinstance(x, int) and not isinstance(x, bool)

        def is_number(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            need(is_int(getattr(self, name)) and getattr(self, name) > 0, name, "use a positive integer")
        for name in ("bias", "fixed_value_route", "dlr"):
            need(isinstance(getattr(self, name), bool), name, "use True or False")
        need(self.n_embd % self.n_head == 0, "n_embd", f"use a multiple of n_head={self.n_head}, or change n_head")
        need(is_number(self.dropout) and 0.0 <= self.dropout < 1.0, "dropout", "use a value in [0, 1)")
        need(self.residual in RESIDUAL_MODES, "residual", f"use one of {', '.join(RESIDUAL_MODES)}")
        n_sub = 2 * self.n_layer
        need(is_int(self.res_blocks) and self.res_blocks >= 0 and (self.res_blocks == 0 or n_sub % self.res_blocks == 0),
             "res_blocks", f"use 0 (per sublayer) or a divisor of 2 * n_layer = {n_sub}")
        need(not self.fixed_value_route or self.residual == "rd", "fixed_value_route",
             "only rd has a value route: set residual=rd or fixed_value_route=False")
        need(is_int(self.lowrank_rank) and 0 <= self.lowrank_rank <= self.n_embd, "lowrank_rank",
             f"use 0 (dense) or a rank in 1..n_embd={self.n_embd}")
        need(isinstance(self.lowrank_act, str) and self.lowrank_act in LOWRANK_ACTIVATIONS, "lowrank_act",
             f"use one of {', '.join(LOWRANK_ACTIVATIONS)}")
        need(not self.dlr or self.lowrank_rank > 0, "dlr", "DLR needs low-rank linears: set lowrank_rank > 0")
        need(is_number(self.dlr_alpha) and math.isfinite(self.dlr_alpha), "dlr_alpha", "use a finite number")

    @classmethod
    def from_dict(cls, d):
        """Like GPTConfig(**d), but an unknown key is a clear error rather than a TypeError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig key(s) {unknown}; known keys: {', '.join(sorted(known))}")
        return cls(**d)

    @property
    def sublayers_per_block(self):
        """How many consecutive sublayers share one routing block (1 = per-sublayer routing)."""
        return 1 if self.res_blocks == 0 else 2 * self.n_layer // self.res_blocks


# -----------------------------------------------------------------------------
# Low-rank linear with a Duplicated Latent Residual

class LowRankLinear(nn.Module):
    """
    y = B z + bias  [+ (alpha / sqrt(K)) expand_K(z)  when dlr],   z = act(A x), the rank-r latent
    A: r x d_in, B: d_out x r, K = ceil(d_out / r), expand_K(z)[o] = z[o // K].
    """

    def __init__(self, d_in, d_out, rank, bias, act="silu", dlr=False, dlr_alpha=1.0):
        super().__init__()
        self.A = nn.Linear(d_in, rank, bias=False)
        self.B = nn.Linear(rank, d_out, bias=bias)
        self.act = LOWRANK_ACTIVATIONS[act]
        self.dlr = dlr
        if dlr:
            K = math.ceil(d_out / rank)
            # expand_K as a matrix: R[o, i] = 1 if i == o // K. B z + s R z = (B + s R) z, so the
            # DLR term costs one d_out x r add per step instead of a pass over every token.
            # Both buffers are non-persistent: DLR adds nothing to the state dict.
            R = F.one_hot(torch.arange(d_out) // K, rank).float()
            self.register_buffer("dlr_matrix", R, persistent=False)
            self.register_buffer("dlr_scale", torch.tensor(dlr_alpha / math.sqrt(K)), persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        # DLR/CoLA init: A and B both with std r^-1/4 (d_in + d_out)^-1/4, so B A has std ~ (d_in + d_out)^-1/2
        std = self.A.out_features ** -0.25 * (self.A.in_features + self.B.out_features) ** -0.25
        nn.init.normal_(self.A.weight, std=std)
        nn.init.normal_(self.B.weight, std=std)
        if self.B.bias is not None:
            nn.init.zeros_(self.B.bias)

    def up_weight(self):
        """B, or B + (alpha/sqrt(K)) R with DLR: the weight the latents are multiplied by."""
        return self.B.weight + self.dlr_scale * self.dlr_matrix if self.dlr else self.B.weight

    def forward(self, x, rows=slice(None)):
        """rows: compute only these output features (rd takes c_attn's q, k rows from one input, its v rows from another)."""
        z = self.act(self.A(x))
        bias = None if self.B.bias is None else self.B.bias[rows]
        return F.linear(z, self.up_weight()[rows], bias)

    @torch.no_grad()
    def fold_dlr(self):
        """B <- B + (alpha/sqrt(K)) R (README, "Low-rank linears and DLR"), then the DLR term is off: the same
        outputs at the plain low-rank cost."""
        if self.dlr:
            self.B.weight.copy_(self.up_weight())
            self.dlr = False
            del self.dlr_matrix, self.dlr_scale


def make_linear(config, d_in, d_out):
    """A transformer linear: dense, or low-rank (with DLR) when config.lowrank_rank > 0."""
    if config.lowrank_rank == 0:
        return nn.Linear(d_in, d_out, bias=config.bias)
    return LowRankLinear(d_in, d_out, config.lowrank_rank, config.bias, config.lowrank_act, config.dlr, config.dlr_alpha)


def linear_rows(linear, x, rows):
    """Output features `rows` of a dense or low-rank linear, computing only those rows."""
    if isinstance(linear, LowRankLinear):
        return linear(x, rows)
    return F.linear(x, linear.weight[rows], None if linear.bias is None else linear.bias[rows])


# -----------------------------------------------------------------------------
# The backbone: GPT-2's attention, MLP and block, with GPT-2's parameter names

class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_attn = make_linear(config, config.n_embd, 3 * config.n_embd)  # q, k, v rows, in that order
        self.c_proj = make_linear(config, config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x, x_v=None, cache=None, layer=None):
        """x: the normalised input; x_v (rd): the normalised input of the values, None to take them from x.
        cache: a KVCache (begun for this forward's tokens), with this attention's layer index."""
        B, T, C = x.size()
        if x_v is None:
            q, k, v = self.c_attn(x).split(C, dim=2)
        else:
            # rd: queries and keys from the QK route's input, values from the value route's input,
            # each computed with only its own rows of c_attn: dense, RD costs no extra projection FLOPs;
            # low-rank, the shared factor A runs on both inputs (r x d more per token).
            q, k = linear_rows(self.c_attn, x, slice(0, 2 * C)).split(C, dim=2)
            v = linear_rows(self.c_attn, x_v, slice(2 * C, 3 * C))
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        mask, is_causal = None, True
        if cache is not None:
            k_seen, v_seen = cache.write(layer, k, v)
            if not cache.from_empty:  # (a prompt into an empty cache attends causally to itself: k, v as they are)
                k, v, mask, is_causal = k_seen, v_seen, cache.visible, False
        dtype = q.dtype
        if q.device.type == "cpu" and q.dtype == torch.bfloat16:
            # PyTorch's CPU flash attention is slower in bf16 than in fp32 (docs/speed.md, "Measurements
            # behind the code"), while the projections around it gain from bf16: attend in fp32
            q, k, v = q.float(), k.float(), v.float()
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.to(dtype).transpose(1, 2).contiguous().view(B, T, C)  # back from fp32 (as autocast would round it for c_proj)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = make_linear(config, config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = make_linear(config, 4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, keeping less for the backward under CUDA autocast when its input is bfloat16 (the
    fused route's mixes, with bf16 sources). CUDA autocast runs layer_norm in float32, so it would save
    a float32 copy of the input: 4 more bytes an element for every routed sublayer, where the route
    already keeps the input itself in 2. Here the backward makes that copy again instead (one pass
    over the input): the same operations on the same numbers, so the same bits. Elsewhere (float32
    input; CPU autocast, which normalises bfloat16 as it is; torch.compile, which chooses what to
    save itself; and without autograd, which saves nothing) it is nn.LayerNorm."""

    def forward(self, x):
        saves_an_upcast_copy = (x.is_cuda and x.dtype != torch.float32 and torch.is_grad_enabled()
                                and torch.is_autocast_enabled("cuda") and self.weight.dtype == torch.float32
                                and not torch.compiler.is_compiling())
        if not saves_an_upcast_copy:
            return super().forward(x)
        return LayerNormOfUpcast.apply(x, self.weight, self.bias, self.eps)


class LayerNormOfUpcast(torch.autograd.Function):
    """layer_norm(x.float()), what autocast computes, saving x (not x.float()) and the per-token mean
    and 1/std for the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        with torch.autocast(x.device.type, enabled=False):
            y, mean, rstd = torch.native_layer_norm(x.float(), x.shape[-1:], weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        wanted = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1],
                  bias is not None and ctx.needs_input_grad[2]]
        with torch.autocast(x.device.type, enabled=False):
            grad_x, grad_w, grad_b = torch.ops.aten.native_layer_norm_backward(
                grad_y, x.float(), x.shape[-1:], mean, rstd, weight, bias, wanted)
        return None if grad_x is None else grad_x.to(x.dtype), grad_w, grad_b, None


class Block(nn.Module):
    """One transformer layer: two sublayers, attention (j = 2l) and MLP (j = 2l + 1), each with its pre-norm."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        if config.residual != "standard":  # routing pseudo-queries, zero = uniform weights at init
            self.attn_res_query = nn.Parameter(torch.zeros(config.n_embd))
            self.mlp_res_query = nn.Parameter(torch.zeros(config.n_embd))
        if config.residual == "rd":
            self.attn_res_query_v = nn.Parameter(torch.zeros(config.n_embd))  # starts equal to attn_res_query
            # the RD paper's control: a value route that never learns reads a uniform mix of its sources
            self.attn_res_query_v.requires_grad_(not config.fixed_value_route)

    def attn_sublayer(self, x, x_v=None, cache=None, layer=None):
        return self.attn(self.ln_1(x), None if x_v is None else self.ln_1(x_v), cache, layer)

    def mlp_sublayer(self, x):
        return self.mlp(self.ln_2(x))


# -----------------------------------------------------------------------------
# Routing: the one operation every routed mode shares

def routing_logits(s, queries):
    """w . rmsnorm(s) for every row w of queries (rmsnorm without a gain: a gain would only rescale w).
    Computed as (s . w) / rms(s), so no normalised copy of s is made or kept for the backward pass.
    mean(s^2) = |s|^2 / d from one fused norm: its backward is one pass over s, where pow(2).mean()
    takes three. All of it in at least float32, as the fused route computes it, also under autocast:
    a bfloat16 logit of size 40 is off by up to 0.125, and autocast would make and keep a bfloat16
    copy of every source for this small matmul."""
    dtype = torch.promote_types(s.dtype, torch.float32)
    norm = torch.linalg.vector_norm(s, dim=-1, keepdim=True, dtype=dtype)
    inv_rms = torch.rsqrt(norm.square() / s.size(-1) + ROUTING_RMS_EPS)
    # (autocast off where there is one to turn off: torch 2.4 has none for MPS, and refuses to make one)
    no_autocast = torch.autocast(s.device.type, enabled=False) if s.device.type in ("cpu", "cuda") else nullcontext()
    with no_autocast:
        return (s.to(dtype) @ queries.to(dtype).t()) * inv_rms


def reference_route(w, sources):
    """The route as the README's "Routing" section defines it, one source at a time: the definition
    DepthSources.route must equal (tests/test_model.py checks it, in float64, to rounding).

        a_i = softmax_i( w . rmsnorm(s_i) )      per token, a softmax over depth
        route(w, s) = sum_i a_i s_i
    """
    logits = []
    for s in sources:
        key = s / torch.sqrt(s.pow(2).mean(dim=-1, keepdim=True) + ROUTING_RMS_EPS)  # rmsnorm, no gain
        logits.append(key @ w)  # [B, T]
    a = torch.stack(logits).softmax(dim=0)  # [m, B, T]: over depth, for each token
    mix = torch.zeros_like(sources[0])
    for a_i, s_i in zip(a, sources):
        mix = mix + a_i.unsqueeze(-1) * s_i
    return mix


class DepthSources:
    """
    The sources routed sublayers attend over, and the route over them, computed fast. The math is
    reference_route's, above:

        a_i = softmax_i( w . rmsnorm(s_i) )      per token, a softmax over depth
        mix = sum_i a_i s_i

    The sources are [e, b_1, .., b_{k-1}, p]: the embedding, the sum of the outputs of each
    completed routing block, and the running sum p of the current block (left out while the
    block is empty). With one sublayer per block this is [e, out_0, .., out_{j-1}]. attnres,
    delta and rd all use these same sources: in delta the README names them [e, D_1, .., P], the
    stream's changes, and e + sum_k D_k + P = h_j.

    fused_route: route_kernels.fused_route (GPUs), which computes a route's logits, softmax and mix
    in one pass over its sources, or None for the plain route below. dtype: what the sources are
    stored in (the fused route does its math in float32 whatever it is).
    """

    def __init__(self, e, queries, collect=False, fused_route=None, dtype=None):
        self.queries = queries  # [R, d]: every pseudo-query of the model, one row per route
        self.dtype = dtype or e.dtype  # by default the embedding's precision (the stream's, in delta)
        self.completed = []  # the completed sources [e, b_1, ..], each [B, T, d]
        self.logits = None  # [R, m, B, T]: the logit of every completed source (dim 1) for every route (dim 0)
        self.partial = None  # p, the running sum of the current block
        self.collect = collect
        # the diagnostics read the depth weights, which the fused route never forms
        self.fused_route = None if collect else fused_route
        self.weights = {}  # route -> mean depth weights over batch and positions (when collecting)
        self.add(e)
        self.end_block()

    def add(self, out):
        """A sublayer's output joins the current block's running sum p."""
        out = out.to(self.dtype)  # under autocast outputs arrive in bf16; one dtype keeps every routing op on its fast path
        self.partial = out if self.partial is None else self.partial + out

    def end_block(self):
        """The current block is complete: p becomes a source of its own."""
        if self.fused_route is None:
            # The pseudo-queries do not depend on the input, so a new source's logits against every route
            # are one [B, T, d] x [d, R] matmul, made once here and kept route-major: a route then reads
            # its logits as one slice, not a pass over [B, T, d] per source. (The fused route computes
            # its logits in the kernel, as it reads each source.)
            logits = routing_logits(self.partial, self.queries).permute(2, 0, 1).unsqueeze(1)  # [R, 1, B, T]: w_r . rmsnorm(p)
            self.logits = logits if self.logits is None else torch.cat([self.logits, logits], dim=1)
        self.completed.append(self.partial)
        self.partial = None

    def sources(self):
        """The sources a route reads now: the completed ones, and p once the current block holds an output."""
        return self.completed if self.partial is None else self.completed + [self.partial]

    def route_pair(self, r, r_v):
        """(route r, route r_v) over the same sources: rd's Q/K and value routes. The fused kernel computes
        both in one pass, each source read once for both and its gradient written once."""
        if self.fused_route is not None:
            return self.fused_route(self.queries[r], self.sources(), self.queries[r_v])
        return self.route(r), self.route(r_v)

    def route(self, r):
        """x = sum_i a_i s_i with a = softmax_i(w_r . rmsnorm(s_i)) over the current sources."""
        if self.fused_route is not None:
            return self.fused_route(self.queries[r], self.sources())
        logits = self.logits[r]  # [m, B, T]
        if self.partial is not None:  # p changes after every sublayer, so its logit is computed per route
            p_logit = routing_logits(self.partial, self.queries[r:r + 1])  # [B, T, 1]
            logits = torch.cat([logits, p_logit.permute(2, 0, 1)])
        sources = self.sources()
        a = logits.softmax(dim=0).to(self.dtype).unsqueeze(-1)  # [m, B, T, 1], a[i] contiguous; float32 logits, sources' dtype mix
        if self.collect:
            self.weights[r] = a.detach().float().mean(dim=(1, 2, 3)).cpu()
        if not torch.is_grad_enabled():  # inference (no memory to save): 3 calls instead of 2m small ones
            return (torch.stack(sources) * a).sum(dim=0)
        # A running addcmul, nothing stacked, so autograd keeps each source once: memory O(depth), where a
        # stack per route would keep O(depth^2). The papers' two-phase mix (a block's routes in one batched
        # matmul over stacked sources) measured slower than this eagerly (docs/speed.md, "Tried, measured
        # slower, left out"); torch.compile fuses each route into one loop, and on a GPU the fused route does that.
        a = a.unbind(0)
        mix = sources[0] * a[0]
        for s_i, a_i in zip(sources[1:], a[1:]):
            mix = torch.addcmul(mix, s_i, a_i)
        return mix


def route_table(config):
    """Every route of a model, in row order: (name, its pseudo-query's parameter name, m = how many
    sources it reads). The one place routes are numbered: route_queries() stacks the pseudo-queries
    in this order, forward() finds a route's row by name, the diagnostics name the rows from it.
    Rows: the input route of every sublayer (row j = sublayer j), then rd's value routes, then the
    output route of attnres and rd (no stream: the output is one more route). standard has none."""
    if config.residual == "standard":
        return []
    L, per_block = config.n_layer, config.sublayers_per_block

    def sources(j):  # e, the completed blocks before sublayer j, and the block in progress once it holds an output
        return 1 + j // per_block + (j % per_block > 0)
    table = [(f"L{j // 2}.{kind}", f"transformer.h.{j // 2}.{kind}_res_query", sources(j))
             for j, kind in zip(range(2 * L), ("attn", "mlp") * L)]
    if config.residual == "rd":
        table += [(f"L{l}.attn.v", f"transformer.h.{l}.attn_res_query_v", sources(2 * l)) for l in range(L)]
    if config.residual in ("attnres", "rd"):
        table.append(("out", "transformer.res_query_out", 1 + 2 * L // per_block))
    return table


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        if config.residual in ("attnres", "rd"):  # replacement routing has no stream: the output is one more route
            self.transformer.res_query_out = nn.Parameter(torch.zeros(config.n_embd))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.routes = route_table(config)
        self.route_row = {name: r for r, (name, _, _) in enumerate(self.routes)}
        self.last_routing = None  # filled by forward(..., collect_routing=True)
        # how the routes run, not what they compute (so not in the config, nor in checkpoints):
        self.fused_route = "auto"  # auto: fused on CUDA where Triton imports | True: fused (CPU: Triton's interpreter) | False
        self.bf16_sources = True  # fused, under bfloat16 autocast: sources (and block sums) in bfloat16, the kernel's math in float32
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """Every parameter's initialisation, in one place:

            wte (tied to lm_head), wpe          N(0, 0.02)                          GPT-2
            dense Linear weights                N(0, 0.02)                          GPT-2
            c_proj weights (dense)              N(0, 0.02 / sqrt(2 L))              GPT-2's scaled residual projections
            Linear biases                       0
            LayerNorm gains, biases             1, 0                                PyTorch's default
            low-rank A, B (LowRankLinear)       N(0, r^-1/4 (d_in + d_out)^-1/4)    so B A has std ~ (d_in + d_out)^-1/2
            pseudo-queries (every *res_query*)  0

        Zero pseudo-queries make every route uniform, and a uniform route is the standard model up to
        a LayerNorm-ignored scale (README, "Exact equivalences", 1): every routed mode starts as the
        standard function. They also draw no random numbers, so one seed gives one backbone in every
        mode, which the paired comparisons rely on. The draws come in this order (GPT-2's over every
        Linear and Embedding, low-rank factors included, then the low-rank recipe over those, then
        c_proj), the order the published runs were made with.
        """
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, LowRankLinear):
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))
        for _, query, _ in self.routes:
            nn.init.zeros_(self.get_parameter(query))

    def get_num_params(self, non_embedding=True):
        """Parameter count; the position embedding is left out by default (the token one is the tied head)."""
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    # --- routes: row r of route_queries() is the pseudo-query of route r (route_table)

    def route_queries(self):
        """All pseudo-queries as one [R, d] matrix, in route_table's row order."""
        return torch.stack([self.get_parameter(query) for _, query, _ in self.routes])

    def route_names(self):
        """A readable name for each route row, e.g. 'L3.attn', 'L3.attn.v', 'out'."""
        return [name for name, _, _ in self.routes]

    def route_source_counts(self):
        """m, the number of sources each route reads (same order as route_queries)."""
        return [m for _, _, m in self.routes]

    def route_implementation(self, device):
        """(the fused route function or None, the sources' dtype or None) of a forward on device:
        route_kernels.fused_route on a GPU, with its sources in bfloat16 under bfloat16 autocast (half the
        bytes of every routing pass; docs/speed.md, "On a GPU", measures what it buys and what it costs
        in loss); None, None: the plain route, sources in the embedding's dtype. The plain route makes
        a memory pass per (route, source) pair, and four more backward: on a GPU at GPT-2-small shape
        that made routed training 2-4x slower than standard. The fused kernel reads each source once
        and keeps no copies for the backward."""
        if not (self.fused_route == "auto" or isinstance(self.fused_route, bool)):  # (1 == True: not a bool)
            raise ValueError(f"fused_route={self.fused_route!r}: use 'auto', True or False")
        if not (self.fused_route is True or (self.fused_route == "auto" and device.type == "cuda" and TRITON_INSTALLED)):
            return None, None
        import route_kernels as kernels  # not `kernels`: Hugging Face's package of that name
        if not kernels.available(device):
            if self.fused_route is True:
                raise RuntimeError(f"fused_route=True on {device}: {kernels.why_unavailable(device)}")
            # auto: the plain route computes the same, slower (Python shows a warning once per place)
            warnings.warn(f"routes take model.py's plain route on {device}: {kernels.why_unavailable(device)}")
            return None, None
        kind = device.type
        bf16 = self.bf16_sources and torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16
        return kernels.fused_route, torch.bfloat16 if bf16 else None

    def make_cache(self):
        """An empty key-value cache for incremental decoding (see generate)."""
        return KVCache(self.config.n_layer, self.config.block_size, self.lm_head.weight.device)

    def forward(self, idx, targets=None, cache=None, collect_routing=False):
        device = idx.device
        t = idx.size(1)
        if t > self.config.block_size:
            raise ValueError(f"cannot forward {t} positions, block_size is {self.config.block_size}: "
                             f"pass the last {self.config.block_size} tokens (generate() does)")
        # with a cache: the positions after those already written
        pos = torch.arange(t, dtype=torch.long, device=device) if cache is None else cache.begin(t)

        e = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        mode, L = self.config.residual, self.config.n_layer
        depth = None
        if mode != "standard":
            fused_route, source_dtype = self.route_implementation(device)
            depth = DepthSources(e, self.route_queries(), collect_routing, fused_route, source_dtype)
        per_block = self.config.sublayers_per_block
        replaces_stream = mode in ("attnres", "rd")  # no residual stream: every input, and the output, is a route
        h = e  # the stream h_0 = e (standard, delta; attnres and rd have none)
        row = self.route_row
        for j in range(2 * L):
            layer = self.transformer.h[j // 2]  # a transformer Block (attention, then MLP): not a routing block
            route_name = f"L{j // 2}.{'mlp' if j % 2 else 'attn'}"  # its input route's, as route_table names it
            # the sublayer's input x_j, where the modes differ most (also: the stream update and the output, below)
            x_v = None
            if mode == "standard":
                x = h  # x_j = h_j
            elif mode == "delta":
                x = h + depth.route(row[route_name])  # x_j = h_j + route(w_j, [e, D_1, .., P])
            elif mode == "rd" and j % 2 == 0:
                x, x_v = depth.route_pair(row[route_name], row[route_name + ".v"])  # x_qk = route(w_j, ..), x_v = route(w_v, ..)
            else:
                x = depth.route(row[route_name])  # attnres, rd's MLP: x_j = route(w_j, [e, b_1, .., p])
            if j % 2 == 0:
                out = layer.attn_sublayer(x, x_v, cache, j // 2)
            else:
                out = layer.mlp_sublayer(x)
            if not replaces_stream:
                h = h + out  # h_{j+1} = h_j + f_j(n_j(x_j))
            if depth is not None:
                depth.add(out)  # p += out_j
                if (j + 1) % per_block == 0:
                    depth.end_block()  # p becomes b_k (attnres) or D_k (delta)
        if replaces_stream:
            h = depth.route(row["out"])  # the output route, over all completed sources
        if depth is not None and collect_routing:
            self.last_routing = routing_stats(depth.weights, self.route_names())
        x = self.transformer.ln_f(h)

        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])  # inference: only the last position is needed
            loss = None
        return logits, loss

    # --- training helpers

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, res_query_lr_mult=1.0):
        """AdamW with three groups: matrices (decayed), vectors (not decayed), and the routing
        pseudo-queries (not decayed; lr scaled by res_query_lr_mult, stored as the group's
        'lr_mult' for the training loop to apply)."""
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}  # fixed_value_route's value queries: not trained
        is_query = {query for _, query, _ in self.routes}
        queries = [p for pn, p in params.items() if pn in is_query]
        decay = [p for pn, p in params.items() if pn not in is_query and p.dim() >= 2]
        no_decay = [p for pn, p in params.items() if pn not in is_query and p.dim() < 2]
        grouped = [id(p) for group in (queries, decay, no_decay) for p in group]
        assert sorted(grouped) == sorted(id(p) for p in params.values()), "every trained parameter in exactly one group"
        groups = [
            {"params": decay, "weight_decay": weight_decay, "lr_mult": 1.0},
            {"params": no_decay, "weight_decay": 0.0, "lr_mult": 1.0},
        ]
        if queries:
            groups.append({"params": queries, "weight_decay": 0.0, "lr_mult": res_query_lr_mult})
        for g in groups:
            g["lr"] = learning_rate * g["lr_mult"]
        # the fused kernel (one op for all parameters) exists for CUDA and, since torch 2.4, for CPU
        fused = device_type in ("cuda", "cpu")
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self):
        """Training FLOPs (forward + backward, 3x forward) per token, counting every matmul weight
        (low-rank factors included, the tied head once), attention scores, and the routing."""
        cfg = self.config
        d, T, L = cfg.n_embd, cfg.block_size, cfg.n_layer
        matmul_params = self.get_num_params() - sum(p.numel() for pn, p in self.named_parameters()
                                                    if p.dim() < 2)  # vectors are no matmul work
        flops = 6 * matmul_params + 12 * L * d * T
        if cfg.residual != "standard":
            counts = self.route_source_counts()
            n_routes, n_sources = len(counts), 1 + 2 * L // cfg.sublayers_per_block
            # per route: the weighted sum of its m sources (2 d m); per completed source: its logits against every
            # route's query, made once and reused by every route that reads it (2 d R). Left out, being small: the
            # norms, and the plain route's logit of the block in progress (2 d per route that reads one).
            # (The plain route's count: the fused route computes each route's m logits itself, the same order.)
            route_fwd = sum(2 * d * m for m in counts) + n_sources * 2 * d * n_routes
            flops += 3 * route_fwd
        if cfg.residual == "rd" and cfg.lowrank_rank:
            # rd with low-rank c_attn: its shared A (r x d) runs on x_qk and again on x_v
            flops += 6 * L * cfg.lowrank_rank * d
        return flops

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=312e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (default: A100 bf16, 312 TFLOP/s)."""
        flops_per_iter = self.flops_per_token() * self.config.block_size * fwdbwd_per_iter
        return flops_per_iter / dt / peak_flops

    @torch.no_grad()
    def fold_dlr(self):
        """Absorb every DLR term into its B (README, "Low-rank linears and DLR"); then config.dlr = False."""
        for m in self.modules():
            if isinstance(m, LowRankLinear):
                m.fold_dlr()
        self.config.dlr = False

    def compile_sublayers(self, **options):
        """torch.compile each layer's two sublayers (norm and attention, norm and MLP) in place, leaving the
        routes between them eager: for training, in place of compiling the whole model. Every layer's
        sublayers run the same code on the same shapes, so two graphs (each with its backward; two more
        for evaluation) serve all the layers, and the compile takes about as long at any depth and in
        every mode. The whole model's graph unrolls every layer and every route, and no two routes read
        the same number of sources. What it gives up is compiling the routes: on a CPU, the compiled model
        runs each route as one fused loop. On a GPU, the fused route is one kernel either way. Attention
        with a key-value cache (generation) stays eager: which layer's cache it writes would make every
        layer a graph of its own (compile_decoding compiles that step whole). options: torch.compile's.
        docs/speed.md ("Compiling the sublayers") has the numbers. Once per model: a second call does nothing."""
        if getattr(self, "sublayers_compiled", False):
            return self
        for block in self.transformer.h:
            attn_eager, attn_compiled = block.attn_sublayer, torch.compile(block.attn_sublayer, **options)

            # (eager and compiled as defaults: bound now, per block, not the loop's last values at call time)
            def attn_sublayer(x, x_v=None, cache=None, layer=None, eager=attn_eager, compiled=attn_compiled):
                return (compiled if cache is None else eager)(x, x_v, cache, layer)
            block.attn_sublayer = attn_sublayer
            block.mlp_sublayer = torch.compile(block.mlp_sublayer, **options)
        self.sublayers_compiled = True
        return self

    def compile_decoding(self):
        """A compiled one-token step, step(idx, cache) -> logits, separate from any compiled training
        forward. The cache's shapes never change, so every position runs the same graph (fullgraph:
        a graph break is an error, not a silent slowdown); on a GPU it is replayed as a CUDA graph
        (mode="reduce-overhead"), because one-token decoding is launch-bound: a routed sublayer
        launches about 15 small kernels where a residual add launches one."""
        cuda = self.lm_head.weight.is_cuda
        compiled = torch.compile(self, mode="reduce-overhead" if cuda else None, dynamic=False, fullgraph=True)

        def step(idx, cache):
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are used up: their memory may be reused
            logits, _ = compiled(idx, cache=cache)
            return logits
        return step

    @torch.no_grad()
    def generate_tokens(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True,
                        vocab_size=None, decode_step=None):
        """Continue idx (b, t), yielding each new token (b, 1) as soon as it is chosen (sample.py
        streams them). temperature=0 is greedy decoding; otherwise see choose_next_token for top_k and
        top_p. With the key-value cache each new token costs one one-token forward (decode_step, e.g.
        compile_decoding(), or the model itself); once the context is full the window slides, positions
        shift, and every step is a full forward over the last block_size tokens, as without the cache
        (a cache would be written and never read).
        vocab_size: sample only ids below it (a vocabulary padded for speed has ids no tokenizer can decode)."""
        block_size = self.config.block_size
        decode_step = decode_step or (lambda token, cache: self(token, cache=cache)[0])
        cache, cached = None, 0  # cached: positions in the cache (kept here, in Python, not read from it)
        for _ in range(max_new_tokens):
            if cache is not None and cached < block_size:
                # a copy: a view of idx has strides that grow with it, and a compiled step guards on strides
                logits = decode_step(idx[:, -1:].clone(memory_format=torch.contiguous_format), cache)
                cached += 1
            else:
                cache = self.make_cache() if use_cache and idx.size(1) < block_size else None
                logits, _ = self(idx[:, -block_size:], cache=cache)
                cached = min(idx.size(1), block_size)
            logits = logits[:, -1, :vocab_size].float()  # float16 logits / a low temperature would overflow to inf
            idx_next = choose_next_token(logits, temperature, top_k, top_p)
            idx = torch.cat((idx, idx_next), dim=1)
            yield idx_next

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True):
        """idx (b, t) continued by max_new_tokens tokens, as one tensor (b, t + max_new_tokens)."""
        new = list(self.generate_tokens(idx, max_new_tokens, temperature, top_k, top_p, use_cache))
        return torch.cat([idx, *new], dim=1)


# -----------------------------------------------------------------------------
# Decoding: the key-value cache and the choice of the next token

class KVCache:
    """Keys and values of the positions seen so far, for incremental decoding. Every buffer has its
    final shape from the start ([B, nh, max_len, hs] per layer, zeros where nothing is written yet)
    and the number of positions written is a tensor, `position`: a one-token step then has the
    same shapes and the same Python at every position, so torch.compile makes one decode graph
    (and on a GPU one CUDA graph, which needs the buffers to keep their addresses). The price is
    that attention reads all max_len slots, masked, where it could read the written ones (eager on a
    CPU it reads only those: there, that read is what a step costs)."""

    def __init__(self, n_layer, max_len, device):
        self.max_len = max_len
        self.k, self.v = [None] * n_layer, [None] * n_layer
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.pos = self.visible = self.slots = self.from_empty = None  # the current forward's (see begin)
        if self.position.is_cuda:  # CUDA graphs may update an input in place only at an address that never changes
            torch._dynamo.mark_static_address(self.position)

    def begin(self, t):
        """A forward of t new tokens starts: their positions [t] (after those written), and which
        slots each of them sees once written (`visible`, [t, slots], True = attend: causal, nothing
        unwritten; None for a prompt into an empty cache), computed once here for every layer."""
        eager = not torch.compiler.is_compiling()
        # Reading how many positions are written is free on a CPU but waits for a GPU, so one-token steps
        # on a GPU (and compiled steps) skip it, and the room check with it. Writing past the end there fails
        # as a device-side assert in wpe, which ends the CUDA context; generate_tokens counts its positions
        # and never does.
        written = int(self.position) if eager and (t > 1 or self.position.device.type == "cpu") else None
        if written is not None and written + t > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions, {written} are written: no room for {t} more "
                             "(start a new cache, with the last block_size tokens, as generate does)")
        # a prompt written into an empty cache sees only itself: attention stays plain causal attention
        # over the new keys (flash attention on a GPU), not a masked pass over every slot
        self.from_empty = t > 1 and written == 0
        self.pos = self.position + torch.arange(t, device=self.position.device)
        self.position += t  # in place: a compiled decode step keeps reading the same tensor
        self.slots = self.max_len
        if self.pos.device.type == "cpu" and eager:
            # eager on a CPU, attention over every slot is what a step pays for: read only the written ones
            # (docs/speed.md, "Measurements behind the code"); compiled, the shapes must not change
            self.slots = written + t
        self.visible = None if self.from_empty else torch.arange(self.slots, device=self.pos.device) <= self.pos[:, None]
        return self.pos

    def write(self, layer, k, v):
        """Store one layer's k, v [B, nh, t, hs] at this forward's positions; returns the keys and
        values of every slot the new positions may see."""
        if self.k[layer] is None:  # allocate on first use, in the dtype the model computes in (autocast or not)
            B, nh, _, hs = k.shape
            # zeros, not empty: masked slots still enter the attention matmuls, and 0 x NaN is NaN
            self.k[layer] = k.new_zeros(B, nh, self.max_len, hs)
            self.v[layer] = v.new_zeros(B, nh, self.max_len, hs)
            if k.is_cuda:
                torch._dynamo.mark_static_address(self.k[layer])
                torch._dynamo.mark_static_address(self.v[layer])
        self.k[layer].index_copy_(2, self.pos, k)
        self.v[layer].index_copy_(2, self.pos, v)
        return self.k[layer][:, :, :self.slots], self.v[layer][:, :, :self.slots]


def choose_next_token(logits, temperature=1.0, top_k=None, top_p=None):
    """One token id per row of logits (b, vocab), as (b, 1). temperature=0: the most likely one;
    otherwise a draw from softmax(logits / temperature) over the tokens keep_likeliest keeps."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # the largest logit moved to 0 first: at a tiny temperature logits / temperature would overflow to inf, and
    # inf - inf is NaN in the softmax; this way the others go to -inf, and the draw is the most likely token. (A
    # temperature that rounds to 0 in the logits' dtype is taken as its smallest normal number: 0 / 0 is NaN.)
    temperature = max(temperature, torch.finfo(logits.dtype).tiny)
    logits = keep_likeliest((logits - logits.amax(dim=-1, keepdim=True)) / temperature, top_k, top_p)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


def keep_likeliest(logits, top_k=None, top_p=None):
    """logits (b, vocab) with -inf outside the top_k most likely tokens and then outside the nucleus:
    the fewest most likely tokens whose probabilities add up to top_p or more, and never fewer than one
    (top_p=0: the most likely token alone). top_k None or 0, top_p None or 1: every token. The order and
    the rule are Hugging Face's (its top-k, then its top-p logits warper)."""
    if top_p is not None and not 0 <= top_p <= 1:
        raise ValueError(f"top_p={top_p} is not a probability mass: give one from 0 to 1 (1 keeps every token)")
    if top_k:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits = logits.masked_fill(logits < v[:, [-1]], -float("inf"))
    if top_p is not None and top_p < 1:
        probs, order = F.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        # a token is outside the nucleus when the tokens more likely than it already reach top_p;
        # the most likely token is always in
        outside = probs.cumsum(dim=-1) - probs >= top_p
        outside[:, 0] = False
        logits = logits.masked_fill(outside.scatter(-1, order, outside), -float("inf"))  # back to vocabulary order
    return logits


# -----------------------------------------------------------------------------
# Routing diagnostics

def routing_stats(weights, names):
    """Per route: the mean depth distribution over batch and positions, its max weight, its entropy
    normalised by log(m), and for rd the Jensen-Shannon divergence between each layer's QK and V
    routes. A route with a single source makes no choice and gets no statistics."""
    stats, by_name = {}, {names[r]: p for r, p in weights.items()}
    for r, p in sorted(weights.items()):
        m = p.numel()
        entry = {"weights": p.tolist(), "sources": m}
        if m > 1:
            entropy = -(p * p.clamp_min(1e-12).log()).sum().item()
            entry.update(max_weight=p.max().item(), entropy=entropy / math.log(m))
        stats[names[r]] = entry
    for name in stats:
        if name.endswith(".attn.v") and stats[name]["sources"] > 1:  # rd's value routes, against their QK route
            stats[name]["js_qk_v"] = js_divergence(by_name[name[:-2]], by_name[name])
    return stats


def js_divergence(p, q):
    """Jensen-Shannon divergence (nats) of two distributions: mean KL to their average."""
    mid = 0.5 * (p + q)
    kl = lambda a, b: (a * (a.clamp_min(1e-12) / b.clamp_min(1e-12)).log()).sum().item()
    return 0.5 * kl(p, mid) + 0.5 * kl(q, mid)

