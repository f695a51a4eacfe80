"""
models.py - the PyTorch models of the toy Janus pipeline, written to compute exactly what
flexdiag computes on the exported weights.

VQ-VAE (Janus VQ-16 / LlamaGen layout, transformers `janus` names on export):
  decoder (what flexdiag runs, runtime/image/vq.c): codebook row (L2-normalised) ->
  post_quant_conv 1x1 (embed_dim -> z) -> conv_in 3x3 (z -> ch*mult[-1]) -> mid ResBlock,
  AttnBlock, ResBlock -> levels from the lowest resolution: (num_res_blocks + 1) ResBlocks, each
  followed by an AttnBlock on the lowest level only, then nearest x2 + conv 3x3 (not on the full
  resolution level) -> GroupNorm(32, eps 1e-6) + swish -> conv_out 3x3 -> RGB in about [-1, 1].
  encoder (only used for training; flexdiag skips it): conv_in, per level num_res_blocks
  ResBlocks (+ AttnBlocks on the lowest level) and a stride-2 conv (pad right/bottom), mid,
  norm_out + swish, conv_out -> z, quant_conv 1x1 -> embed_dim.
  quantiser: LlamaGen VectorQuantizer(l2_norm=True): z and codebook rows L2-normalised, nearest
  row by cosine, straight-through; commitment loss beta = 0.25.

Janus LM (runtime/engine: layer.c, heads.c): Llama decoder (RMSNorm eps 1e-6, RoPE rotate-half
theta 10000, SwiGLU, no biases, MHA) over [prompt embed_tokens rows, image rows], image tokens
entering as gen_aligner(gen_embed(id)) (Linear, GELU, Linear), logits from gen_head (Linear,
GELU(erf), Linear). Positions: prompt row r at r, image token t at len(prompt) + t.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---------------------------------------------------------------- VQ-VAE

def _norm(c):
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


def swish(x):
    return x * torch.sigmoid(x)


class ResBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.norm1 = _norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = _norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(swish(self.norm1(x)))
        h = self.conv2(swish(self.norm2(h)))
        return (self.nin_shortcut(x) if self.nin_shortcut is not None else x) + h


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = _norm(c)
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        h = self.norm(x)
        q = self.q(h).reshape(B, C, H * W).transpose(1, 2)      # [B, HW, C]
        k = self.k(h).reshape(B, C, H * W)                       # [B, C, HW]
        v = self.v(h).reshape(B, C, H * W)
        w = torch.softmax(torch.bmm(q, k) * (C ** -0.5), dim=-1)  # [B, HW(q), HW(k)]
        o = torch.bmm(v, w.transpose(1, 2)).reshape(B, C, H, W)
        return x + self.proj_out(o)


class Downsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution level: ResBlocks (+ AttnBlocks), then an optional resampler."""

    def __init__(self, cin, cout, n_res, attn, resample):
        super().__init__()
        self.block = nn.ModuleList([ResBlock(cin if i == 0 else cout, cout) for i in range(n_res)])
        self.attn = nn.ModuleList([AttnBlock(cout) for _ in range(n_res)]) if attn else None
        if resample == "down":
            self.downsample = Downsample(cout)
        elif resample == "up":
            self.upsample = Upsample(cout)

    def forward(self, x):
        for i, b in enumerate(self.block):
            x = b(x)
            if self.attn is not None:
                x = self.attn[i](x)
        if hasattr(self, "downsample"):
            x = self.downsample(x)
        if hasattr(self, "upsample"):
            x = self.upsample(x)
        return x


