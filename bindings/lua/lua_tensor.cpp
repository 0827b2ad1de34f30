// me.tensor: LibTorch tensors for poking at things from the REPL and from tests. Indices and
// dimensions are 1-based, as everywhere else in Lua (and in Torch7).
#include "bindings/lua/lua_tensor.h"

#include <chrono>
#include <sstream>

#include "bindings/lua/modules.h"
#include "engine/core/torch_compat.h"

namespace me::lua {

const char* const kTensorMeta = "me.Tensor";

void push_tensor(lua_State* L, torch::Tensor t) { push_object<torch::Tensor>(L, kTensorMeta, std::move(t)); }

torch::Tensor& check_tensor(lua_State* L, int arg) { return check_object<torch::Tensor>(L, arg, kTensorMeta, "tensor"); }

namespace {

struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
const DtypeName kDtypes[] = {{"float32", torch::kFloat},  {"float64", torch::kDouble}, {"bfloat16", torch::kBFloat16},
                             {"float16", torch::kHalf},   {"int64", torch::kLong},     {"int32", torch::kInt},
                             {"int16", torch::kShort},    {"int8", torch::kChar},      {"uint8", torch::kByte},
                             {"bool", torch::kBool}};

std::string dtype_name(torch::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  return c10::toString(t);
}

std::optional<torch::ScalarType> parse_dtype(const std::string& s) {
  for (const auto& d : kDtypes)
    if (s == d.name) return d.type;
  if (s == "float") return torch::kFloat;
  if (s == "double") return torch::kDouble;
  if (s == "long") return torch::kLong;
  return std::nullopt;
}

// The dtype called `name`, or an error listing the names (after `what`, which names the argument).
torch::ScalarType named_dtype(const std::string& name, const char* what) {
  if (const auto t = parse_dtype(name)) return *t;
  fail(what, "unknown dtype '", name, "' (float32, float64, bfloat16, float16, int64, int32, uint8, bool...)");
}

}  // namespace

torch::ScalarType check_dtype(lua_State* L, int arg, torch::ScalarType fallback) {
  return lua_isnoneornil(L, arg) ? fallback : named_dtype(check_string(L, arg), "");
}

namespace {

torch::Device parse_device(const std::string& s) {
  if (s == "cpu") return torch::kCPU;
  if (s == "cuda" || s.rfind("cuda:", 0) == 0) {
    ME_CHECK(compat::cuda_available(), "device '", s, "': this LibTorch build sees no CUDA GPU");
    return torch::Device(s);
  }
  fail("unknown device '", s, "': expected cpu, cuda or cuda:N");
}

// Sizes from either a table ({2, 3}) or integer arguments (2, 3) starting at `first`;
// an options table {dtype=, device=} may follow.
std::vector<int64_t> read_sizes(lua_State* L, int first, int* options_arg) {
  std::vector<int64_t> sizes;
  *options_arg = 0;
  if (lua_type(L, first) == LUA_TTABLE && lua_rawlen(L, first) > 0) {
    const auto n = static_cast<int>(lua_rawlen(L, first));
    for (int i = 1; i <= n; ++i) {
      lua_rawgeti(L, first, i);
      int ok = 0;
      const auto v = lua_tointegerx(L, -1, &ok);
      lua_pop(L, 1);
      if (!ok || v < 0) arg_error(L, first, "table of non-negative integer sizes");
      sizes.push_back(v);
    }
    if (lua_type(L, first + 1) == LUA_TTABLE) *options_arg = first + 1;
    return sizes;
  }
  int i = first;
  for (; lua_type(L, i) == LUA_TNUMBER; ++i) {
    const auto v = check_integer(L, i);
    if (v < 0) arg_error(L, i, "non-negative size");
    sizes.push_back(v);
  }
  if (lua_type(L, i) == LUA_TTABLE) *options_arg = i;
  else if (!lua_isnone(L, i)) arg_error(L, i, "size (integer) or table of sizes");
  if (sizes.empty()) arg_error(L, first, "table of sizes");
  return sizes;
}

torch::TensorOptions read_options(lua_State* L, int arg, torch::ScalarType default_dtype = torch::kFloat) {
  auto opts = torch::TensorOptions().dtype(default_dtype);
  if (arg == 0) return opts;
  const std::string dt = field_string(L, arg, "dtype", "options", std::string());
  if (!dt.empty()) opts = opts.dtype(named_dtype(dt, "options.dtype: "));
  const std::string dev = field_string(L, arg, "device", "options", std::string("cpu"));
  return opts.device(parse_device(dev));
}

template <torch::Tensor (*Make)(at::IntArrayRef, const torch::TensorOptions&)>
int make_sized(lua_State* L) {
  int options_arg = 0;
  auto sizes = read_sizes(L, 1, &options_arg);
  push_tensor(L, Make(sizes, read_options(L, options_arg)));
  return 1;
}

torch::Tensor make_randn(at::IntArrayRef s, const torch::TensorOptions& o) { return torch::randn(s, o); }
torch::Tensor make_zeros(at::IntArrayRef s, const torch::TensorOptions& o) { return torch::zeros(s, o); }
torch::Tensor make_ones(at::IntArrayRef s, const torch::TensorOptions& o) { return torch::ones(s, o); }
torch::Tensor make_rand(at::IntArrayRef s, const torch::TensorOptions& o) { return torch::rand(s, o); }

int t_arange(lua_State* L) {
  // arange(n) = 0..n-1; arange(a, b [, step]) = a..b-1, as in torch.
  const double a = check_number(L, 1);
  const auto b = opt_number(L, 2);
  const double step = opt_number(L, 3).value_or(1.0);
  const bool integral = lua_isinteger(L, 1) && (lua_isnoneornil(L, 2) || lua_isinteger(L, 2)) &&
                        (lua_isnoneornil(L, 3) || lua_isinteger(L, 3));
  auto opts = torch::TensorOptions().dtype(integral ? torch::kLong : torch::kFloat);
  push_tensor(L, b ? torch::arange(a, *b, step, opts) : torch::arange(a, opts));
  return 1;
}

// Nested Lua tables -> flat values + shape; ragged nesting is an error.
void flatten(lua_State* L, int idx, size_t depth, std::vector<int64_t>& shape, std::vector<double>& values, bool& all_int) {
  const auto n = static_cast<int64_t>(lua_rawlen(L, idx));
  if (shape.size() <= depth) shape.push_back(n);
  else if (shape[depth] != n) fail("tensor: ragged nested table (dimension ", depth + 1, " has sizes ", shape[depth], " and ", n, ")");
  for (int64_t i = 1; i <= n; ++i) {
    lua_rawgeti(L, idx, i);
    if (lua_type(L, -1) == LUA_TTABLE) {
      flatten(L, lua_gettop(L), depth + 1, shape, values, all_int);
    } else if (lua_type(L, -1) == LUA_TNUMBER) {
      if (shape.size() > depth + 1) fail("tensor: ragged nested table (a number where a table was expected)");
      all_int = all_int && lua_isinteger(L, -1);
      values.push_back(lua_tonumber(L, -1));
    } else if (lua_type(L, -1) == LUA_TBOOLEAN) {
      values.push_back(lua_toboolean(L, -1) ? 1.0 : 0.0);
    } else {
      fail("tensor: tables may hold only numbers or tables, found a ", luaL_typename(L, -1));
    }
    lua_pop(L, 1);
  }
}

int t_from(lua_State* L) {
  if (lua_type(L, 1) == LUA_TNUMBER) {  // a scalar
    push_tensor(L, torch::scalar_tensor(lua_tonumber(L, 1), lua_isinteger(L, 1) ? torch::kLong : torch::kFloat));
    return 1;
  }
  check_table(L, 1);
  std::vector<int64_t> shape;
  std::vector<double> values;
  bool all_int = true;
  flatten(L, 1, 0, shape, values, all_int);
  auto t = torch::tensor(values, torch::kDouble).reshape(shape);
  const int opt = lua_type(L, 2) == LUA_TTABLE ? 2 : 0;
  const auto o = read_options(L, opt, all_int ? torch::kLong : torch::kFloat);
  push_tensor(L, t.to(o.device(), o.dtype().toScalarType()));
  return 1;
}

int t_is_tensor(lua_State* L) {
  lua_pushboolean(L, test_object<torch::Tensor>(L, 1, kTensorMeta) != nullptr);
  return 1;
}

int manual_seed(lua_State* L) {
  torch::manual_seed(static_cast<uint64_t>(check_integer(L, 1)));
  return 0;
}

int cuda_available(lua_State* L) {
  lua_pushboolean(L, compat::cuda_available());
  return 1;
}

int cuda_synchronize(lua_State* L) {
  if (compat::cuda_available()) compat::cuda_synchronize();
  return 0;
}

int cuda_memory(lua_State* L) {  // {allocated =, peak =} bytes on the current GPU
  const auto m = compat::cuda_memory();
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, m.allocated);
  lua_setfield(L, -2, "allocated");
  lua_pushinteger(L, m.peak);
  lua_setfield(L, -2, "peak");
  return 1;
}

int cuda_reset_peak(lua_State* L) {
  compat::cuda_reset_peak_memory();
  return 0;
}

int clock_seconds(lua_State* L) {  // wall clock for timing (os.clock is CPU time)
  using namespace std::chrono;
  lua_pushnumber(L, duration<double>(steady_clock::now().time_since_epoch()).count());
  return 1;
}

int device_count(lua_State* L) {
  lua_pushinteger(L, compat::cuda_available() ? static_cast<lua_Integer>(torch::cuda::device_count()) : 0);
  return 1;
}

int device_name(lua_State* L) {  // me.cuda.device_name(index): 0-based, as CUDA's
  lua_pushstring(L, compat::cuda_device_name(static_cast<int>(luaL_optinteger(L, 1, 0))).c_str());
  return 1;
}

// ---- methods ----

// A tensor or a number as the operand of arithmetic.
torch::Tensor operand(lua_State* L, int arg, const torch::Tensor& like) {
  if (auto* t = test_object<torch::Tensor>(L, arg, kTensorMeta)) return *t;
  if (lua_type(L, arg) == LUA_TNUMBER)
    return lua_isinteger(L, arg) ? torch::scalar_tensor(static_cast<int64_t>(lua_tointeger(L, arg)), torch::TensorOptions().dtype(torch::kLong).device(like.device()))
                                 : torch::scalar_tensor(lua_tonumber(L, arg), torch::TensorOptions().device(like.device()));
  arg_error(L, arg, "tensor or number");
}

// Either side of a binary metamethod may be the number.
std::pair<torch::Tensor, torch::Tensor> operands(lua_State* L) {
  auto* a = test_object<torch::Tensor>(L, 1, kTensorMeta);
  auto* b = test_object<torch::Tensor>(L, 2, kTensorMeta);
  const torch::Tensor& like = a ? *a : *b;
  return {operand(L, 1, like), operand(L, 2, like)};
}

int m_add(lua_State* L) { auto [a, b] = operands(L); push_tensor(L, a + b); return 1; }
int m_sub(lua_State* L) { auto [a, b] = operands(L); push_tensor(L, a - b); return 1; }
int m_mul(lua_State* L) { auto [a, b] = operands(L); push_tensor(L, a * b); return 1; }
int m_div(lua_State* L) { auto [a, b] = operands(L); push_tensor(L, torch::true_divide(a, b)); return 1; }
int m_pow(lua_State* L) { auto [a, b] = operands(L); push_tensor(L, torch::pow(a, b)); return 1; }
int m_unm(lua_State* L) { push_tensor(L, -check_tensor(L, 1)); return 1; }
// Lua's == < <= must yield booleans: == is torch.equal (same shape and values), < and <=
// hold when they hold elementwise everywhere. :eq/:lt/... give the elementwise tensors.
int m_eq(lua_State* L) { auto [a, b] = operands(L); lua_pushboolean(L, a.sizes() == b.sizes() && torch::equal(a, b.to(a.dtype()))); return 1; }
int m_lt(lua_State* L) { auto [a, b] = operands(L); lua_pushboolean(L, torch::lt(a, b).all().item<bool>()); return 1; }
int m_le(lua_State* L) { auto [a, b] = operands(L); lua_pushboolean(L, torch::le(a, b).all().item<bool>()); return 1; }
int m_len(lua_State* L) { auto& t = check_tensor(L, 1); lua_pushinteger(L, t.dim() ? t.size(0) : 0); return 1; }

int m_tostring(lua_State* L) {
  std::ostringstream os;
  os << check_tensor(L, 1);
  lua_pushstring(L, os.str().c_str());
  return 1;
}

int64_t dim_arg(lua_State* L, int arg, const torch::Tensor& t) {
  const auto d = check_integer(L, arg);
  const auto n = std::max<int64_t>(t.dim(), 1);
  ME_CHECK(d >= 1 && d <= n, "dimension ", d, " out of range: the tensor has ", t.dim(), " dimension(s) (1-based)");
  return d - 1;
}

int m_index(lua_State* L) {
  auto& t = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER) {  // t[i]: the i-th slice along dimension 1
    const auto i = check_integer(L, 2);
    ME_CHECK(t.dim() > 0, "cannot index a 0-dimensional tensor; use :item()");
    ME_CHECK(i >= 1 && i <= t.size(0), "index ", i, " out of range for dimension 1 of size ", t.size(0), " (1-based)");
    push_tensor(L, t.select(0, i - 1));
    return 1;
  }
  luaL_getmetatable(L, kTensorMeta);
  lua_getfield(L, -1, "methods");
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

int t_shape(lua_State* L) {
  auto& t = check_tensor(L, 1);
  lua_createtable(L, static_cast<int>(t.dim()), 0);
  for (int64_t i = 0; i < t.dim(); ++i) {
    lua_pushinteger(L, t.size(i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

int t_size(lua_State* L) {
  auto& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) return t_shape(L);
  lua_pushinteger(L, t.size(dim_arg(L, 2, t)));
  return 1;
}

int t_dim(lua_State* L) { lua_pushinteger(L, check_tensor(L, 1).dim()); return 1; }
int t_numel(lua_State* L) { lua_pushinteger(L, check_tensor(L, 1).numel()); return 1; }
int t_dtype(lua_State* L) { lua_pushstring(L, dtype_name(check_tensor(L, 1).scalar_type()).c_str()); return 1; }
int t_device(lua_State* L) { lua_pushstring(L, check_tensor(L, 1).device().str().c_str()); return 1; }

int t_to(lua_State* L) {  // :to("cuda") / :to("float64") / :to{device=, dtype=}
  auto& t = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TTABLE) {
    auto o = read_options(L, 2, t.scalar_type());
    push_tensor(L, t.to(o.device(), o.dtype().toScalarType()));
    return 1;
  }
  const auto s = check_string(L, 2);
  if (auto dt = parse_dtype(s)) push_tensor(L, t.to(*dt));
  else push_tensor(L, t.to(parse_device(s)));
  return 1;
}

int t_item(lua_State* L) {
  auto& t = check_tensor(L, 1);
  ME_CHECK(t.numel() == 1, ":item() needs a tensor with one element, this one has ", t.numel());
  if (t.is_floating_point()) lua_pushnumber(L, t.item<double>());
  else if (t.scalar_type() == torch::kBool) lua_pushboolean(L, t.item<bool>());
  else lua_pushinteger(L, t.item<int64_t>());
  return 1;
}

int t_matmul(lua_State* L) { push_tensor(L, torch::matmul(check_tensor(L, 1), check_tensor(L, 2))); return 1; }

// sum/mean/max/min with an optional (1-based) dimension.
template <int Kind>
int t_reduce(lua_State* L) {
  auto& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    auto x = Kind == 1 && !t.is_floating_point() ? t.to(torch::kFloat) : t;
    push_tensor(L, Kind == 0 ? x.sum() : Kind == 1 ? x.mean() : Kind == 2 ? x.max() : x.min());
    return 1;
  }
  const auto d = dim_arg(L, 2, t);
  if (Kind == 0) { push_tensor(L, t.sum(d)); return 1; }
  if (Kind == 1) { push_tensor(L, t.mean(d)); return 1; }
  auto [values, indices] = Kind == 2 ? t.max(d) : t.min(d);
  push_tensor(L, values);
  push_tensor(L, indices + 1);  // 1-based, like every index on the Lua side
  return 2;
}

int t_narrow(lua_State* L) {  // :narrow(dim, start, length), 1-based start
  auto& t = check_tensor(L, 1);
  const auto d = dim_arg(L, 2, t);
  const auto start = check_integer(L, 3), len = check_integer(L, 4);
  ME_CHECK(start >= 1 && len >= 0 && start - 1 + len <= t.size(d), "narrow: start ", start, " and length ", len,
           " do not fit dimension ", d + 1, " of size ", t.size(d));
  push_tensor(L, t.narrow(d, start - 1, len));
  return 1;
}

int t_select(lua_State* L) {
  auto& t = check_tensor(L, 1);
  const auto d = dim_arg(L, 2, t);
  const auto i = check_integer(L, 3);
  ME_CHECK(i >= 1 && i <= t.size(d), "select: index ", i, " out of range for dimension ", d + 1, " of size ", t.size(d));
  push_tensor(L, t.select(d, i - 1));
  return 1;
}

int t_reshape(lua_State* L) {
  auto& t = check_tensor(L, 1);
  int opt = 0;
  auto sizes = std::vector<int64_t>();
  if (lua_type(L, 2) == LUA_TTABLE) {
    for (lua_Integer i = 1; i <= static_cast<lua_Integer>(lua_rawlen(L, 2)); ++i) {
      lua_rawgeti(L, 2, i);
      sizes.push_back(lua_tointeger(L, -1));
      lua_pop(L, 1);
    }
  } else {
    sizes = read_sizes(L, 2, &opt);
  }
  push_tensor(L, t.reshape(sizes));
  return 1;
}

int t_t(lua_State* L) { auto& t = check_tensor(L, 1); push_tensor(L, t.dim() < 2 ? t : t.transpose(-2, -1)); return 1; }
int t_clone(lua_State* L) { push_tensor(L, check_tensor(L, 1).clone()); return 1; }
int t_copy(lua_State* L) {  // t:copy_(src) -> t, src's values written in (converted to t's dtype and device)
  auto& t = check_tensor(L, 1);
  const auto& src = check_tensor(L, 2);
  ME_CHECK(src.numel() == t.numel(), "copy_: the source has ", src.numel(), " elements, the tensor ", t.numel());
  torch::NoGradGuard no_grad;
  (t.sizes() == src.sizes() ? t : t.view(src.sizes())).copy_(src);  // other shapes: t must be viewable as src
  lua_settop(L, 1);
  return 1;
}
int t_abs(lua_State* L) { push_tensor(L, check_tensor(L, 1).abs()); return 1; }
int t_exp(lua_State* L) { push_tensor(L, check_tensor(L, 1).exp()); return 1; }
int t_log(lua_State* L) { push_tensor(L, check_tensor(L, 1).log()); return 1; }
int t_sqrt(lua_State* L) { push_tensor(L, check_tensor(L, 1).sqrt()); return 1; }
int t_softmax(lua_State* L) { auto& t = check_tensor(L, 1); push_tensor(L, torch::softmax(t, dim_arg(L, 2, t))); return 1; }

template <int Op>
int t_compare(lua_State* L) {
  auto& a = check_tensor(L, 1);
  auto b = operand(L, 2, a);
  push_tensor(L, Op == 0 ? a.eq(b) : Op == 1 ? a.ne(b) : Op == 2 ? a.lt(b) : Op == 3 ? a.le(b) : Op == 4 ? a.gt(b) : a.ge(b));
  return 1;
}

int t_allclose(lua_State* L) {
  auto& a = check_tensor(L, 1);
  auto& b = check_tensor(L, 2);
  const double rtol = opt_number(L, 3).value_or(1e-5), atol = opt_number(L, 4).value_or(1e-8);
  lua_pushboolean(L, a.sizes() == b.sizes() && torch::allclose(a.to(torch::kDouble), b.to(torch::kDouble), rtol, atol));
  return 1;
}

void push_nested(lua_State* L, const torch::Tensor& t) {
  if (t.dim() == 0) {
    if (t.is_floating_point()) lua_pushnumber(L, t.item<double>());
    else lua_pushinteger(L, t.item<int64_t>());
    return;
  }
  lua_createtable(L, static_cast<int>(t.size(0)), 0);
  for (int64_t i = 0; i < t.size(0); ++i) {
    push_nested(L, t[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

// Autograd from Lua, enough to check gradients: t:requires_grad(true), loss:backward(), t:grad().
int t_requires_grad(lua_State* L) {
  auto& t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    lua_pushboolean(L, t.requires_grad());
    return 1;
  }
  t.requires_grad_(lua_toboolean(L, 2));
  lua_settop(L, 1);
  return 1;
}
int t_backward(lua_State* L) { check_tensor(L, 1).backward(); return 0; }
int t_grad(lua_State* L) {
  auto g = check_tensor(L, 1).grad();
  if (g.defined()) push_tensor(L, g); else lua_pushnil(L);
  return 1;
}
int t_detach(lua_State* L) { push_tensor(L, check_tensor(L, 1).detach()); return 1; }

int t_randint(lua_State* L) {  // randint(low, high, {sizes}): integers in [low, high)
  const auto lo = check_integer(L, 1), hi = check_integer(L, 2);
  ME_CHECK(hi > lo, "randint: high (", hi, ") must be greater than low (", lo, ")");
  int opt = 0;
  auto sizes = read_sizes(L, 3, &opt);
  push_tensor(L, torch::randint(lo, hi, sizes, read_options(L, opt, torch::kLong)));
  return 1;
}

int t_totable(lua_State* L) { push_nested(L, check_tensor(L, 1).to(torch::kCPU)); return 1; }

}  // namespace

void open_tensor(lua_State* L, int core) {
  static const luaL_Reg methods[] = {
      {"shape", wrapped<t_shape>}, {"size", wrapped<t_size>}, {"dim", wrapped<t_dim>}, {"numel", wrapped<t_numel>},
      {"dtype", wrapped<t_dtype>}, {"device", wrapped<t_device>}, {"to", wrapped<t_to>}, {"item", wrapped<t_item>},
      {"matmul", wrapped<t_matmul>}, {"sum", wrapped<t_reduce<0>>}, {"mean", wrapped<t_reduce<1>>},
      {"max", wrapped<t_reduce<2>>}, {"min", wrapped<t_reduce<3>>}, {"narrow", wrapped<t_narrow>},
      {"select", wrapped<t_select>}, {"reshape", wrapped<t_reshape>}, {"view", wrapped<t_reshape>},
      {"t", wrapped<t_t>}, {"clone", wrapped<t_clone>}, {"copy_", wrapped<t_copy>}, {"abs", wrapped<t_abs>}, {"exp", wrapped<t_exp>},
      {"log", wrapped<t_log>}, {"sqrt", wrapped<t_sqrt>}, {"softmax", wrapped<t_softmax>},
      {"eq", wrapped<t_compare<0>>}, {"ne", wrapped<t_compare<1>>}, {"lt", wrapped<t_compare<2>>},
      {"le", wrapped<t_compare<3>>}, {"gt", wrapped<t_compare<4>>}, {"ge", wrapped<t_compare<5>>},
      {"allclose", wrapped<t_allclose>}, {"totable", wrapped<t_totable>},
      {"requires_grad", wrapped<t_requires_grad>}, {"backward", wrapped<t_backward>}, {"grad", wrapped<t_grad>},
      {"detach", wrapped<t_detach>}, {nullptr, nullptr}};
  static const luaL_Reg metamethods[] = {
      {"__add", wrapped<m_add>}, {"__sub", wrapped<m_sub>}, {"__mul", wrapped<m_mul>}, {"__div", wrapped<m_div>},
      {"__pow", wrapped<m_pow>}, {"__unm", wrapped<m_unm>}, {"__eq", wrapped<m_eq>}, {"__lt", wrapped<m_lt>},
      {"__le", wrapped<m_le>}, {"__len", wrapped<m_len>}, {"__tostring", wrapped<m_tostring>},
      {"__index", wrapped<m_index>}, {nullptr, nullptr}};
  define_class<torch::Tensor>(L, kTensorMeta, nullptr, metamethods);
  // __index is a function (numbers index, names look up methods), so methods live apart.
  luaL_getmetatable(L, kTensorMeta);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "methods");
  lua_pop(L, 1);

  static const luaL_Reg ctors[] = {
      {"randn", wrapped<make_sized<make_randn>>}, {"rand", wrapped<make_sized<make_rand>>},
      {"zeros", wrapped<make_sized<make_zeros>>}, {"ones", wrapped<make_sized<make_ones>>},
      {"arange", wrapped<t_arange>}, {"from", wrapped<t_from>}, {"randint", wrapped<t_randint>}, {"is_tensor", wrapped<t_is_tensor>},
      {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, ctors, 0);
  lua_setfield(L, core, "tensor");
  static const luaL_Reg misc[] = {{"traceback", traceback_handler}, {"manual_seed", wrapped<manual_seed>}, {"cuda_available", wrapped<cuda_available>},
                                  {"cuda_device_count", wrapped<device_count>}, {"cuda_device_name", wrapped<device_name>},
                                  {"cuda_synchronize", wrapped<cuda_synchronize>}, {"clock", wrapped<clock_seconds>},
                                  {"cuda_memory", wrapped<cuda_memory>}, {"cuda_reset_peak_memory", wrapped<cuda_reset_peak>},
                                  {nullptr, nullptr}};
  lua_pushvalue(L, core);
  luaL_setfuncs(L, misc, 0);
  lua_pop(L, 1);
  lua_pushstring(L, TORCH_VERSION);
  lua_setfield(L, core, "torch_version");
}

}  // namespace me::lua
