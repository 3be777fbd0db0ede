// Every codegen test process writes its kernel cache into a fresh temporary folder, so
// runs never read (or pollute) ~/.cache/tcap.
#include "kernel_builder.h"
#include "support/logging.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace {

class CacheDirEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = tcap::test::make_temp_dir("tcap-codegen-test");
    ASSERT_FALSE(dir_.empty());
    ::setenv("TCAP_CACHE_DIR", dir_.c_str(), 1);
    tcap::reload_config_for_testing();
  }
  void TearDown() override { tcap::test::remove_tree(dir_); }

 private:
  std::string dir_;
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new CacheDirEnvironment);

}  // namespace