class Mid(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.block_1 = ResBlock(c, c)
        self.attn_1 = AttnBlock(c)
        self.block_2 = ResBlock(c, c)

    def forward(self, x):
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        ch, mult, nrb, z = cfg["base_channels"], cfg["channel_multiplier"], \
            cfg["num_res_blocks"], cfg["latent_channels"]
        n = len(mult)
        self.conv_in = nn.Conv2d(3, ch, 3, padding=1)
        levels, cin = [], ch
        for i in range(n):
            cout = ch * mult[i]
            levels.append(Level(cin, cout, nrb, i == n - 1, "down" if i < n - 1 else None))
            cin = cout
        self.down = nn.ModuleList(levels)
        self.mid = Mid(cin)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, z, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for lv in self.down:
            h = lv(h)
        h = self.mid(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    """transformers JanusVQVAEDecoder / flexdiag: up[0] is the lowest resolution (run first)."""

    def __init__(self, cfg):
        super().__init__()
        ch, mult, nrb, z = cfg["base_channels"], cfg["channel_multiplier"], \
            cfg["num_res_blocks"], cfg["latent_channels"]
        n = len(mult)
        top = ch * mult[-1]
        self.conv_in = nn.Conv2d(z, top, 3, padding=1)
        self.mid = Mid(top)
        levels, cin = [], top
        for b in range(n):
            lvl = n - 1 - b
            cout = ch * mult[lvl]
            levels.append(Level(cin, cout, nrb + 1, lvl == n - 1, "up" if lvl > 0 else None))
            cin = cout
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, 3, 3, padding=1)

    def forward(self, z):
        h = self.mid(self.conv_in(z))
        for lv in self.up:
            h = lv(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, n, dim, beta=0.25):
        super().__init__()
        self.embedding = nn.Embedding(n, dim)
        nn.init.normal_(self.embedding.weight)
        self.beta = beta

    def codebook(self):
        return F.normalize(self.embedding.weight, p=2, dim=-1)

    def forward(self, z):
        """z [B, e, h, w] -> (z_q (normalised codes, straight-through), loss, ids [B, h*w],
        normalised z rows [B*h*w, e])."""
        B, e, h, w = z.shape
        zf = F.normalize(z.permute(0, 2, 3, 1).reshape(-1, e).float(), p=2, dim=-1)
        cb = self.codebook().float()
        ids = torch.argmax(zf @ cb.t(), dim=1)
        zq = cb[ids]
        loss = self.beta * F.mse_loss(zf, zq.detach()) + F.mse_loss(zq, zf.detach())
        zq = zf + (zq - zf).detach()
        zq = zq.reshape(B, h, w, e).permute(0, 3, 1, 2)
        return zq, loss, ids.reshape(B, h * w), zf

    def lookup(self, ids, h, w):
        cb = self.codebook()
        B = ids.shape[0]
        return cb[ids.reshape(-1)].reshape(B, h, w, -1).permute(0, 3, 1, 2)


class VQModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quant_conv = nn.Conv2d(cfg["latent_channels"], cfg["embed_dim"], 1)
        self.quantize = Quantizer(cfg["num_embeddings"], cfg["embed_dim"])
        self.post_quant_conv = nn.Conv2d(cfg["embed_dim"], cfg["latent_channels"], 1)
        self.decoder = Decoder(cfg)

    def encode(self, x):
        return self.quantize(self.quant_conv(self.encoder(x)))

    def forward(self, x):
        zq, qloss, ids, zf = self.encode(x)
        return self.decoder(self.post_quant_conv(zq)), qloss, ids, zf

    def decode_ids(self, ids, grid):
        return self.decoder(self.post_quant_conv(self.quantize.lookup(ids, grid, grid)))


# ---------------------------------------------------------------- Janus LM

class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(pos, head_dim, theta, device):
    """cos, sin [..., head_dim] for integer positions pos (any shape), HF rotate-half layout;
    angles in double then fp32, as flexdiag computes them."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
                           / head_dim))
    ang = pos.to(torch.float64).unsqueeze(-1) * inv
    ang = torch.cat([ang, ang], dim=-1)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, H, Hkv, dh = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], \
            c["head_dim"]
        self.H, self.Hkv, self.dh = H, Hkv, dh
        self.q_proj = nn.Linear(d, H * dh, bias=False)
        self.k_proj = nn.Linear(d, Hkv * dh, bias=False)
        self.v_proj = nn.Linear(d, Hkv * dh, bias=False)
        self.o_proj = nn.Linear(H * dh, d, bias=False)

    def forward(self, x, cos, sin, cache=None, mask=None):
        """x [B, T, d]; cos/sin [B or 1, T, dh]; cache: dict with 'k', 'v' [B, Hkv, S, dh] to
        append to (inference); mask: additive [B, 1, T, S_total] or None (causal)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.Hkv, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.Hkv, self.dh).transpose(1, 2)
        cos, sin = cos.unsqueeze(1).to(q.dtype), sin.unsqueeze(1).to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if self.Hkv != self.H:
            rep = self.H // self.Hkv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None and HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = torch.matmul(q, k.transpose(-1, -2)).float() * (self.dh ** -0.5)
            if mask is None:
                S = k.shape[2]
                causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
                s = s.masked_fill(~causal, float("-inf"))
            else:
                s = s + mask
            o = torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.H * self.dh))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache=None, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Aligner(nn.Module):
    """transformers JanusVQVAEAlignerMLP: fc1, then hidden_layers, GELU between."""

    def __init__(self, e, d, depth):
        super().__init__()
        self.fc1 = nn.Linear(e, d)
        self.hidden_layers = nn.ModuleList([nn.Linear(d, d) for _ in range(depth - 1)])

    def forward(self, x):
        x = self.fc1(x)
        for lin in self.hidden_layers:
            x = lin(F.gelu(x))
        return x


