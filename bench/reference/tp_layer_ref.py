#!/usr/bin/env python3
"""Plain-PyTorch reference for issue #35: the marginal time of a transformer layer at the user's
widths (--width gpt39b, llama70b) under tensor parallelism with sequence parallelism, the same
measure as bench/speed/tp_width.sh (layers L and 2L, so that only the layers remain; per-GPU
efficiency = the tp 1 layer time / (tp x the layer time at tp)), forward + backward of one
micro-batch of --micro x seq tokens (tp_width.sh's ME_BENCH_TORCH_REF=1 runs it beside its rows).

Variants, each with the same weights and input:
  sp        Megatron-style sequence parallelism without overlap: all-gather before the column
            GEMMs and reduce-scatter after the row GEMMs (NCCL, torch.distributed), eager
  sp-graph  the same stack captured once as CUDA graphs (torch.cuda.make_graphed_callables):
            the host's issue time taken out, which is what graphs would buy
  async     PyTorch's async TP: symmetric-memory fused all-gather + GEMM and GEMM +
            reduce-scatter (torch.ops.symm_mem, chunked over the copy engines; NVLink multicast
            stays off), eager, with the backward's mirror images
At tp 1 the stack has no communication; "sp-graph" there is the one-GPU graph. Before timing,
"async" is checked against "sp" (the layer stack's output and input gradient).

  python3 -m torch.distributed.run --standalone --nproc_per_node 4 bench/reference/tp_layer_ref.py --width gpt39b
  python3 bench/reference/tp_layer_ref.py --width gpt39b          # tp 1
Prints one JSON line per variant (rank 0) and appends it to --json. Only torch is used.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

WIDTHS = {  # seq as the recipes (recipes/gpt39b.lua, recipes/llama2_70b.lua)
    # GPT: LayerNorm, biases, GeLU (tanh), multi-head attention
    "gpt39b": dict(kind="gpt", hidden=8192, heads=64, groups=64, ffn=32768, seq=2048),
    # LLaMA: RMSNorm, no biases, SwiGLU, grouped-query attention (8 groups), rotary embeddings
    "llama70b": dict(kind="llama", hidden=8192, heads=64, groups=8, ffn=28672, seq=4096),
}


def rows_collective(x, group, gather):
    """All-gather (gather) or reduce-scatter (sum) of x's rows over the group."""
    tp = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] * tp if gather else x.shape[0] // tp,) + tuple(x.shape[1:]))
    (dist.all_gather_into_tensor if gather else dist.reduce_scatter_tensor)(out, x.contiguous(), group=group)
    return out


class RowsCollective(torch.autograd.Function):
    """Sequence parallelism's two mappings: an all-gather of the rows, whose gradient is a
    reduce-scatter, or a reduce-scatter, whose gradient is an all-gather."""

    @staticmethod
    def forward(ctx, x, group, gather):
        ctx.group, ctx.gather = group, gather
        return rows_collective(x, group, gather)

    @staticmethod
    def backward(ctx, dy):
        return rows_collective(dy, ctx.group, not ctx.gather), None, None


class FusedAllGatherMatmul(torch.autograd.Function):
    """y = all_gather(x) @ w^T; backward: dx = reduce_scatter(dy @ w), dw = dy^T all_gather(x)."""

    @staticmethod
    def forward(ctx, x, w, name):
        gathered, outs = torch.ops.symm_mem.fused_all_gather_matmul(x.contiguous(), [w.t()], 0, name)
        ctx.save_for_backward(gathered, w)
        ctx.name = name
        return outs[0]

    @staticmethod
    def backward(ctx, dy):
        gathered, w = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.ops.symm_mem.fused_matmul_reduce_scatter(dy, w, "sum", 0, ctx.name)
        return dx, dy.t() @ gathered, None


class FusedMatmulReduceScatter(torch.autograd.Function):
    """y = reduce_scatter(x @ w^T); backward: dx = all_gather(dy) @ w, dw = all_gather(dy)^T x."""

    @staticmethod
    def forward(ctx, x, w, name):
        x = x.contiguous()
        ctx.save_for_backward(x, w)
        ctx.name = name
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, ctx.name)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        gathered, outs = torch.ops.symm_mem.fused_all_gather_matmul(dy.contiguous(), [w], 0, ctx.name)
        return outs[0], gathered.t() @ x, None


