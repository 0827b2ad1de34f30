#!/usr/bin/env python3
"""Plain-PyTorch reference trainer for megaengine's speed benchmark.

A decoder-only transformer (GPT or LLaMA family) trained on random tokens, or with --text on a
file's bytes as megaengine's benchmark rows are (bench/speed/*.sh pass it), with fp32 weights,
bf16 autocast, AdamW and global-norm clipping, timed with CUDA events. The model mirrors
engine/model/transformer.cpp (shapes, init, norms, RoPE, attention) and the FLOP count is
TransformerConfig::flops_per_token, so tokens/s and TFLOP/s compare like for like with
megaengine rows.

  python3 bench/reference/train_ref.py --model gpt1.3b --mode eager --micro 4 --json out.jsonl
  python3 bench/reference/train_ref.py --model llama1b --mode compile --micro 4 --peak-tflops 750
  python3 bench/reference/train_ref.py --check            # tiny smoke test (GPU, or CPU if none)
  python3 -m torch.distributed.run --standalone --nproc_per_node 4 bench/reference/train_ref.py --model gpt1.3b
                                                         # data parallel: DistributedDataParallel over 4 GPUs

Only the standard library and torch are used.
"""

import argparse
import dataclasses
import inspect
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel


# --------------------------------------------------------------------------- configuration