class GenHead(nn.Module):
    """transformers JanusVQVAEHead: proj_out, GELU, vision_head."""

    def __init__(self, d, mid, V):
        super().__init__()
        self.proj_out = nn.Linear(d, mid)
        self.vision_head = nn.Linear(mid, V)

    def forward(self, x):
        return self.vision_head(F.gelu(self.proj_out(x)))


class JanusLM(nn.Module):
    def __init__(self, tc, vq):
        super().__init__()
        self.tc = tc
        d = tc["hidden_size"]
        self.embed_tokens = nn.Embedding(tc["vocab_size"], d)
        self.layers = nn.ModuleList([Layer(tc) for _ in range(tc["num_hidden_layers"])])
        self.norm = RMSNorm(d, tc["rms_norm_eps"])
        self.generation_embeddings = nn.Embedding(vq["num_embeddings"], vq["embed_dim"])
        self.generation_aligner = Aligner(vq["embed_dim"], vq["projection_dim"],
                                          vq["num_hidden_layers"])
        self.generation_head = GenHead(d, vq["projection_dim"], vq["num_embeddings"])
        self._init()

    def _init(self):
        L = self.tc["num_hidden_layers"]
        for name, p in self.named_parameters():
            if name.startswith("layers.") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if ("o_proj" in name or "down_proj" in name) \
                    else 0.02
                nn.init.normal_(p, std=std)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        nn.init.normal_(self.generation_embeddings.weight, std=1.0)

    def image_embed(self, ids):
        return self.generation_aligner(self.generation_embeddings(ids))

    def run(self, x, pos, cache=None, mask=None):
        cos, sin = rope_tables(pos, self.tc["head_dim"], self.tc["rope_theta"], x.device)
        if mask is None and not HAS_SDPA:   # one additive causal mask for every layer
            T = x.shape[1]
            mask = torch.zeros(T, T, device=x.device).masked_fill(
                ~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            mask = mask.view(1, 1, T, T)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], mask)
        return self.norm(x)

    def forward_train(self, text, plen, img):
        """Teacher-forced logits [B, n_img, V] of image tokens img [B, n_img] after prompts
        text [B, Pmax] (row b uses its first plen[b] ids). Sequences are laid out as flexdiag
        does (prompt at 0..P-1, image token t at P+t) and padded at the end, so plain causal
        attention needs no mask."""
        B, Pmax = text.shape
        n = img.shape[1]
        L = Pmax + n - 1
        xt = self.embed_tokens(text)
        xi = self.image_embed(img[:, :-1])
        pos = torch.arange(L, device=text.device)
        rel = pos.unsqueeze(0) - plen.unsqueeze(1)                    # [B, L]
        d = xt.shape[-1]
        gt = torch.gather(xt, 1, pos.clamp(max=Pmax - 1).unsqueeze(0).expand(B, L)
                          .unsqueeze(-1).expand(B, L, d))
        gi = torch.gather(xi, 1, rel.clamp(0, n - 2).unsqueeze(-1).expand(B, L, d))
        x = torch.where((rel < 0).unsqueeze(-1), gt, gi.to(gt.dtype))
        h = self.run(x, pos.unsqueeze(0))
        at = (plen.unsqueeze(1) - 1 + torch.arange(n, device=text.device).unsqueeze(0))
        hs = torch.gather(h, 1, at.unsqueeze(-1).expand(B, n, d))
        return self.generation_head(hs)

    @torch.no_grad()
    def generate(self, prompts, n_tokens, cfg_weight=5.0, temperature=1.0, top_k=0,
                 generator=None, uncond_fn=None, forced=None, return_logits=False,
                 sample_fn=None):
        """CFG generation with a KV cache, flexdiag's row layout: each prompt (list of ids) and
        its unconditional row (uncond_fn(ids)) at positions 0..P-1, image token t at P+t.
        Rows are left-padded to a common length; padded key slots are masked. top_k=1 is
        greedy. forced [N, n_tokens] replays given ids (teacher forcing). Returns ids
        [N, n_tokens] (and CFG logits [N, n_tokens, V], cond/uncond raw [2, N, n, V]).
        sample_fn(cfg_logits [N, V], step) -> ids replaces the sampler (check_logits uses
        flexdiag's own draw)."""
        dev = self.embed_tokens.weight.device
        rows = []
        for p in prompts:
            rows += [p, uncond_fn(p)]
        R = len(rows)
        P = max(len(r) for r in rows)
        lp = torch.tensor([len(r) for r in rows], device=dev)
        pad = P - lp
        text = torch.zeros(R, P, dtype=torch.long, device=dev)
        for i, r in enumerate(rows):
            text[i, P - len(r):] = torch.tensor(r, device=dev)
        S = P + n_tokens
        slot = torch.arange(S, device=dev)
        key_ok = slot.unsqueeze(0) >= pad.unsqueeze(1)                    # [R, S]
        neg = torch.finfo(torch.float32).min
        cache = [dict() for _ in self.layers]
        # prefill
        pos = (torch.arange(P, device=dev).unsqueeze(0) - pad.unsqueeze(1)).clamp(min=0)
        causal = torch.ones(P, P, dtype=torch.bool, device=dev).tril()
        m = causal.unsqueeze(0) & key_ok[:, :P].unsqueeze(1)
        mask = torch.where(m, 0.0, neg).unsqueeze(1).float()
        h = self.run(self.embed_tokens(text), pos, cache, mask)[:, -1]
        ids, logs, raws = [], [], []
        for t in range(n_tokens):
            lg = self.generation_head(h).float()                          # [R, V]
            c, u = lg[0::2], lg[1::2]
            l = u + cfg_weight * (c - u)
            if return_logits:
                logs.append(l)
                raws.append(torch.stack([c, u]))
            if forced is not None:
                nxt = forced[:, t].to(dev)
            elif sample_fn is not None:
                nxt = sample_fn(l, t).to(dev)
            elif top_k == 1:
                nxt = torch.argmax(l, dim=-1)
            else:
                z = l / temperature
                if top_k and top_k > 0:
                    kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
                    z = z.masked_fill(z < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(z, dim=-1), 1,
                                        generator=generator).squeeze(1)
            ids.append(nxt)
            if t + 1 == n_tokens:
                break
            x = self.image_embed(nxt.repeat_interleave(2)).unsqueeze(1)
            pos = (lp + t).unsqueeze(1)
            ok = key_ok[:, :P + t + 1]
            mask = torch.where(ok, 0.0, neg).view(R, 1, 1, -1).float()
            h = self.run(x.to(self.embed_tokens.weight.dtype), pos, cache, mask)[:, -1]
        out = torch.stack(ids, 1)
        if return_logits:
            return out, torch.stack(logs, 1), torch.stack(raws, 2)
        return out


def count_params(m):
    return sum(p.numel() for p in m.parameters())
