#include "engine/plan/device_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/plan/embedded_profiles.h"

namespace me::plan {

using nlohmann::json;

double Curve::at(double x) const {
  ME_CHECK(!points.empty(), "a profile curve has no points");
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [x1, y1] = points[i];
    if (x > x1) continue;
    const auto& [x0, y0] = points[i - 1];
    const double t = std::log(x / x0) / std::log(x1 / x0);
    return y0 + t * (y1 - y0);
  }
  return points.back().second;
}

namespace {
double by_tp(const std::map<int, double>& values, int tp) {  // interpolated in log(tp)
  Curve c;
  for (const auto& [size, v] : values) c.points.emplace_back(size, v);
  return c.at(tp);
}
}  // namespace

double DeviceProfile::tp_exposed_at(int tp, bool sequence_parallel) const {
  if (tp <= 1 || tp_exposed.empty()) return 0;
  return by_tp(!sequence_parallel && !tp_exposed_no_sp.empty() ? tp_exposed_no_sp : tp_exposed, tp);
}

double DeviceProfile::host_layer_ms_at(int tp, bool sequence_parallel) const {
  if (tp > 1 && !sequence_parallel && !host_layer_ms_no_sp.empty()) return by_tp(host_layer_ms_no_sp, tp);
  return host_layer_ms.empty() ? 0 : by_tp(host_layer_ms, tp);
}

double DeviceProfile::host_micro_ms_at(int tp) const { return host_micro_ms.empty() ? 0 : by_tp(host_micro_ms, tp); }

namespace {

// Reads fields with errors that name the file and the field's path.
struct Reader {
  std::string what;

  const json& member(const json& j, const std::string& path, const std::string& key) const {
    ME_CHECK(j.is_object() && j.contains(key), what, ": missing field '", path.empty() ? key : path + "." + key,
             "' (megaengine plan --calibrate writes a complete profile; profiles/h100-80gb.json is an example)");
    return j.at(key);
  }
  double positive(const json& j, const std::string& path, const std::string& key) const {
    const auto& v = member(j, path, key);
    ME_CHECK(v.is_number() && v.get<double>() > 0, what, ": '", path.empty() ? key : path + "." + key,
             "' must be a positive number, got ", v.dump());
    return v.get<double>();
  }
  std::string text(const json& j, const std::string& key) const {
    const auto& v = member(j, "", key);
    ME_CHECK(v.is_string(), what, ": '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  Curve curve(const json& j, const std::string& path, const std::string& key) const {
    const auto& v = member(j, path, key);
    const std::string name = path.empty() ? key : path + "." + key;
    ME_CHECK(v.is_array() && !v.empty(), what, ": '", name, "' must be a non-empty list of [x, value] pairs, got ",
             v.dump());
    Curve c;
    for (const auto& p : v) {
      ME_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number() && p[0].get<double>() > 0 &&
                   p[1].get<double>() > 0,
               what, ": each point of '", name, "' must be [x > 0, value > 0], got ", p.dump());
      ME_CHECK(c.points.empty() || p[0].get<double>() > c.points.back().first, what, ": the points of '", name,
               "' must be in ascending x, got ", p[0].get<double>(), " after ", c.points.back().first);
      c.points.emplace_back(p[0].get<double>(), p[1].get<double>());
    }
    return c;
  }
  LinkProfile link(const json& j, const std::string& key) const {
    const auto& l = member(j, "", key);
    LinkProfile out;
    out.all_gather = curve(l, key, "all_gather_gbps");
    out.reduce_scatter = curve(l, key, "reduce_scatter_gbps");
    out.all_reduce = curve(l, key, "all_reduce_gbps");
    out.send_recv = curve(l, key, "send_recv_gbps");
    out.latency_us = positive(l, key, "latency_us");
    return out;
  }
};

// An object of tp size -> number, such as {"2": 1.2, "4": 2.2}; `min_tp` the smallest key allowed.
std::map<int, double> by_tp_sizes(const json& j, const std::string& what, const std::string& key, int min_tp,
                                  bool positive) {
  std::map<int, double> out;
  ME_CHECK(j.is_object() && !j.empty(), what, ": '", key, "' must be an object such as {\"", min_tp, "\": 1.2, \"4\": 2.2}, got ",
           j.dump());
  for (const auto& [k, v] : j.items()) {
    int size = 0;
    try {
      size = std::stoi(k);
    } catch (const std::exception&) {
    }
    ME_CHECK(size >= min_tp && v.is_number() && (positive ? v.get<double>() > 0 : v.get<double>() >= 0), what, ": '", key,
             "' maps a tp size >= ", min_tp, " to a number ", positive ? "> 0" : ">= 0", ", got \"", k, "\": ", v.dump());
    out[size] = v.get<double>();
  }
  return out;
}

json by_tp_json(const std::map<int, double>& values) {
  json out = json::object();
  for (const auto& [size, v] : values) out[std::to_string(size)] = v;
  return out;
}

json curve_json(const Curve& c) {
  json a = json::array();
  for (const auto& [x, y] : c.points) a.push_back({x, y});
  return a;
}

json link_json(const LinkProfile& l) {
  return {{"all_gather_gbps", curve_json(l.all_gather)},
          {"reduce_scatter_gbps", curve_json(l.reduce_scatter)},
          {"all_reduce_gbps", curve_json(l.all_reduce)},
          {"send_recv_gbps", curve_json(l.send_recv)},
          {"latency_us", l.latency_us}};
}

}  // namespace

