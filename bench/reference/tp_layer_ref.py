#!/usr/bin/env python3
"""Plain-PyTorch reference for issue #35: the marginal time of a transformer layer at the user's
widths under tensor parallelism with sequence parallelism, the same measure as
bench/speed/tp_width.sh (layers L and 2L, so that only the layers remain; per-GPU efficiency = the
tp 1 layer time / (tp x the layer time at tp)), forward + backward of one micro-batch of 1 x seq.

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

WIDTHS = {  # the GPT-39B width: GPT (LayerNorm, biases, GeLU); seq as the recipes
    "gpt39b": dict(hidden=8192, heads=64, ffn=32768, seq=2048),
}


class AllGatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] * tp,) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, dy):
        return ReduceScatterRows.apply(dy, ctx.group), None


class ReduceScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        tp = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] // tp,) + tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, dy):
        return AllGatherRows.apply(dy, ctx.group), None


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
    """A GPT layer's tp-local shard; x is this rank's rows [seq / tp, hidden] of the residual."""

    def __init__(self, w, tp, group, mode):
        super().__init__()
        h, self.heads = w["hidden"], w["heads"] // tp
        self.head_dim = h // w["heads"]
        self.tp, self.group, self.mode = tp, group, mode
        self.name = group.group_name if group is not None else None
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, device="cuda", dtype=torch.bfloat16) * 0.02)
        z = lambda *s: torch.nn.Parameter(torch.zeros(*s, device="cuda", dtype=torch.bfloat16))
        o = lambda *s: torch.nn.Parameter(torch.ones(*s, device="cuda", dtype=torch.bfloat16))
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = o(h), z(h), o(h), z(h)
        self.qkv_w, self.qkv_b = p(3 * h // tp, h), z(3 * h // tp)
        self.proj_w, self.proj_b = p(h, h // tp), z(h)
        self.fc1_w, self.fc1_b = p(w["ffn"] // tp, h), z(w["ffn"] // tp)
        self.fc2_w, self.fc2_b = p(h, w["ffn"] // tp), z(h)

    def column(self, x, w, b):  # x: this rank's rows; all rows of x w^T + b
        if self.tp == 1:
            return F.linear(x, w, b)
        if self.mode == "async":
            return FusedAllGatherMatmul.apply(x, w, self.name) + b
        return F.linear(AllGatherRows.apply(x, self.group), w, b)

    def row(self, y, w, b):  # y: all rows of a tp-split input; this rank's rows of y w^T (summed) + b
        if self.tp == 1:
            return F.linear(y, w, b)
        if self.mode == "async":
            return FusedMatmulReduceScatter.apply(y, w, self.name) + b
        return ReduceScatterRows.apply(F.linear(y, w), self.group) + b

    def forward(self, x):
        h = x.shape[-1]
        qkv = self.column(F.layer_norm(x, (h,), self.ln1_w, self.ln1_b), self.qkv_w, self.qkv_b)
        t = qkv.shape[0]
        q, k, v = qkv.view(t, self.heads, 3, self.head_dim).permute(2, 1, 0, 3).unsqueeze(1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [1, heads, t, d]
        y = y.squeeze(0).transpose(0, 1).reshape(t, self.heads * self.head_dim)
        x = x + self.row(y, self.proj_w, self.proj_b)
        f = F.gelu(self.column(F.layer_norm(x, (h,), self.ln2_w, self.ln2_b), self.fc1_w, self.fc1_b), approximate="tanh")
        return x + self.row(f, self.fc2_w, self.fc2_b)


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
    rows = w["seq"] // tp
    results = {}

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
            for p in (model.parameters() if hasattr(model, "parameters") else []):
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
        results[variant] = row
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