class Block(torch.nn.Module):
    """A layer's tp-local shard; x is this rank's rows [micro x seq / tp, hidden] of the residual."""

    def __init__(self, w, tp, group, mode):
        super().__init__()
        h, self.llama = w["hidden"], w["kind"] == "llama"
        self.heads, self.groups = w["heads"] // tp, w["groups"] // tp
        self.head_dim, self.seq = h // w["heads"], w["seq"]
        self.tp, self.group, self.mode = tp, group, mode
        self.name = group.group_name if group is not None else None
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, device="cuda", dtype=torch.bfloat16) * 0.02)
        z = lambda *s: None if self.llama else torch.nn.Parameter(torch.zeros(*s, device="cuda", dtype=torch.bfloat16))
        o = lambda *s: torch.nn.Parameter(torch.ones(*s, device="cuda", dtype=torch.bfloat16))
        qkv = (self.heads + 2 * self.groups) * self.head_dim
        ffn = w["ffn"] // tp
        self.n1_w, self.n1_b, self.n2_w, self.n2_b = o(h), z(h), o(h), z(h)
        self.qkv_w, self.qkv_b = p(qkv, h), z(qkv)
        self.proj_w, self.proj_b = p(h, self.heads * self.head_dim), z(h)
        self.fc1_w, self.fc1_b = p(2 * ffn if self.llama else ffn, h), z(ffn)
        self.fc2_w, self.fc2_b = p(h, ffn), z(h)
        if self.llama:  # rotary tables for all seq positions, [seq, head_dim / 2]
            inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, device="cuda").float() / self.head_dim))
            angles = torch.outer(torch.arange(w["seq"], device="cuda").float(), inv)
            self.register_buffer("cos", angles.cos().to(torch.bfloat16), persistent=False)
            self.register_buffer("sin", angles.sin().to(torch.bfloat16), persistent=False)

    def norm(self, x, w, b):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-5) if self.llama else F.layer_norm(x, (x.shape[-1],), w, b)

    def rotate(self, x):  # x [micro, heads, seq, d]: rotary embedding, halves rotated
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * self.cos - b * self.sin, b * self.cos + a * self.sin), dim=-1)

    def column(self, x, w, b):  # x: this rank's rows; all rows of x w^T + b
        if self.tp == 1:
            return F.linear(x, w, b)
        if self.mode == "async":
            y = FusedAllGatherMatmul.apply(x, w, self.name)
            return y if b is None else y + b
        return F.linear(RowsCollective.apply(x, self.group, True), w, b)

    def row(self, y, w, b):  # y: all rows of a tp-split input; this rank's rows of y w^T (summed) + b
        if self.tp == 1:
            return F.linear(y, w, b)
        if self.mode == "async":
            out = FusedMatmulReduceScatter.apply(y, w, self.name)
        else:
            out = RowsCollective.apply(F.linear(y, w), self.group, False)
        return out if b is None else out + b

    def attention(self, x):
        qkv = self.column(self.norm(x, self.n1_w, self.n1_b), self.qkv_w, self.qkv_b)
        t, s, d = qkv.shape[0], self.seq, self.head_dim  # all rows: micro x seq tokens
        if self.llama:
            q, k, v = qkv.split([self.heads * d, self.groups * d, self.groups * d], dim=-1)
            q, k, v = (z.view(t // s, s, -1, d).transpose(1, 2) for z in (q, k, v))  # [micro, heads, seq, d]
            y = F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True, enable_gqa=True)
        else:
            q, k, v = qkv.view(t // s, s, self.heads, 3, d).permute(3, 0, 2, 1, 4).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.row(y.transpose(1, 2).reshape(t, self.heads * d), self.proj_w, self.proj_b)

    def mlp(self, x):
        h = self.column(self.norm(x, self.n2_w, self.n2_b), self.fc1_w, self.fc1_b)
        if self.llama:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.row(h, self.fc2_w, self.fc2_b)

    def forward(self, x):
        x = x + self.attention(x)
        return x + self.mlp(x)


def timed(step, iters, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", default="gpt39b", choices=sorted(WIDTHS))
    ap.add_argument("--layers", type=int, default=1, help="L: the stacks have L and 2L layers")
    ap.add_argument("--micro", type=int, default=1, help="sequences per micro-batch")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--variants", default="sp,sp-graph,async")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    w = WIDTHS[a.width]
    distributed = "RANK" in os.environ
    if distributed:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    tp = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    group = dist.group.WORLD if distributed else None
    if distributed:  # the communicator made now, not inside a capture
        dist.all_reduce(torch.ones(1, device="cuda"))
    rows = a.micro * w["seq"] // tp

    def stack_of(n, mode):
        torch.manual_seed(1234)  # the same weights on every rank's shard and for every variant
        return torch.nn.Sequential(*[Block(w, tp, group, mode) for _ in range(n)])

    def run(variant, n):
        mode = "async" if variant == "async" else "sp"
        torch.manual_seed(99 + rank)
        x = torch.randn(rows, w["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)
        model = stack_of(n, mode)
        if variant == "sp-graph":
            model = torch.cuda.make_graphed_callables(model, (x,), num_warmup_iters=3)

        def step():
            for p in model.parameters():  # make_graphed_callables returns the module itself
                p.grad = None
            x.grad = None
            model(x).backward(dy)

        ms = timed(step, a.iters, a.warmup)
        del model
        torch.cuda.empty_cache()
        return ms

    variants = [v for v in a.variants.split(",") if v]
    if tp > 1 and "async" in variants:
        try:
            try:  # needed before torch 2.8 or so; later versions may have dropped it
                from torch.distributed._symmetric_memory import enable_symm_mem_for_group

                enable_symm_mem_for_group(group.group_name)
            except ImportError:
                pass
            # async against sp: the stack's output and input gradient from the same weights and input
            outs = {}
            for mode in ("sp", "async"):
                torch.manual_seed(99 + rank)
                x = torch.randn(rows, w["hidden"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
                y = stack_of(1, mode)(x)
                y.backward(torch.ones_like(y))
                outs[mode] = (y.detach().float(), x.grad.float())
            diff = max(((outs["async"][i] - outs["sp"][i]).norm() / outs["sp"][i].norm()).item() for i in range(2))
            if rank == 0:
                print(f"async against sp: relative difference {diff:.2e} (output and input gradient)", flush=True)
        except Exception as e:  # keep the other variants' figures
            if rank == 0:
                print(f"async: not run ({type(e).__name__}: {e})", flush=True)
            variants.remove("async")
    for variant in variants:
        try:
            t1 = run(variant, a.layers)
            t2 = run(variant, 2 * a.layers)
        except Exception as e:
            if rank == 0:
                print(f"{variant}: failed ({type(e).__name__}: {e})", flush=True)
            continue
        layer = (t2 - t1) / a.layers
        row = dict(width=a.width, tp=tp, variant=variant, ms_stack_L=round(t1, 3), ms_stack_2L=round(t2, 3),
                   ms_per_layer=round(layer, 3), gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        if rank == 0:
            print(json.dumps(row), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
