// fp8 scaling (engine/kernels/fp8_scaling.h) on the CPU: the emulated cast against values
// written down by hand and, where the CUDA headers are here, against cuda_fp8.h's own host
// conversion (the one the GPU kernel and the fp8 GEMMs' inputs follow) on many random values;
// delayed and current scaling step by step; the checkpoint state. The GPU kernel itself is
// checked by dev/cuda/fp8_cast.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "engine/core/error.h"
#include "engine/kernels/fp8_scaling.h"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define ME_TEST_CUDA_FP8 1
#endif

using me::kernels::Fp8;
using me::kernels::Fp8Scale;
using me::kernels::Fp8ScalingOptions;

namespace {

float round_one(float v, Fp8 f) { return me::kernels::fp8_round(torch::tensor({v}), f)[0].item<float>(); }

}  // namespace

TEST_CASE("fp8_round: E4M3 and E5M2 values by hand", "[fp8]") {
  CHECK(round_one(448, Fp8::e4m3) == 448);
  CHECK(round_one(500, Fp8::e4m3) == 448);     // saturates, no inf
  CHECK(round_one(-1000, Fp8::e4m3) == -448);
  CHECK(round_one(0.1f, Fp8::e4m3) == 0.1015625f);  // 13 x 2^-7
  CHECK(round_one(1.0625f, Fp8::e4m3) == 1.0f);     // halfway between 1 and 1.125: to even
  CHECK(round_one(1.1875f, Fp8::e4m3) == 1.25f);    // halfway between 1.125 and 1.25: to even
  CHECK(round_one(0.001953125f, Fp8::e4m3) == 0.001953125f);  // 2^-9, the smallest subnormal
  CHECK(round_one(0.0009765625f, Fp8::e4m3) == 0.0f);         // 2^-10: halfway to 0, to even
  CHECK(round_one(3.3f, Fp8::e4m3) == 3.25f);
  CHECK(round_one(0, Fp8::e4m3) == 0);
  CHECK(std::isnan(round_one(std::nanf(""), Fp8::e4m3)));
  CHECK(round_one(57344, Fp8::e5m2) == 57344);
  CHECK(round_one(60000, Fp8::e5m2) == 57344);
  CHECK(round_one(3.3f, Fp8::e5m2) == 3.5f);
  CHECK(round_one(0.1f, Fp8::e5m2) == 0.09375f);
  CHECK(round_one(0.0009765625f, Fp8::e5m2) == 0.0009765625f);  // normal in E5M2
}

#if ME_TEST_CUDA_FP8
TEST_CASE("fp8_round equals cuda_fp8.h's conversion on random values", "[fp8]") {
  std::mt19937 gen(5);
  std::vector<float> values;
  for (int scale = -12; scale <= 18; scale += 2) {
    std::normal_distribution<float> d(0.f, std::ldexp(1.f, scale));
    for (int i = 0; i < 2000; ++i) values.push_back(d(gen));
  }
  const auto x = torch::tensor(values);
  const auto e4 = me::kernels::fp8_round(x, Fp8::e4m3), e5 = me::kernels::fp8_round(x, Fp8::e5m2);
  size_t bad4 = 0, bad5 = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    bad4 += e4[static_cast<int64_t>(i)].item<float>() != float(__nv_fp8_e4m3(values[i]));
    bad5 += e5[static_cast<int64_t>(i)].item<float>() != float(__nv_fp8_e5m2(values[i]));
  }
  CHECK(bad4 == 0);
  CHECK(bad5 == 0);
}
#endif

TEST_CASE("delayed scaling follows the largest amax of its history", "[fp8]") {
  Fp8ScalingOptions o;
  o.history = 2;
  Fp8Scale s(Fp8::e4m3, o);
  CHECK(s.scale().item<float>() == 1.0f);  // before any amax
  auto amax = [](float v) { return torch::tensor({v}); };
  s.record(amax(10));
  CHECK(s.scale().item<float>() == Approx(44.8));
  s.record(amax(20));
  CHECK(s.scale().item<float>() == Approx(22.4));
  s.record(amax(5));  // history [20, 5]
  CHECK(s.scale().item<float>() == Approx(22.4));
  s.record(amax(5));  // [5, 5]
  CHECK(s.scale().item<float>() == Approx(89.6));
  s.record(amax(0));  // [5, 0]: still 5
  CHECK(s.scale().item<float>() == Approx(89.6));
  // the scale is read before the cast: a delayed scale ignores the tensor
  CHECK(s.scale_for(torch::full({4}, 1000.f)).item<float>() == Approx(89.6));
  SECTION("a margin divides the scale by 2^margin; a non-finite amax history keeps the scale") {
    o.margin = 1;
    Fp8Scale m(Fp8::e5m2, o);
    m.record(amax(7));
    CHECK(m.scale().item<float>() == Approx(57344.0 / 7 / 2));
    m.record(amax(std::numeric_limits<float>::infinity()));
    CHECK(m.scale().item<float>() == Approx(57344.0 / 7 / 2));
  }
}

TEST_CASE("current scaling takes the tensor's own amax", "[fp8]") {
  Fp8ScalingOptions o;
  o.mode = "current";
  Fp8Scale s(Fp8::e4m3, o);
  const auto x = torch::tensor({1.f, -4.f, 2.f});
  CHECK(s.scale_for(x).item<float>() == Approx(112));  // 448 / 4
  // the scaled tensor's largest value lands on the format's largest
  CHECK(me::kernels::fp8_round(x * s.scale(), Fp8::e4m3).abs().max().item<float>() == 448);
  CHECK(s.scale_for(torch::zeros({3})).item<float>() == Approx(112));  // all zero: kept
}

TEST_CASE("fp8 scaling state round-trips through a checkpoint tensor", "[fp8]") {
  Fp8ScalingOptions o;
  o.history = 3;
  Fp8Scale a(Fp8::e4m3, o), b(Fp8::e4m3, o);
  for (float v : {3.f, 9.f}) a.record(torch::tensor({v}));
  b.load_state(a.state());
  CHECK(torch::equal(a.scale(), b.scale()));
  CHECK(torch::equal(a.history(), b.history()));
  a.record(torch::tensor({1.f}));
  b.record(torch::tensor({1.f}));
  CHECK(torch::equal(a.state(), b.state()));
  Fp8ScalingOptions other;
  other.history = 4;
  Fp8Scale c(Fp8::e4m3, other);
  CHECK_THROWS_WITH(c.load_state(a.state()), Catch::Contains("another amax history length"));
  o.mode = "sometimes";
  CHECK_THROWS_WITH(Fp8Scale(Fp8::e4m3, o), Catch::Contains("\"delayed\" or \"current\""));
}
