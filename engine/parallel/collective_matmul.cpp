#include "engine/parallel/collective_matmul.h"

#include "engine/core/error.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/mappings.h"
#include "engine/parallel/symmetric_slots.h"

#include <optional>

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#endif

namespace me::parallel {

namespace {
#if ME_TORCH_HAS_CUDA
// One side stream per GPU for tensor-parallel collectives.
c10::cuda::CUDAStream tp_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, c10::cuda::getStreamFromPool(true, device)).first;
  return it->second;
}
#endif

torch::Tensor rows2d(const torch::Tensor& t) { return t.view({-1, t.size(-1)}); }
}  // namespace

std::function<void()> start_collective(const std::vector<torch::Tensor>& uses, const std::function<void()>& collective,
                                       torch::Tensor* produced) {
#if ME_TORCH_HAS_CUDA
  if (!uses.empty() && uses.front().is_cuda()) {
    const auto index = uses.front().device().index();
    const auto compute = c10::cuda::getCurrentCUDAStream(index);
    const auto side = tp_stream(index);
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      collective();
    }
    // The allocator must not hand these blocks out again before both streams are done.
    for (const auto& t : uses) t.record_stream(side);
    if (produced && produced->defined()) produced->record_stream(compute);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(side);
    return [done, compute] { done->block(compute); };
  }
#endif
  collective();
  return [] {};
}

SmMarginForCollective::SmMarginForCollective(const torch::Tensor& on, const TensorParallel& tp) {
#if ME_TORCH_HAS_CUDA
  if (tp.comm_sm_margin <= 0 || !on.is_cuda()) return;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  ME_CHECK(tp.comm_sm_margin < sms, "parallel.tp_comm_sm_margin (", tp.comm_sm_margin,
           ") must leave the GEMMs some of this GPU's ", sms, " multiprocessors");
  const int target = sms - tp.comm_sm_margin;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  ME_CHECK(cublasGetSmCountTarget(handle, &previous_) == CUBLAS_STATUS_SUCCESS &&
               cublasSetSmCountTarget(handle, target) == CUBLAS_STATUS_SUCCESS,
           "cublasSetSmCountTarget(", target, ") failed");
  handle_ = handle;
  compat::set_matmul_sm_carveout(tp.comm_sm_margin);  // LibTorch's cuBLASLt GEMMs, where it has the setting
  kernels::set_gemm_sm_count_target(target);         // ours (GeLU epilogues)
#else
  (void)on;
  (void)tp;
#endif
}

SmMarginForCollective::~SmMarginForCollective() {
#if ME_TORCH_HAS_CUDA
  if (!handle_) return;
  cublasSetSmCountTarget(static_cast<cublasHandle_t>(handle_), previous_);
  compat::set_matmul_sm_carveout(std::nullopt);
  kernels::set_gemm_sm_count_target(0);
#endif
}

torch::Tensor all_gather_rows(const torch::Tensor& local, const TensorParallel& tp, const RowsInto& rows) {
  ME_CHECK(local.dim() >= 2, "all_gather_rows: expected [batch, seq / tp, ...], got shape ", local.sizes());
  auto in = local.contiguous();
  auto& group = *tp.group;
  const auto sizes = gathered_tokens_shape(in, group.size());
  const int64_t m = rows2d(in).size(0), first = m * group.rank(), total = m * group.size();
  // In a registered slot (parallel.tp_symmetric_mb) the gather runs in place: this rank's rows
  // are copied to where the gather expects them first.
  auto gathered = tp.slots ? tp.slots->take(sizes, in.options()) : torch::Tensor();
  std::function<void()> join;
  if (gathered.defined()) {
    auto mine = rows2d(gathered).narrow(0, first, m);
    mine.copy_(rows2d(in));
    join = start_collective({in, gathered}, [&] { group.all_gather(gathered, mine); });
  } else {
    gathered = torch::empty(sizes, in.options());
    join = start_collective({in, gathered}, [&] { group.all_gather(gathered, in); });
  }
  {
    SmMarginForCollective margin(in, tp);
    rows(rows2d(in), first);
  }
  join();
  const auto all = rows2d(gathered);
  if (first > 0) rows(all.narrow(0, 0, first), 0);
  if (first + m < total) rows(all.narrow(0, first + m, total - first - m), first + m);
  return gathered;
}

torch::Tensor reduce_scatter_rows(int64_t chunk_rows, const TensorParallel& tp,
                                  const std::function<torch::Tensor(int64_t first, int64_t n)>& partial) {
  auto& group = *tp.group;
  const int size = group.size(), rank = group.rank();
  std::vector<torch::Tensor> received;
  std::vector<std::function<void()>> joins;
  std::optional<SmMarginForCollective> margin;  // from the second GEMM on, a send runs beside each
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size, from = (rank - step + size) % size;
    auto mine = partial(to * chunk_rows, chunk_rows).contiguous();
    if (!margin) margin.emplace(mine, tp);
    auto theirs = torch::empty_like(mine);
    joins.push_back(start_collective({mine, theirs}, [&] {
      group.send_recv({{comm::PeerOp::send, mine, to}, {comm::PeerOp::recv, theirs, from}});
    }));
    received.push_back(theirs);
  }
  auto own = partial(rank * chunk_rows, chunk_rows).contiguous();
  margin.reset();
  for (auto& join : joins) join();
  for (const auto& r : received) own.add_(r);
  return own;
}

}  // namespace me::parallel
