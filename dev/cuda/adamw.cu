// The multi-tensor optimizer kernels (engine/kernels/multi_tensor.cu) against a CPU reference:
// the fp64 gradient sum of squares (and that it is bitwise repeatable) and AdamW with clipping
// and the bf16 write-back, from fp32 and from bf16 gradients (parallel.grad_reduce_dtype); then
// timed at LLaMA 1B's size against the bytes they must move.
//   dev/cuda/adamw [millions of parameters]      (default 1100)
#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

// The tensor table and its chunks in device memory, plus the norm's scratch.
struct Table {
  int64_t chunks;
  dev::DeviceBuffer<OptimTensor> tensors;
  dev::DeviceBuffer<OptimChunk> chunk_list;
  dev::DeviceBuffer<double> partials, out;
  explicit Table(const std::vector<OptimTensor>& host)
      : chunks(int64_t(make_chunks(host).size())), tensors(host.size()), chunk_list(chunks), partials(chunks), out(1) {
    const auto c = make_chunks(host);
    CUDA_CHECK(cudaMemcpy(tensors.ptr, host.data(), host.size() * sizeof(OptimTensor), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(chunk_list.ptr, c.data(), c.size() * sizeof(OptimChunk), cudaMemcpyHostToDevice));
  }
  void sum_squares() { grad_sum_squares(tensors.ptr, chunk_list.ptr, chunks, partials.ptr, out.ptr, nullptr); }
  void step(const AdamWStep& s) { adamw(tensors.ptr, chunk_list.ptr, chunks, s, nullptr); }
};

int main(int argc, char** argv) {
  const double millions = argc > 1 ? std::atof(argv[1]) : 1100;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = true;
  // Correctness on a few odd-sized tensors (chunk edges), one not counted in the norm, the last
  // one 4 bytes past 16-byte alignment (the kernel's one-element path); tensors 2 and 5 have
  // bf16 gradients (5's 2 bytes past 8-byte alignment).
  {
    std::printf("adamw + grad norm, small tensors\n");
    const std::vector<int64_t> sizes = {1, 70000, 131072, 5, 200001, 70001};
    auto shift = [&](size_t k) { return k == 5 ? 1 : 0; };
    auto read = [&](const dev::DeviceBuffer<float>& b, size_t k) {
      auto v = dev::download(b, sizes[k] + shift(k));
      return std::vector<float>(v.begin() + shift(k), v.end());
    };
    std::vector<OptimTensor> tensors;
    std::vector<std::vector<float>> p, g, m, v;
    std::vector<dev::DeviceBuffer<float>*> bufs;
    std::vector<dev::DeviceBuffer<uint16_t>*> model;
    std::vector<dev::DeviceBuffer<__nv_bfloat16>*> bf16_grads;
    double sq_ref = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      const bool bf16_grad = k == 2 || k == 5;
      p.push_back(dev::random_floats(n, 1.f, 10 + k));
      g.push_back(bf16_grad ? dev::round_bf16(dev::random_floats(n, 0.1f, 20 + k)) : dev::random_floats(n, 0.1f, 20 + k));
      m.push_back(dev::random_floats(n, 0.01f, 30 + k));
      auto vv = dev::random_floats(n, 0.01f, 40 + k);
      for (auto& x : vv) x = x * x;
      v.push_back(vv);
      const int o = shift(k);
      auto* dp = new dev::DeviceBuffer<float>(n + o); auto* dg = new dev::DeviceBuffer<float>(n + o);
      auto* dm = new dev::DeviceBuffer<float>(n + o); auto* dv = new dev::DeviceBuffer<float>(n + o);
      auto* db = new dev::DeviceBuffer<uint16_t>(n + o);
      auto put = [o](dev::DeviceBuffer<float>& buf, std::vector<float> host) {
        host.insert(host.begin(), o, 0.f);
        dev::upload(buf, host);
      };
      put(*dp, p[k]), put(*dg, g[k]), put(*dm, m[k]), put(*dv, v[k]);
      bufs.insert(bufs.end(), {dp, dg, dm, dv});
      model.push_back(db);
      const void* grad = dg->ptr + o;
      if (bf16_grad) {
        auto* dgb = new dev::DeviceBuffer<__nv_bfloat16>(n + o);
        auto host = g[k];
        host.insert(host.begin(), o, 0.f);
        dev::upload(*dgb, host);
        bf16_grads.push_back(dgb);
        grad = dgb->ptr + o;
      }
      const int in_norm = k != 3;
      if (in_norm) for (float x : g[k]) sq_ref += double(x) * x;
      tensors.push_back({dp->ptr + o, grad, dm->ptr + o, dv->ptr + o, k % 2 ? db->ptr + o : nullptr, n,
                         k % 2 ? 0.1f : 0.f, in_norm, bf16_grad ? 1 : 0});
    }
    Table t(tensors);
    t.sum_squares();
    double sq[2];
    CUDA_CHECK(cudaMemcpy(&sq[0], t.out.ptr, 8, cudaMemcpyDeviceToHost));
    t.sum_squares();
    CUDA_CHECK(cudaMemcpy(&sq[1], t.out.ptr, 8, cudaMemcpyDeviceToHost));
    ok &= dev::check("sum of squares (fp64)", {float(sq[0])}, {float(sq_ref)}, 1e-7, 0);
    const bool same = std::memcmp(&sq[0], &sq[1], 8) == 0;
    std::printf("  check %-28s %s\n", "repeatable bits", same ? "ok" : "FAIL");
    ok &= same;
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 1.f - 0.9f * 0.9f, std::sqrt(1.f - 0.95f * 0.95f), 0.5f};
    t.step(s);
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<float> pr(sizes[k]), mr(sizes[k]), vr(sizes[k]);
      for (int64_t i = 0; i < sizes[k]; ++i) {
        const double gg = g[k][i] * 0.5;
        double pp = p[k][i] * (1 - s.lr * tensors[k].weight_decay);
        const double mm = 0.9 * m[k][i] + 0.1 * gg, vv = 0.95 * v[k][i] + 0.05 * gg * gg;
        pp -= s.lr / s.bias_correction1 * mm / (std::sqrt(vv) / s.bias_correction2_sqrt + s.eps);
        pr[i] = float(pp), mr[i] = float(mm), vr[i] = float(vv);
      }
      ok &= dev::check("master", read(*bufs[4 * k], k), pr, 1e-5, 1e-6);
      ok &= dev::check("exp_avg", read(*bufs[4 * k + 2], k), mr, 1e-5, 1e-8);
      ok &= dev::check("exp_avg_sq", read(*bufs[4 * k + 3], k), vr, 1e-5, 1e-12);
      if (tensors[k].model_bf16) {
        std::vector<uint16_t> raw(sizes[k]);
        CUDA_CHECK(cudaMemcpy(raw.data(), model[k]->ptr + shift(k), raw.size() * 2, cudaMemcpyDeviceToHost));
        auto master = read(*bufs[4 * k], k);
        std::vector<float> got(sizes[k]), want(sizes[k]);
        for (int64_t i = 0; i < sizes[k]; ++i) {
          __nv_bfloat16 b;
          std::memcpy(&b, &raw[i], 2);
          got[i] = __bfloat162float(b), want[i] = __bfloat162float(__float2bfloat16(master[i]));
        }
        ok &= dev::check("bf16 model copy", got, want, 0, 0);
      }
    }
    for (auto* b : bufs) delete b;
    for (auto* b : model) delete b;
    for (auto* b : bf16_grads) delete b;
  }
  // Speed: one fp32 tensor set of the model's size, split like a 22-layer model's parameters.
  {
    const int64_t total = int64_t(millions * 1e6), pieces = 200;
    std::printf("adamw + grad norm, %.0fM parameters in %lld tensors\n", millions, (long long)pieces);
    dev::DeviceBuffer<float> p(total), g(total), m(total), v(total);
    dev::DeviceBuffer<uint16_t> model(total);
    for (float* ptr : {p.ptr, g.ptr, m.ptr, v.ptr}) CUDA_CHECK(cudaMemset(ptr, 0, total * 4));
    std::vector<OptimTensor> tensors;
    for (int64_t k = 0, off = 0; k < pieces; ++k) {
      const int64_t n = k + 1 < pieces ? total / pieces : total - off;
      tensors.push_back({p.ptr + off, g.ptr + off, m.ptr + off, v.ptr + off, model.ptr + off, n, 0.1f, 1});
      off += n;
    }
    Table t(tensors);
    const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.2f, 1.f};
    dev::report("grad sum of squares", dev::time_ms([&] { t.sum_squares(); }, 10), 4.0 * total);
    dev::report("adamw + bf16 write-back", dev::time_ms([&] { t.step(s); }, 10),
                (16.0 + 12.0 + 2.0) * total);
    // the same from bf16 gradients: 2 bytes fewer read per element
    dev::DeviceBuffer<uint16_t> g16(total);
    CUDA_CHECK(cudaMemset(g16.ptr, 0, total * 2));
    for (int64_t k = 0, off = 0; k < pieces; off += tensors[k].numel, ++k) {
      tensors[k].grad = g16.ptr + off;
      tensors[k].grad_bf16 = 1;
    }
    Table t16(tensors);
    dev::report("adamw, bf16 grads", dev::time_ms([&] { t16.step(s); }, 10), (14.0 + 12.0 + 2.0) * total);
  }
  return ok ? 0 : 1;
}
