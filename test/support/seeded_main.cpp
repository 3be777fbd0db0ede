// The main() of every tcap test binary: GoogleTest's, plus a listener that seeds LibTorch's
// CPU generator before each test. LibTorch 2.11 seeds its default generator differently in
// every process, and CTest runs each test in a process of its own, so without this a test
// drawing random inputs sees different inputs on every run (and a tolerance problem shows
// up only sometimes). A test that seeds on its own still does so after this.
#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace {

class SeedEachTest : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override { at::manual_seed(0); }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);  // gtest owns it
  return RUN_ALL_TESTS();
}
