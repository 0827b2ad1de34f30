// Prints a TensorBoard event file as "step<TAB>tag<TAB>value" lines (text summaries as
// "step<TAB>tag<TAB>text:<plugin>:<bytes>"), read by the independent reader of the unit tests
// (tests/unit/event_file_reader.h), which checks both CRCs of every record. Exit 1 naming the
// record on any damage. Used by tests/cli/metrics_run.sh.
#include <cstdio>
#include <exception>

#include "tests/unit/event_file_reader.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: event_dump EVENT_FILE\n");
    return 2;
  }
  try {
    for (const auto& record : evreader::read_records(argv[1])) {
      const auto e = evreader::decode_event(record);
      for (const auto& v : e.values) {
        if (v.has_simple_value)
          std::printf("%lld\t%s\t%.9g\n", static_cast<long long>(e.step), v.tag.c_str(), v.simple_value);
        else if (v.has_tensor)
          std::printf("%lld\t%s\ttext:%s:%zu\n", static_cast<long long>(e.step), v.tag.c_str(), v.plugin_name.c_str(),
                      v.strings.empty() ? size_t{0} : v.strings[0].size());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "event_dump: %s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
