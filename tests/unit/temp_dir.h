// A fresh directory under /tmp for a test's files, removed with everything in it at scope exit.
#pragma once
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <ftw.h>
#include <stdio.h>

#include <string>

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/me_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  // nftw, not std::filesystem::remove_all: pip's libtorch exports std::filesystem symbols of
  // another libstdc++ that take over this binary's calls, and their path layout differs (crash).
  ~TempDir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};
