// The profiles of profiles/*.json, embedded into the binary by CMake (generated/embedded_profiles.cpp)
// so that `megaengine plan` works on a machine without the source tree.
#pragma once

namespace me::plan {

struct EmbeddedProfile {
  const char* name;  // the file's stem: what --gpu names
  const char* json;
};
extern const EmbeddedProfile kEmbeddedProfiles[];  // ends with {nullptr, nullptr}

}  // namespace me::plan