@dataclasses.dataclass
class Config:
    kind: str = "gpt"  # gpt | llama
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    groups: int = 0  # key/value heads; 0 = heads
    ffn: int = 0  # 0 = 4 * hidden (GPT); LLaMA presets set it explicitly
    seq: int = 1024
    vocab: int = 50257  # tokenizer vocabulary; the model uses padded_vocab
    vocab_divisible_by: int = 128
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    init_std: float = 0.02

    # Family traits (derived from kind, as TransformerConfig::gpt()/llama() do).
    @property
    def llama(self):
        return self.kind == "llama"

    @property
    def bias(self):
        return not self.llama

    @property
    def tie_embeddings(self):
        return not self.llama

    @property
    def swiglu(self):
        return self.llama

    @property
    def rope(self):
        return self.llama

    @property
    def kv_groups(self):
        return self.groups if self.groups > 0 else self.heads

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def ffn_hidden(self):
        if self.ffn > 0:
            return self.ffn
        if not self.swiglu:
            return 4 * self.hidden
        # LLaMA's rule (2/3 of 4h rounded up to a multiple of 256), as megaengine's default.
        f = 2 * 4 * self.hidden // 3
        return 256 * ((f + 255) // 256)

    @property
    def padded_vocab(self):
        m = self.vocab_divisible_by
        return ((self.vocab + m - 1) // m) * m

    def validate(self):
        assert self.kind in ("gpt", "llama"), self.kind
        for name in ("layers", "hidden", "heads", "seq", "vocab"):
            assert getattr(self, name) > 0, f"--{name} must be positive"
        assert self.hidden % self.heads == 0, "hidden must be divisible by heads"
        assert self.heads % self.kv_groups == 0, "heads must be divisible by groups"
        assert not self.rope or self.head_dim % 2 == 0, "RoPE needs an even head dimension"

    def parameter_count(self):
        """TransformerConfig::parameter_count (tp = 1): must equal the model's numel sum."""
        h, f, d = self.hidden, self.ffn_hidden, self.head_dim
        q, kv, v = self.heads * d, self.kv_groups * d, self.padded_vocab
        b = 1 if self.bias else 0
        norm_params = h if self.llama else 2 * h
        attention = h * (q + 2 * kv) + b * (q + 2 * kv) + q * h + b * h
        mlp = 3 * h * f + b * (2 * f + h) if self.swiglu else 2 * h * f + b * (f + h)
        n = self.layers * (attention + mlp + 2 * norm_params) + norm_params + v * h
        if not self.rope:
            n += self.seq * h
        if not self.tie_embeddings:
            n += v * h
        return n

    def flops_per_token(self):
        """TransformerConfig::flops_per_token (tp = 1): model FLOPs of forward + backward."""
        h, f, d = float(self.hidden), float(self.ffn_hidden), float(self.head_dim)
        q, kv = self.heads * d, self.kv_groups * d
        per_layer = h * (q + 2 * kv) + q * h + (3 if self.swiglu else 2) * h * f
        matmul = self.layers * per_layer + self.padded_vocab * h
        return 6.0 * matmul + 12.0 * self.layers * q * self.seq

    def describe(self):
        g = f", groups={self.kv_groups}" if self.kv_groups != self.heads else ""
        return (f"{'LLaMA' if self.llama else 'GPT'}(layers={self.layers}, hidden={self.hidden}, "
                f"heads={self.heads}{g}, ffn={self.ffn_hidden}, seq={self.seq}, vocab={self.vocab}"
                f"->{self.padded_vocab})")


PRESETS = {
    "gpt-small": dict(kind="gpt", layers=12, hidden=768, heads=12, seq=1024, vocab=50257),
    "gpt1.3b": dict(kind="gpt", layers=24, hidden=2048, heads=16, seq=2048, vocab=50257),
    # TinyLlama-1.1B shape.
    "llama1b": dict(kind="llama", layers=22, hidden=2048, heads=32, groups=4, ffn=5632, seq=2048, vocab=32000),
    # --check only.
    "tiny-gpt": dict(kind="gpt", layers=2, hidden=64, heads=4, seq=32, vocab=256),
    "tiny-llama": dict(kind="llama", layers=2, hidden=64, heads=4, groups=2, ffn=160, seq=32, vocab=256),
}


# --------------------------------------------------------------------------- model

class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back to x's dtype."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def make_norm(cfg):
    if cfg.llama:
        return RMSNorm(cfg.hidden, cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=True)


class Rotary(nn.Module):
    """Rotary position embedding, rotate-half convention, tables in fp32 (cast to x's dtype)."""

    def __init__(self, head_dim, max_seq, base):
        super().__init__()
        inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float64), inv)  # [seq, d/2]
        full = torch.cat([angles, angles], dim=-1)  # [seq, d]
        self.register_buffer("cos", full.cos().float(), persistent=False)
        self.register_buffer("sin", full.sin().float(), persistent=False)

    def forward(self, x):  # x: [b, n, s, d]
        s, half = x.size(-2), x.size(-1) // 2
        cos = self.cos[:s].to(x.dtype)
        sin = self.sin[:s].to(x.dtype)
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg, rope, gqa_impl):
        super().__init__()
        self.heads, self.groups, self.head_dim = cfg.heads, cfg.kv_groups, cfg.head_dim
        self.q_dim, self.kv_dim = cfg.heads * cfg.head_dim, cfg.kv_groups * cfg.head_dim
        self.gqa_impl = gqa_impl
        # Fused q/k/v projection: Linear(h, q + 2 kv) (Linear(h, 3h) for GPT). Same FLOPs and
        # parameters as megaengine's separate q, k, v linears.
        self.qkv = nn.Linear(cfg.hidden, self.q_dim + 2 * self.kv_dim, bias=cfg.bias)
        self.proj = nn.Linear(self.q_dim, cfg.hidden, bias=cfg.bias)
        self.rope = rope  # the model's one Rotary (a shared submodule: its buffers exist once) or None

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [b, heads, s, d]
        k = k.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.groups, self.head_dim).transpose(1, 2)
        if self.rope is not None:
            q = self.rope(q)
            k = self.rope(k)
        rep = self.heads // self.groups
        if rep > 1 and self.gqa_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            if rep > 1:  # as megaengine: each key/value head serves rep query heads
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.q_dim)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.swiglu
        f = cfg.ffn_hidden
        if self.swiglu:
            self.gate = nn.Linear(cfg.hidden, f, bias=cfg.bias)
            self.up = nn.Linear(cfg.hidden, f, bias=cfg.bias)
            self.down = nn.Linear(f, cfg.hidden, bias=cfg.bias)
        else:
            self.fc1 = nn.Linear(cfg.hidden, f, bias=cfg.bias)
            self.fc2 = nn.Linear(f, cfg.hidden, bias=cfg.bias)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, rope, gqa_impl):
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg, rope, gqa_impl)
        self.norm2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, cfg, gqa_impl="repeat"):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        v = cfg.padded_vocab
        self.embedding = nn.Embedding(v, cfg.hidden)
        self.position = None if cfg.rope else nn.Embedding(cfg.seq, cfg.hidden)
        self.rotary = Rotary(cfg.head_dim, cfg.seq, cfg.rope_base) if cfg.rope else None
        self.blocks = nn.ModuleList(Block(cfg, self.rotary, gqa_impl) for _ in range(cfg.layers))
        self.final_norm = make_norm(cfg)
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.hidden, v, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        out_std = self.cfg.init_std / math.sqrt(2.0 * self.cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                residual_out = name.endswith(("proj.weight", "fc2.weight", "down.weight"))
                p.normal_(0.0, out_std if residual_out else self.cfg.init_std)

    def forward(self, tokens):  # [b, s] -> logits [b, s, padded_vocab]
        s = tokens.size(1)
        x = self.embedding(tokens)
        if self.position is not None:
            x = x + self.position(torch.arange(s, device=tokens.device)).unsqueeze(0)
        for block in self.blocks:
            x = block(x)
        x = self.final_norm(x)
        if self.output is None:  # tied: the output layer is the token embedding
            return F.linear(x, self.embedding.weight)
        return self.output(x)


def lm_loss(logits, targets):
    """Cross entropy in fp32 (logits.float()), mean over all tokens."""
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class ModelWithLoss(nn.Module):
    """For --compile-scope model+loss: the compiled region also covers the fp32 loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        with torch.autocast(inputs.device.type, dtype=torch.bfloat16):
            logits = self.model(inputs)
        return lm_loss(logits, targets)


# --------------------------------------------------------------------------- training

def fused_adamw_available():
    return "fused" in inspect.signature(torch.optim.AdamW).parameters


def build_optimizer(model, lr, weight_decay, impl, device_type):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    used = "foreach"
    if impl == "fused" and fused_adamw_available() and device_type == "cuda":
        kwargs["fused"] = True
        used = "fused"
    else:
        if impl == "fused" and device_type == "cuda":
            print("note: fused AdamW not available here, using foreach", file=sys.stderr)
        if device_type == "cuda":
            kwargs["foreach"] = True
        else:
            used = "default"
    return torch.optim.AdamW(groups, **kwargs), used


class Trainer:
    def __init__(self, model, cfg, args, device, lr=3e-4):
        self.model, self.cfg, self.device = model, cfg, device
        self.micro, self.accum = args.micro, args.accum
        self.clip = args.clip
        self.opt, self.optimizer_impl = build_optimizer(model, lr, args.weight_decay, args.optimizer_impl,
                                                        device.type)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.text = None
        if args.text:
            self.use_text(args.text)
        self.scope = args.compile_scope
        if args.mode == "compile":
            ckw = {} if args.compile_mode in (None, "", "default") else {"mode": args.compile_mode}
            if self.scope == "model+loss":
                self.fwd_loss = torch.compile(ModelWithLoss(model), **ckw)
                self.fwd = None
            else:
                self.fwd = torch.compile(model, **ckw)
        else:
            self.fwd = model
            self.scope = "model"

    def random_batch(self):
        # Synthetic data made on the device: no host transfer, no sync.
        t = torch.randint(0, self.cfg.vocab, (self.micro, self.cfg.seq + 1), device=self.device)
        return t[:, :-1], t[:, 1:]

    def use_text(self, path):
        """Train on a file's bytes (token = byte), as megaengine's me.data.text does: the GPU's
        clocks under load depend on the numbers it multiplies, so both engines get the same text."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise SystemExit(f"--text {path}: {e.strerror} (scripts/fetch_assets.sh fetches moby-dick.txt)")
        if len(data) <= self.cfg.seq + 1:
            raise SystemExit(f"--text {path}: {len(data)} bytes, need more than seq + 1 = {self.cfg.seq + 1}")
        self.text = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device, torch.long)
        self.window = torch.arange(self.cfg.seq + 1, device=self.device)

    def text_batch(self):
        # Random windows of the text, drawn on the device: no host transfer, no sync.
        starts = torch.randint(0, self.text.numel() - self.cfg.seq - 1, (self.micro, 1), device=self.device)
        t = self.text[starts + self.window]
        return t[:, :-1], t[:, 1:]

    def step(self, batch_fn=None):
        """One optimizer step of accum micro-batches; returns the last micro-batch loss (a tensor)."""
        batch_fn = batch_fn or (self.text_batch if self.text is not None else self.random_batch)
        loss = None
        for _ in range(self.accum):
            inputs, targets = batch_fn()
            if self.scope == "model+loss":
                loss = self.fwd_loss(inputs, targets)
            else:
                with torch.autocast(self.device.type, dtype=torch.bfloat16):
                    logits = self.fwd(inputs)
                loss = lm_loss(logits, targets)
            (loss / self.accum if self.accum > 1 else loss).backward()
        if self.clip > 0:
            # foreach=None: the multi-tensor path on CUDA, the per-tensor one on CPU (--check).
            torch.nn.utils.clip_grad_norm_(self.params, self.clip, foreach=None)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


