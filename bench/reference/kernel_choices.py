"""Micro-benchmarks behind three choices of the engine, on the GPU it runs on (bench/RESULTS.md):
1. weight gradients written in fp32 by the GEMM (mm/addmm out_dtype) vs a bf16 GEMM plus a copy
   or add into the fp32 main grad (parallel::linear, gradient-accumulation fusion);
2. bias gradients as a dim-0 sum vs a ones^T dy GEMV into fp32;
3. SDPA on strided q/k/v views of the fused QKV projection vs contiguous copies, and the SDPA
   backends for LLaMA 1B's grouped-query attention.
    python3 bench/reference/kernel_choices.py
"""
import time

import torch
import torch.nn.functional as F

dev = "cuda"


def bench(f, n=20):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3

torch.manual_seed(0)
for (T, O, I) in [(8192, 6144, 2048), (8192, 2048, 2048), (8192, 8192, 2048), (8192, 2048, 8192), (8192, 32000, 2048)]:
    dy = torch.randn(T, O, device=dev, dtype=torch.bfloat16)
    x = torch.randn(T, I, device=dev, dtype=torch.bfloat16)
    acc = torch.zeros(O, I, device=dev, dtype=torch.float32)
    ref = dy.t().float() @ x.float()
    try:
        torch.ops.aten.mm.dtype_out(dy.t(), x, torch.float32, out=acc)
        e1 = ((acc - ref).abs().max() / ref.abs().max()).item()
        torch.ops.aten.addmm.dtype_out(acc, dy.t(), x, torch.float32, out=acc)
        e2 = ((acc - 2 * ref).abs().max() / ref.abs().max()).item()
        t_fused = bench(lambda: torch.ops.aten.addmm.dtype_out(acc, dy.t(), x, torch.float32, out=acc))
        t_mm0 = bench(lambda: torch.ops.aten.mm.dtype_out(dy.t(), x, torch.float32, out=acc))
    except Exception as ex:
        print("dtype_out failed:", ex); e1 = e2 = t_fused = t_mm0 = float('nan')
    g = torch.empty(O, I, device=dev, dtype=torch.bfloat16)
    t_bf16 = bench(lambda: torch.mm(dy.t(), x, out=g))
    t_copy = bench(lambda: acc.copy_(g))
    t_add = bench(lambda: acc.add_(g))
    t_bias = bench(lambda: dy.sum(0, dtype=torch.float32))
    print(f"T={T} O={O} I={I}: err mm {e1:.2e} addmm {e2:.2e} | fp32-out mm {t_mm0:.3f} ms, addmm-acc {t_fused:.3f} | bf16 mm {t_bf16:.3f} + copy {t_copy:.3f} / add {t_add:.3f} | bias sum {t_bias:.3f}")

T = 8192
for N in [6144, 2048, 8192]:
    dy = torch.randn(T, N, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(1, N, device=dev, dtype=torch.float32)
    ones = torch.ones(1, T, device=dev, dtype=torch.bfloat16)
    ref = dy.float().sum(0)
    torch.ops.aten.mm.dtype_out(ones, dy, torch.float32, out=out)
    err = ((out[0] - ref).abs().max() / ref.abs().max()).item()
    t_sum = bench(lambda: dy.sum(0, dtype=torch.float32))
    t_gemv = bench(lambda: torch.ops.aten.mm.dtype_out(ones, dy, torch.float32, out=out))
    t_gemv_acc = bench(lambda: torch.ops.aten.addmm.dtype_out(out, ones, dy, torch.float32, out=out))
    mb = T * N * 2 / 1e6
    print(f"bias grad N={N}: sum {t_sum:.4f} ms ({mb/t_sum:.0f} GB/s), gemv {t_gemv:.4f} ({mb/t_gemv:.0f} GB/s), gemv+acc {t_gemv_acc:.4f}, err {err:.1e}")
# attention on GPT's fused QKV layout: views straight out of qkv vs contiguous copies
b, s, h, d = 4, 2048, 16, 128
for backend in ["auto", "cudnn", "flash"]:
    qkv = torch.randn(b, s, h, 3, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    def run(contig):
        q = qkv.select(3, 0).transpose(1, 2); k = qkv.select(3, 1).transpose(1, 2); v = qkv.select(3, 2).transpose(1, 2)
        if contig: q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(torch.ones_like(y))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    ctx = {"auto": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    for contig in [True, False]:
        try:
            if ctx is None: t = bench(lambda: run(contig))
            else:
                with sdpa_kernel(ctx): t = bench(lambda: run(contig))
            print(f"attention gpt {backend} {'contiguous' if contig else 'strided views'}: {t:.3f} ms fwd+bwd")
        except Exception as e:
            print(f"attention gpt {backend} contig={contig}: failed {str(e)[:100]}")
# LLaMA GQA: 32 heads, 4 groups, d 64
b, s, hq, g, d = 4, 2048, 32, 4, 64
q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(b, g, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(b, g, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
from torch.nn.attention import sdpa_kernel, SDPBackend
for name, ctx in [("auto", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
    def run():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        y.backward(torch.ones_like(y))
    try:
        if ctx is None: t = bench(run)
        else:
            with sdpa_kernel(ctx): t = bench(run)
        print(f"attention llama gqa {name}: {t:.3f} ms fwd+bwd")
    except Exception as e:
        print(f"attention llama {name}: failed {str(e)[:100]}")
