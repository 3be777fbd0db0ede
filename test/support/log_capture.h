// LogCapture: collects the log lines of some TCAP_LOGS channels for one test (through
// TCAP_LOG_FILE in a temporary file).
#pragma once

#include "support/logging.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

namespace tcap::testing {

// Collects log lines of some channels for one test.
class LogCapture {
 public:
  explicit LogCapture(const char* channels) {
    path_ = ::testing::TempDir() + "/tcap_log_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + ".txt";
    std::remove(path_.c_str());
    setenv("TCAP_LOGS", channels, 1);
    setenv("TCAP_LOG_FILE", path_.c_str(), 1);
    tcap::reload_config_for_testing();
  }
  ~LogCapture() {
    unsetenv("TCAP_LOGS");
    unsetenv("TCAP_LOG_FILE");
    tcap::reload_config_for_testing();
    std::remove(path_.c_str());
  }
  std::string text() const {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  int count(const std::string& needle) const {
    const std::string t = text();
    int n = 0;
    for (size_t p = t.find(needle); p != std::string::npos; p = t.find(needle, p + 1)) ++n;
    return n;
  }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string path_;
};

}  // namespace tcap::testing
