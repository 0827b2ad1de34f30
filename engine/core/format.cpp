#include "engine/core/format.h"

#include <cmath>
#include <cstdio>

namespace me::human {
namespace {

std::string printf_double(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string number(double value) {
  if (!std::isfinite(value)) return printf_double("%g", value);
  const double a = std::fabs(value);
  if (a == 0) return "0";
  if (a >= 99.95) return printf_double("%.0f", value);
  if (a >= 9.995) return printf_double("%.1f", value);
  if (a >= 0.9995) return printf_double("%.2f", value);
  // Below 1: three significant figures, written out (0.000123, not 1.23e-04).
  // (a / 0.9995: a value that rounds up to the next power of ten gets that power's decimals.)
  const int decimals = 2 - static_cast<int>(std::floor(std::log10(a / 0.9995)));
  char format[16];
  std::snprintf(format, sizeof format, "%%.%df", decimals > 12 ? 12 : decimals);
  return printf_double(format, value);
}

std::string seconds(double s) {
  if (!std::isfinite(s)) return printf_double("%g s", s);
  const double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a < 1e-3) return number(s * 1e6) + " us";
  if (a < 0.01) return number(s * 1e3) + " ms";
  // Two decimals up to 10 s (0.10 s: the brief's example), then three figures up to 10 minutes.
  if (a < 9.995) return printf_double("%.2f s", s);
  if (a < 600.5) return number(s) + " s";  // up to 600 s, the default timeouts
  const char* sign = s < 0 ? "-" : "";
  char buf[64];
  if (const long long total = std::llround(a); total < 3600) {
    std::snprintf(buf, sizeof buf, "%s%lld min %02lld s", sign, total / 60, total % 60);
  } else {
    const long long minutes = std::llround(a / 60);
    std::snprintf(buf, sizeof buf, "%s%lld h %02lld min", sign, minutes / 60, minutes % 60);
  }
  return buf;
}

std::string rate(double value, const std::string& unit) { return number(value) + " " + unit; }

std::string bytes(double n) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = n;
  while (std::fabs(v) >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return printf_double("%.0f B", v);
  return printf_double(std::fabs(v) >= 99.95 ? "%.0f " : std::fabs(v) >= 9.995 ? "%.1f " : "%.2f ", v) + kUnits[u];
}

}  // namespace me::human
