// Files the tests read: assets fetched by scripts/fetch_assets.sh (in $ME_ASSET_DIR or
// <repo>/assets), and small helpers to read and write whole files.
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

inline std::string asset_dir() {
  if (const char* env = std::getenv("ME_ASSET_DIR"); env && *env) return env;
  // <repo>/tests/unit/this_file.h -> <repo>/assets
  return (std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "assets").string();
}

inline std::string asset(const std::string& name) {
  const std::string path = asset_dir() + "/" + name;
  if (!std::filesystem::exists(path)) FAIL("missing asset " << path << ": run scripts/fetch_assets.sh (or set ME_ASSET_DIR)");
  return path;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void spit(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  REQUIRE(out);
}