# --------------------------------------------------------------------------- entry points

def build_config(args):
    name = args.model
    if name not in PRESETS:
        raise SystemExit(f"unknown --model {name}; one of {', '.join(PRESETS)}")
    fields = dict(PRESETS[name])
    for f in ("layers", "hidden", "heads", "groups", "ffn", "seq", "vocab"):
        v = getattr(args, f)
        if v is not None:
            fields[f] = v
    cfg = Config(**fields)
    cfg.validate()
    return cfg


def is_oom(e):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    # torch.compile can wrap a CUDA OOM raised while compiling/autotuning in its own exception.
    return "out of memory" in str(e).lower()


def write_json(path, row):
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def init_data_parallel():
    """Under torchrun (WORLD_SIZE > 1): one NCCL process group, this process on GPU LOCAL_RANK.
    Returns (world size, rank, local rank); (1, 0, 0) for a plain one-GPU run."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 1, 0, 0
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    try:  # device_id (torch >= 2.3) binds the group to this GPU at once
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
    except TypeError:
        torch.distributed.init_process_group("nccl")
    return world, torch.distributed.get_rank(), local


def benchmark(args):
    cfg = build_config(args)
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU (use --check for a CPU smoke test)")
    world, rank, local = init_data_parallel()
    try:
        return benchmark_on(args, cfg, world, rank, torch.device("cuda", local))
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


def benchmark_on(args, cfg, world, rank, device):
    # Data parallel: every rank trains the same micro batch size on its own batches (megaengine's
    # dp rows do the same), gradients averaged by DDP's bucketed all-reduce overlapped with backward.
    out = args.json if rank == 0 else None
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)

    engine = f"pytorch-{args.mode}"
    tokens_per_step = args.micro * args.accum * cfg.seq * world
    layout = "1 GPU" if world == 1 else f"{world} GPUs"
    row = dict(engine=engine, model=args.model, layout=layout, micro=args.micro, accum=args.accum, seq=cfg.seq,
               steps=args.steps, tokens_per_s=None, ms_per_step=None, tflops_per_gpu=None, mfu=None,
               peak_mem_mib=None, params=cfg.parameter_count(), final_loss=None,
               device=torch.cuda.get_device_name(device), torch=torch.__version__,
               data_parallel="DistributedDataParallel" if world > 1 else None,
               compile_mode=args.compile_mode if args.mode == "compile" else None,
               compile_scope=args.compile_scope if args.mode == "compile" else None,
               gqa_impl=args.gqa_impl if cfg.kv_groups != cfg.heads else None,
               data=os.path.basename(args.text) if args.text else "random tokens")
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{engine}: {args.model} = {cfg.describe()}, micro {args.micro} x accum {args.accum}, "
        f"{args.warmup} warm-up + {args.steps} timed steps, on {layout} ({row['device']}), torch {torch.__version__}",
        flush=True)
    try:
        with device:  # build and initialise on the GPU (fast for 1B+ parameters)
            model = Transformer(cfg, args.gqa_impl)
        params = sum(p.numel() for p in model.parameters())
        row["params"] = params
        if params != cfg.parameter_count():
            print(f"warning: {params} parameters, megaengine's formula says {cfg.parameter_count()}",
                  file=sys.stderr)
        if world > 1:
            # Replicas start equal (DDP broadcasts rank 0's weights); torch.compile wraps the DDP module.
            model = DistributedDataParallel(model, device_ids=[device.index], bucket_cap_mb=25,
                                            gradient_as_bucket_view=True)
            torch.manual_seed(args.seed + rank)  # each rank its own random batches
        trainer = Trainer(model, cfg, args, device)
        row["optimizer_impl"] = trainer.optimizer_impl
        torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            loss = trainer.step()
        torch.cuda.synchronize(device)
        warmup_s = time.perf_counter() - t0
        if world > 1:
            torch.distributed.barrier()  # every rank starts the timed steps together
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.steps):
            loss = trainer.step()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
        final_loss = loss.item()  # the only host read of the loss, after timing
        peak_mib = torch.cuda.max_memory_allocated(device) / 2**20
    except Exception as e:  # noqa: BLE001 - OOM is a result, anything else is reported then re-raised
        if is_oom(e):
            row["error"] = "OOM"
            print(f"{engine} {args.model} micro {args.micro} on {layout}: out of memory (rank {rank})", flush=True)
            write_json(out, row)
            return 0
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        write_json(out, row)
        raise

    tokens_per_s = tokens_per_step * args.steps / seconds
    tflops = cfg.flops_per_token() * tokens_per_s / world / 1e12
    row.update(tokens_per_s=tokens_per_s, ms_per_step=1000.0 * seconds / args.steps, tflops_per_gpu=tflops,
               mfu=tflops / args.peak_tflops if args.peak_tflops else None, peak_mem_mib=peak_mib,
               final_loss=final_loss, warmup_s=warmup_s)
    mfu = f", MFU {100 * row['mfu']:.1f}%" if row["mfu"] is not None else ""
    say(f"{engine} {args.model} on {layout} micro {args.micro} x accum {args.accum} seq {cfg.seq}: "
        f"{tokens_per_s:,.0f} tokens/s, {row['ms_per_step']:.1f} ms/step, {tflops:.1f} TFLOP/s/GPU{mfu}, "
        f"peak memory {peak_mib:,.0f} MiB, {params / 1e6:.1f}M parameters, final loss {final_loss:.4f} "
        f"(warm-up {warmup_s:.1f} s, optimizer {trainer.optimizer_impl})", flush=True)
    write_json(out, row)
    return 0


def check(args):
    """Smoke test: tiny GPT and LLaMA, 3 steps on a fixed batch; loss finite and decreasing."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ok = True
    for name in ("tiny-gpt", "tiny-llama"):
        torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 while comparing the GQA paths
        cfg = Config(**PRESETS[name])
        torch.manual_seed(0)
        model = Transformer(cfg, args.gqa_impl).to(device)
        n = sum(p.numel() for p in model.parameters())
        assert n == cfg.parameter_count(), f"{name}: {n} parameters, megaengine's formula {cfg.parameter_count()}"
        if cfg.kv_groups != cfg.heads and sdpa_has_gqa(device):
            # Both GQA paths must agree.
            other = Transformer(cfg, "sdpa" if args.gqa_impl == "repeat" else "repeat").to(device)
            other.load_state_dict(model.state_dict())
            t = torch.randint(0, cfg.vocab, (2, cfg.seq), device=device)
            with torch.no_grad():
                d = (model(t) - other(t)).abs().max().item()
            assert d < 1e-4, f"{name}: GQA paths differ by {d}"
        torch.backends.cuda.matmul.allow_tf32 = True
        ns = argparse.Namespace(**vars(args))
        ns.micro, ns.accum = 4, 2
        trainer = Trainer(model, cfg, ns, device, lr=3e-3)
        fixed = torch.randint(0, cfg.vocab, (ns.micro, cfg.seq + 1), device=device)
        batch = lambda: (fixed[:, :-1], fixed[:, 1:])  # noqa: E731
        losses = [trainer.step(batch).item() for _ in range(3)]
        finite = all(math.isfinite(x) for x in losses)
        falling = losses[-1] < losses[0]
        print(f"check {name} ({args.mode}, {trainer.optimizer_impl} AdamW, {device.type}): {n} parameters, "
              f"losses {', '.join(f'{x:.4f}' for x in losses)} (ln V = {math.log(cfg.vocab):.4f}) "
              f"-> {'ok' if finite and falling else 'FAILED'}", flush=True)
        ok = ok and finite and falling
    # The benchmark presets: parameter count and FLOPs/token as megaengine computes them.
    for name in ("gpt-small", "gpt1.3b", "llama1b"):
        cfg = Config(**PRESETS[name])
        print(f"  {name}: {cfg.describe()}: {cfg.parameter_count() / 1e6:.1f}M parameters, "
              f"{cfg.flops_per_token() / 1e9:.2f} GFLOP/token")
    assert ok, "check failed"
    print("check passed")
    return 0


