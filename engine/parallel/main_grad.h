// Gradient-accumulation fusion (Megatron's gradient_accumulation_fusion): a linear layer's
// weight-gradient GEMM writes, or adds, its result straight into the main-grad buffer, in the
// buffer's dtype (fp32, or bf16 under parallel.grad_reduce_dtype).
// Without it the GEMM produces a bf16 gradient that a hook widens and copies into the buffer:
// one more pass over every weight per micro-batch, and a bf16 rounding the fp32 output avoids.
#pragma once
#include <torch/torch.h>

#include <deque>
#include <functional>
#include <mutex>
#include <vector>

namespace me::parallel {

// Weight-gradient GEMMs held back by a pipeline schedule (parallel.pp_deferred_wgrads): a
// stage's backward computes only the input gradients its neighbour waits for, and runs the
// weight gradients later, in the time it would otherwise spend waiting (the zero-bubble idea of
// Qi et al. 2024). Grouped by micro-batch and run oldest first, so every main grad accumulates
// in the same order as without holding back: the same bits.
class WeightGradQueue {
 public:
  void begin_micro_batch();
  // Called from autograd's threads (the engine runs CUDA backward on a thread per device).
  void push(std::function<void()> gemms);
  size_t micro_batches() const;
  void run_oldest();  // the oldest micro-batch's GEMMs, in the order they were queued
  void run_down_to(size_t keep);  // oldest first, until `keep` micro-batches' remain
  void clear();  // drops what is queued (a step that failed part-way)

 private:
  mutable std::mutex mutex_;
  std::deque<std::vector<std::function<void()>>> batches_;
};

// One weight-gradient GEMM a linear layer's backward holds (parallel.tp_delay_wgrad) until the
// next tensor-parallel collective of backward starts, to run beside it: the all-gather of the
// layer before hides behind a whole GEMM instead of the input-gradient GEMM split per rank's
// rows, and that GEMM runs unsplit. What is held runs at the latest when autograd's backward
// pass ends (a final callback the holder queues), so no gradient is left out of the step. Each
// GEMM still adds into its own main grad in micro-batch order: the same bits. Process-wide: one
// GPU per process, whose backward runs on one thread.
class DelayedWeightGrad {
 public:
  static void hold(std::function<void()> gemms);  // runs the GEMM held before, if any, first
  static void run();                              // the held GEMM, if any
  static void drop();                             // what a step that failed part-way left
  // Whether the held GEMMs run on a stream of their own (parallel.tp_wgrad_stream; process-wide,
  // set when a run's layers are built). ME_TP_WGRAD_STREAM=m, set, overrides it: on their own
  // stream leaving m multiprocessors free.
  static void set_own_stream(bool on);
  // `gemms` as they run on that stream, `uses` kept from reuse until they are done; or, with the
  // stream off or on a CPU, `gemms` itself.
  static std::function<void()> on_own_stream(std::function<void()> gemms, std::vector<torch::Tensor> uses);
  static void join();  // the compute stream waits for what ran on that stream
  // The current stream waits for what ran on that stream so far, unless it is that stream: before
  // anything else writes or reads a main grad the held GEMMs may write (a tied embedding's lookup,
  // a bucket's reduction, whose last gradient may come from another stream).
  static void fence();
};

// While one lives on this thread, the linear layers run their weight-gradient GEMMs at once even
// where a pipeline stage holds them back (MainGradSink::held_back). A fully recomputed block's
// backward sets it: a held-back GEMM would keep the block's rebuilt inputs and output gradients
// alive until the micro-batch's backward is over, a layer's activations for each layer of the
// stage, which is what recomputation saves (measured: 634 MiB more at the LLaMA-2-70B width, tp 2
// x pp 2, for the second of two layers). Autograd runs the nested backward on this thread.
class WeightGradsInline {
 public:
  WeightGradsInline() { ++depth(); }
  ~WeightGradsInline() { --depth(); }
  WeightGradsInline(const WeightGradsInline&) = delete;
  WeightGradsInline& operator=(const WeightGradsInline&) = delete;
  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

// Where weight gradients go (parallel::GradBuffer implements it).
class MainGradSink {
 public:
  virtual ~MainGradSink() = default;
  // The main grad of `param` (fp32, or bf16 under parallel.grad_reduce_dtype), shaped like it,
  // and whether it already holds a gradient of this step (add to it) or not (overwrite it).
  // Undefined when `param` is not in the buffer: the caller hands its gradient to autograd as usual.
  virtual torch::Tensor main_grad(const torch::Tensor& param, bool* accumulate) = 0;
  // The gradient of `param` for this micro-batch is in place (its bucket may start reducing).
  virtual void mark_written(const torch::Tensor& param) = 0;
  // Part of `param`'s gradient of this micro-batch is in place, and a later mark_written brings
  // the rest (a weight used twice: the tied word embedding, written by the output layer's GEMM
  // and then by the lookup's backward). Later writes of the micro-batch add to it.
  virtual void mark_partly_written(const torch::Tensor& param) = 0;

  // While set, the linear layers queue their weight-gradient GEMMs into `queue` instead of
  // running them (null: run them at once).
  void hold_back_into(WeightGradQueue* queue) { held_back_ = queue; }
  WeightGradQueue* held_back() const { return held_back_; }

 private:
  WeightGradQueue* held_back_ = nullptr;
};

// The writes of the first user of a weight used twice in one micro-batch (the tied word
// embedding's output layer, when the lookup's backward follows): into `sink`'s main grads, each
// marked partly written. No pipeline schedule holds these back: a stage using the weight twice
// is the whole model (pp = 1).
class FirstPartOf : public MainGradSink {
 public:
  explicit FirstPartOf(MainGradSink* sink) : sink_(sink) {}
  torch::Tensor main_grad(const torch::Tensor& param, bool* accumulate) override { return sink_->main_grad(param, accumulate); }
  void mark_written(const torch::Tensor& param) override { sink_->mark_partly_written(param); }
  void mark_partly_written(const torch::Tensor& param) override { sink_->mark_partly_written(param); }

 private:
  MainGradSink* sink_;
};

}  // namespace me::parallel
