// The graph JSON reader on hostile input: numbers that overflow, hook slots, messages
// that quote raw input, size and structure limits, special files (docs/graph-json.md,
// "Limits" and "Errors"). Each case here was found by feeding the reader bad files.
#include <gtest/gtest.h>
#include <tcap/graph_json.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include "ir/contiguous_meta.h"

namespace tcap::ir {
namespace {

using tcap::ir::testing::contiguous_meta;
using tcap::ir::testing::edit;
using tcap::ir::testing::error_of;
using tcap::ir::testing::meta;

// relu(x), with one hook called by slot (as compiled autograd records it).
Graph small_graph(int slot = 0) {
  Graph g;
  g.schemas()["aten::relu"] = "aten::relu(Tensor self) -> Tensor";
  g.meta()["torch_version"] = "2.11.0";
  g.add_hook(HookKind::TensorPreHook, "ReluBackward0", slot);
  const ValueId x = g.add_input(InputKind::UserInput, "x", meta({2, 3}));
  Node n;
  n.kind = NodeKind::Call;
  n.op = "aten::relu";
  n.args = {Arg::value(x, "self")};
  const ValueId y = g.new_value(1, 0, -1, meta({2, 3}));
  n.outputs = {Arg::value(y)};
  g.add_node(n);
  g.set_outputs({y}, {"y"}, {OutputKind::User});
  return g;
}

bool has_control_characters(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

const std::string kBase = to_json_string(small_graph(), -1);

// A number that overflows a double made nlohmann's out_of_range escape the reader.
TEST(GraphJsonInput, NumberOverflowingADoubleIsAFormatError) {
  EXPECT_NE(error_of(edit(kBase, "\"version\":1", "\"version\":1e999")).find("tcap.graph: invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of(edit(kBase, "\"version\":1,", "\"version\":1,\"future\":[-1e999],")).find("number overflow"),
            std::string::npos);
  EXPECT_NE(error_of(edit(kBase, "\"version\":1,", "\"version\":1,\"future\":{\"x\":1E+400},")), "");
}

// Slots below -1 loaded and were dropped on save; 2^32 loaded as 0.
TEST(GraphJsonInput, HookSlotsOutsideTheirRangeAreRefused) {
  ASSERT_NE(kBase.find("\"slot\":0"), std::string::npos);
  EXPECT_NE(error_of(edit(kBase, "\"slot\":0", "\"slot\":-2")).find("hooks[0].slot: -2 is out of range [-1, "),
            std::string::npos);
  EXPECT_NE(error_of(edit(kBase, "\"slot\":0", "\"slot\":4294967296")).find("hooks[0].slot: 4294967296 is out of range"),
            std::string::npos);
  for (int slot : {-1, 0, 5, 2147483647}) {
    const Graph g = small_graph(slot);
    EXPECT_TRUE(from_json_string(to_json_string(g)) == g) << slot;
  }
  Graph bad = small_graph(-2);  // verify() refuses it in memory too
  EXPECT_THROW(verify(bad), c10::Error);
}

// An escape sequence in a key reached the terminal through tcap-inspect's error.
TEST(GraphJsonInput, MessagesEscapeControlCharacters) {
  const std::string clear = "\x1b[2J\x1b[H";
  const std::string texts[] = {
      edit(kBase, "\"meta\":{", "\"meta\":{\"" + std::string("\\u001b[2J") + "\":5,"),
      edit(kBase, "\"schemas\":{", "\"schemas\":{\"a\\u0007b\\u009b\":[],"),
      edit(kBase, "\"meta\":{", "\"meta\":{\"x\":\"" + std::string("\\u001b[2J") + "\",\"y\":1,"),
      edit(kBase, "\"format\":\"tcap.graph\"", "\"format\":\"" + clear + "\""),  // raw bytes: invalid JSON
      edit(kBase, "\"kind\":\"call\"", "\"kind\":\"c\\u001ball\""),
      edit(kBase, "\"version\":1", "\"version\":1\x9b"),  // a C1 control byte, not UTF-8
  };
  for (const std::string& text : texts) {
    const std::string msg = error_of(text);
    ASSERT_FALSE(msg.empty()) << text;
    EXPECT_FALSE(has_control_characters(msg)) << msg;
    EXPECT_EQ(msg.find('\x9b'), std::string::npos) << msg;
    EXPECT_EQ(msg.find("\xc2\x9b"), std::string::npos) << msg;
  }
  EXPECT_NE(error_of(texts[0]).find("meta[\"\\u001b[2J\"]: expected a string"), std::string::npos)
      << error_of(texts[0]);
}

// Messages of up to 1.9 MB echoed keys and the parser's context.
TEST(GraphJsonInput, MessagesAreShort) {
  const std::string long_key(2'000'000, 'k');
  const std::string texts[] = {
      edit(kBase, "\"meta\":{", "\"meta\":{\"" + long_key + "\":5,"),
      edit(kBase, "\"version\":1", "\"version\":1" + std::string(1'000'000, '7') + "x"),
      edit(kBase, "\"version\":1", "\"version\":\"" + long_key + "\""),
      edit(kBase, "\"name\":\"x\"", "\"name\":\"" + long_key + "\\q\""),
  };
  for (const std::string& text : texts) {
    const std::string msg = error_of(text);
    ASSERT_FALSE(msg.empty());
    EXPECT_LE(msg.size(), 512u) << msg.substr(0, 200);
    EXPECT_EQ(msg.rfind("tcap.graph: ", 0), 0u) << msg.substr(0, 200);
  }
}

TEST(GraphJsonInput, InputLargerThanTheLimitIsRefused) {
  JsonReadOptions small;
  small.max_bytes = kBase.size() - 1;
  EXPECT_EQ(error_of(kBase, small),
            "tcap.graph: the input is " + std::to_string(kBase.size()) + " bytes, over the limit of " +
                std::to_string(kBase.size() - 1) + " (raise it with TCAP_MAX_GRAPH_MB or JsonReadOptions::max_bytes)");
  small.max_bytes = kBase.size();
  EXPECT_EQ(error_of(kBase, small), "");
  EXPECT_EQ(default_max_graph_bytes(), size_t{64} << 20);  // TCAP_MAX_GRAPH_MB is not set in tests
}

// A 50 MB file of 17M empty values peaked at 2.8 GB before the reader refused it.
TEST(GraphJsonInput, FloodsOfEmptyValuesAreRefusedBeforeParsing) {
  std::string flood = "{\"format\":\"tcap.graph\",\"version\":1,\"values\":[";
  for (int k = 0; k < 3'000'000; ++k) flood += "{},";
  flood += "{}],\"nodes\":[]}";
  const auto start = std::chrono::steady_clock::now();
  const std::string msg = error_of(flood);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(msg.find("the input's structure would take about"), std::string::npos) << msg;
  EXPECT_LT(seconds, 1.0) << "refused only after parsing?";
  // A graph tcap writes is far from the line, indented or compact.
  Graph big;
  ValueId v = big.add_input(InputKind::UserInput, "x", meta({4, 4}));
  for (int k = 0; k < 2000; ++k) {
    Node n;
    n.kind = NodeKind::Call;
    n.op = "aten::neg";
    n.args = {Arg::value(v, "self")};
    const auto id = static_cast<NodeId>(big.nodes().size());
    v = big.new_value(id, 0, -1, meta({4, 4}));
    n.outputs = {Arg::value(v)};
    big.add_node(n);
  }
  EXPECT_EQ(error_of(to_json_string(big, -1)), "");
  EXPECT_EQ(error_of(to_json_string(big)), "");
}

class GraphJsonSpecialFiles : public ::testing::Test {
 protected:
  std::string dir_ = ::testing::TempDir() + "tcap_json_input_" + std::to_string(::getpid());
  void SetUp() override { ASSERT_EQ(::mkdir(dir_.c_str(), 0700), 0); }
  void TearDown() override {
    std::remove((dir_ + "/fifo").c_str());
    std::remove((dir_ + "/g.json").c_str());
    ::rmdir(dir_.c_str());
  }
  static std::string load_error(const std::string& path, const JsonReadOptions& options = {}) {
    try {
      load_json(path, options);
    } catch (const GraphFormatError& e) {
      return e.what();
    }
    return "";
  }
};

// tcap-inspect code /dev/zero grew until memory ran out; a FIFO blocked.
TEST_F(GraphJsonSpecialFiles, SpecialFilesAreRefusedBeforeReading) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(load_error(fifo), "tcap.graph: cannot read " + fifo + ": it is a FIFO, not a regular file");
  EXPECT_EQ(load_error("/dev/zero"), "tcap.graph: cannot read /dev/zero: it is a character device, not a regular file");
  EXPECT_EQ(load_error(dir_), "tcap.graph: cannot read " + dir_ + ": it is a directory, not a regular file");
}

TEST_F(GraphJsonSpecialFiles, FileLargerThanTheLimitIsRefused) {
  const std::string path = dir_ + "/g.json";
  save_json(small_graph(), path);
  JsonReadOptions small;
  small.max_bytes = 100;
  const std::string msg = load_error(path, small);
  EXPECT_EQ(msg.rfind("tcap.graph: cannot read " + path + ": it is ", 0), 0u) << msg;
  EXPECT_NE(msg.find("bytes, over the limit of 100 (raise it with TCAP_MAX_GRAPH_MB"), std::string::npos) << msg;
  EXPECT_EQ(load_error(path), "");
}

TEST_F(GraphJsonSpecialFiles, FileNamesInMessagesAreEscaped) {
  const std::string path = dir_ + "/g\x1b[2J.json";
  EXPECT_EQ(load_error(path), "tcap.graph: cannot open " + dir_ + "/g\\x1b[2J.json: No such file or directory");
}

}  // namespace
}  // namespace tcap::ir