def sdpa_has_gqa(device):
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (torch >= 2.5)."""
    q = torch.zeros(1, 2, 4, 8, device=device)
    kv = torch.zeros(1, 1, 4, 8, device=device)
    try:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except TypeError:
        return False


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt1.3b", help="gpt-small | gpt1.3b | llama1b")
    for f in ("layers", "hidden", "heads", "groups", "ffn", "seq", "vocab"):
        p.add_argument(f"--{f}", type=int, default=None, help=f"override the preset's {f}")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs)")
    p.add_argument("--compile-scope", choices=("model", "model+loss"), default="model",
                   help="what torch.compile wraps: the model (default) or model plus the fp32 loss")
    p.add_argument("--gqa-impl", choices=("repeat", "sdpa"), default="repeat",
                   help="GQA: repeat_interleave k/v as megaengine does (default), or SDPA's enable_gqa")
    p.add_argument("--optimizer-impl", choices=("fused", "foreach"), default="fused")
    p.add_argument("--micro", type=int, default=4, help="micro batch (sequences)")
    p.add_argument("--accum", type=int, default=1, help="gradient accumulation micro-batches per step")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="global gradient-norm clip (0: off)")
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak for MFU (bench/reference/matmul_peak.py)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--text", default=None,
                   help="train on this file's bytes (megaengine's rows use assets/moby-dick.txt); default: random tokens")
    p.add_argument("--json", default=None, help="append one JSON object per run to this file")
    p.add_argument("--check", action="store_true", help="tiny smoke test")
    args = p.parse_args(argv)
    if args.micro < 1 or args.accum < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--micro, --accum and --steps must be >= 1, --warmup >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    return check(args) if args.check else benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