DeviceProfile parse_profile(const std::string& json_text, const std::string& what) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(what, ": not valid JSON (", e.what(), ")");
  }
  ME_CHECK(j.is_object(), what, ": a profile is a JSON object, got ", j.type_name());
  const Reader r{what};
  DeviceProfile p;
  p.name = r.text(j, "name");
  p.gpu = r.text(j, "gpu");
  p.source = r.text(j, "source");
  p.memory_bytes = r.positive(j, "", "memory_gb") * 1e9;
  p.matmul_tflops = r.positive(j, "", "matmul_tflops");
  p.gemm_efficiency = r.curve(j, "", "gemm_efficiency");
  for (const auto& [x, e] : p.gemm_efficiency.points)
    ME_CHECK(e <= 1.2, what, ": gemm_efficiency is a fraction of matmul_tflops, got ", e, " at dimension ", x);
  p.gemm_launch_us = r.positive(j, "", "gemm_launch_us");
  p.attention_tflops = r.curve(j, "", "attention_tflops");
  p.memory_gbps = r.positive(j, "", "memory_gbps");
  p.intra_node = r.link(j, "intra_node");
  p.inter_node = r.link(j, "inter_node");
  p.tp_exposed = by_tp_sizes(r.member(j, "", "tp_exposed"), what, "tp_exposed", 2, false);
  // Optional: profiles from before these were measured plan without them.
  if (j.contains("tp_exposed_no_sp"))
    p.tp_exposed_no_sp = by_tp_sizes(j.at("tp_exposed_no_sp"), what, "tp_exposed_no_sp", 2, false);
  if (j.contains("compute_in_step")) {
    const auto& v = j.at("compute_in_step");
    if (v.is_number()) p.compute_in_step.points = {{1, v.get<double>()}};
    else p.compute_in_step = r.curve(j, "", "compute_in_step");
    for (const auto& [hidden, k] : p.compute_in_step.points)
      ME_CHECK(k >= 0.5 && k <= 2, what, ": 'compute_in_step' must be a number between 0.5 and 2 (in-step over isolated kernel time), or a list of [hidden, such a number], got ",
               v.dump());
  }
  if (j.contains("host_layer_ms")) p.host_layer_ms = by_tp_sizes(j.at("host_layer_ms"), what, "host_layer_ms", 1, true);
  if (j.contains("host_layer_ms_no_sp"))
    p.host_layer_ms_no_sp = by_tp_sizes(j.at("host_layer_ms_no_sp"), what, "host_layer_ms_no_sp", 2, true);
  if (j.contains("host_micro_ms")) p.host_micro_ms = by_tp_sizes(j.at("host_micro_ms"), what, "host_micro_ms", 1, true);
  const auto& dp = r.member(j, "", "dp_exposed");
  ME_CHECK(dp.is_number() && dp.get<double>() >= 0 && dp.get<double>() <= 2, what,
           ": 'dp_exposed' must be a number between 0 and 2, got ", dp.dump());
  p.dp_exposed = dp.get<double>();
  return p;
}

DeviceProfile load_profile_file(const std::string& path) {
  std::ifstream in(path);
  ME_CHECK(in.good(), "cannot read the profile '", path, "': no such file or not readable (make one with megaengine plan --calibrate ",
           path, " on the GPU machine, or use a built-in one: --gpu ", builtin_profile_names().front(), ")");
  std::stringstream s;
  s << in.rdbuf();
  return parse_profile(s.str(), "profile " + path);
}

std::string profile_to_json(const DeviceProfile& p) {
  json j = {{"name", p.name},
                  {"gpu", p.gpu},
                  {"source", p.source},
                  {"memory_gb", p.memory_bytes / 1e9},
                  {"matmul_tflops", p.matmul_tflops},
                  {"gemm_efficiency", curve_json(p.gemm_efficiency)},
                  {"gemm_launch_us", p.gemm_launch_us},
                  {"attention_tflops", curve_json(p.attention_tflops)},
                  {"memory_gbps", p.memory_gbps},
                  {"intra_node", link_json(p.intra_node)},
                  {"inter_node", link_json(p.inter_node)},
                  {"tp_exposed", by_tp_json(p.tp_exposed)},
                  {"dp_exposed", p.dp_exposed}};
  if (!p.tp_exposed_no_sp.empty()) j["tp_exposed_no_sp"] = by_tp_json(p.tp_exposed_no_sp);
  if (!p.compute_in_step.points.empty()) j["compute_in_step"] = curve_json(p.compute_in_step);
  if (!p.host_layer_ms.empty()) j["host_layer_ms"] = by_tp_json(p.host_layer_ms);
  if (!p.host_layer_ms_no_sp.empty()) j["host_layer_ms_no_sp"] = by_tp_json(p.host_layer_ms_no_sp);
  if (!p.host_micro_ms.empty()) j["host_micro_ms"] = by_tp_json(p.host_micro_ms);
  return j.dump(2) + "\n";
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (const auto* e = kEmbeddedProfiles; e->name; ++e) names.emplace_back(e->name);
  return names;
}

DeviceProfile builtin_profile(const std::string& name) {
  std::string known;
  for (const auto* e = kEmbeddedProfiles; e->name; ++e) {
    if (name == e->name) return parse_profile(e->json, cat("built-in profile ", name, " (profiles/", name, ".json)"));
    known += (known.empty() ? "" : ", ") + std::string(e->name);
  }
  fail("--gpu '", name, "' is not a known profile; built in: ", known, " (or --profile FILE from megaengine plan --calibrate)");
}

DeviceProfile select_profile(const std::string& file, const std::string& gpu) {
  if (!file.empty()) return load_profile_file(file);
  if (!gpu.empty()) return builtin_profile(gpu);
  const char* env = std::getenv("ME_PLAN_GPU");
  return builtin_profile(env && *env ? env : "h100-80gb");
}

}  // namespace me::plan
