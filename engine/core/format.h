// Numbers in log lines as people read them: durations, rates and sizes rounded to what the
// reader can use ("0.10 s", "12.1 MB/s", "3.2 GiB"), never a raw double ("0.0995405 s").
// One place decides the rounding so every line agrees. Torch-free.
#pragma once
#include <cstdint>
#include <string>

namespace me::human {

// A value to three significant figures, without an exponent: 12.1056 -> "12.1", 0.0995 ->
// "0.0995", 1234.7 -> "1235" (large values keep all their integer digits), 0 -> "0".
std::string number(double value);

// A duration: "45.1 us", "4.20 ms", "0.10 s", "12.3 s", "152 s", "12 min 05 s", "3 h 07 min".
std::string seconds(double s);

// A rate with its unit: rate(12.1056, "MB/s") -> "12.1 MB/s", rate(48213.7, "tokens/s") -> "48214 tokens/s".
std::string rate(double value, const std::string& unit);

// A size in binary units: "512 B", "1.50 KiB", "24.0 MiB", "3.21 GiB".
std::string bytes(double n);

}  // namespace me::human
