// Graph JSON: malformed input and files get strict, one-line errors that name what is
// wrong, and corruptions never crash.
#include <gtest/gtest.h>
#include <tcap/graph_json.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ir/contiguous_meta.h"
#include "ir/json_sample_graphs.h"

namespace tcap::ir {
namespace {

using namespace tcap::ir::testing;

// --- malformed input -----------------------------------------------------------------


#define EXPECT_FORMAT_ERROR(text, substring)                                      \
  do {                                                                            \
    const std::string msg_ = error_of(text);                                      \
    EXPECT_NE(msg_.find(substring), std::string::npos)                            \
        << "expected an error containing: " << (substring) << "\n got: " << msg_; \
    EXPECT_EQ(msg_.rfind("tcap.graph: ", 0), 0u) << msg_;                         \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << "not one line: " << msg_;    \
  } while (0)

class GraphJsonMalformed : public ::testing::Test {
 protected:
  // Compact text of mlp_forward(): 3 inputs (values 0-2), t (value 3), addmm (value 4)...
  const std::string base = to_json_string(mlp_forward(), -1);
};

TEST_F(GraphJsonMalformed, BaseParses) { EXPECT_EQ(error_of(base), ""); }

TEST_F(GraphJsonMalformed, TruncatedJson) {
  EXPECT_FORMAT_ERROR(base.substr(0, base.size() / 2), "invalid JSON at byte");
  EXPECT_FORMAT_ERROR("", "invalid JSON at byte");
}

TEST_F(GraphJsonMalformed, NotAnObject) {
  EXPECT_FORMAT_ERROR("[1, 2]", "not a tcap graph (expected a JSON object, got array");
}

TEST_F(GraphJsonMalformed, WrongFormat) {
  EXPECT_FORMAT_ERROR(edit(base, "\"format\":\"tcap.graph\"", "\"format\":\"onnx\""),
                      "not a tcap graph (format is string \"onnx\")");
  EXPECT_FORMAT_ERROR(edit(base, "\"format\":\"tcap.graph\",", ""),
                      "not a tcap graph (no \"format\" field)");
}

TEST_F(GraphJsonMalformed, MissingVersion) {
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1,", ""), "tcap.graph: missing field \"version\"");
}

TEST_F(GraphJsonMalformed, UnsupportedVersion) {
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1", "\"version\":2"),
                      "tcap.graph: unsupported version 2 (this build reads version 1)");
  EXPECT_FORMAT_ERROR(edit(base, "\"version\":1", "\"version\":\"1\""),
                      "version: expected a 64-bit integer, got string \"1\"");
}

TEST_F(GraphJsonMalformed, FieldWithWrongType) {
  EXPECT_FORMAT_ERROR(edit(base, "\"shape\":[4,3]", "\"shape\":\"abc\""),
                      "tcap.graph: values[0].shape: expected an array, got string \"abc\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"requires_grad\":false", "\"requires_grad\":0"),
                      "values[0].requires_grad: expected true or false, got number 0");
  EXPECT_FORMAT_ERROR(edit(base, "\"storage_offset\":0", "\"storage_offset\":18446744073709551615"),
                      "values[0].storage_offset: expected a 64-bit integer");
  EXPECT_FORMAT_ERROR(edit(base, "\"storage_offset\":0", "\"storage_offset\":1.5"),
                      "values[0].storage_offset: expected a 64-bit integer, got number 1.5");
  EXPECT_FORMAT_ERROR(edit(base, "\"nodes\":[", "\"nodes\":{\"x\":0},\"old_nodes\":["),
                      "nodes: expected an array, got object");
  EXPECT_FORMAT_ERROR(edit(base, "\"torch_version\":\"2.11.0\"", "\"torch_version\":2"),
                      "meta.torch_version: expected a string, got number 2");
}

TEST_F(GraphJsonMalformed, DeepNestingDoesNotOverflowTheStack) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  // Padding keeps the document under the reader's structure limit (Note [Reader memory]).
  const std::string pad = "\"pad\":\"" + std::string(8 * deep.size(), 'x') + "\",";
  EXPECT_FORMAT_ERROR(edit(edit(base, "\"version\":1,", "\"version\":1," + pad), "\"shape\":[4,3]",
                           "\"shape\":" + deep),
                      "values[0].shape[0]: expected a 64-bit integer, got array of size 1");
  EXPECT_EQ(error_of(edit(base, "\"version\":1,", "\"version\":1," + pad + "\"future\":" + deep + ",")), "");
}

TEST_F(GraphJsonMalformed, MissingField) {
  EXPECT_FORMAT_ERROR(edit(base, "\"device\":\"cpu\",", ""), "values[0]: missing field \"device\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"op\":\"aten::t\",", ""), "nodes[3]: missing field \"op\"");
}

TEST_F(GraphJsonMalformed, UnknownEnumNames) {
  EXPECT_FORMAT_ERROR(edit(base, "\"kind\":\"call\"", "\"kind\":\"cal\""),
                      "nodes[3].kind: unknown node kind \"cal\" (expected one of: input, call, "
                      "call_hook, output)");
  EXPECT_FORMAT_ERROR(
      edit(base, "{\"kind\":\"value\",\"name\":\"self\"", "{\"kind\":\"foo\",\"name\":\"self\""),
      "nodes[3].args[0].kind: unknown arg kind \"foo\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"dtype\":\"float32\"", "\"dtype\":\"float33\""),
                      "values[0].dtype: unknown dtype \"float33\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"input_kind\":\"user_input\"", "\"input_kind\":\"user\""),
                      "nodes[0].input_kind: unknown input kind \"user\"");
  EXPECT_FORMAT_ERROR(edit(base, "\"device\":\"cpu\"", "\"device\":\"gpu:0\""),
                      "values[0].device: invalid device \"gpu:0\"");
}

TEST_F(GraphJsonMalformed, DanglingIds) {
  EXPECT_FORMAT_ERROR(edit(base, "{\"kind\":\"value\",\"name\":\"self\",\"value\":1}",
                           "{\"kind\":\"value\",\"name\":\"self\",\"value\":99}"),
                      "nodes[3].args[0].value: 99 is out of range (the graph has 7 values)");
  EXPECT_FORMAT_ERROR(edit(base, "\"producer\":0", "\"producer\":9"),
                      "values[0].producer: 9 is out of range (the graph has 8 nodes)");
  EXPECT_FORMAT_ERROR(edit(base, "\"view_of\":1", "\"view_of\":-5"),
                      "values[3].view_of: -5 is out of range");
}

TEST_F(GraphJsonMalformed, NonDenseIds) {
  EXPECT_FORMAT_ERROR(edit(base, "{\"id\":1,\"producer\":1", "{\"id\":7,\"producer\":1"),
                      "values[1]: id is 7, expected 1 (ids must be dense");
  EXPECT_FORMAT_ERROR(edit(base, "{\"id\":2,\"kind\":\"input\"", "{\"id\":3,\"kind\":\"input\""),
                      "nodes[2]: id is 3, expected 2");
}

TEST_F(GraphJsonMalformed, FailsVerify) {
  // addmm (node 4) reading relu_'s result (value 5, made by node 5): out of order.
  EXPECT_FORMAT_ERROR(edit(base, "{\"kind\":\"value\",\"name\":\"mat1\",\"value\":0}",
                           "{\"kind\":\"value\",\"name\":\"mat1\",\"value\":5}"),
                      "tcap.graph: graph fails verify(): ");
}

TEST(GraphJsonFiles, MissingFile) {
  try {
    load_json("/nonexistent/graph.json");
    FAIL() << "no error";
  } catch (const GraphFormatError& e) {
    EXPECT_STREQ(e.what(),
                 "tcap.graph: cannot open /nonexistent/graph.json: No such file or directory");
  }
}

TEST(GraphJsonFiles, ErrorsNameTheFile) {
  const std::string path = ::testing::TempDir() + "broken_graph.json";
  std::ofstream(path) << "{\"format\": \"tcap.graph\", \"version\": 7}";
  try {
    load_json(path);
    FAIL() << "no error";
  } catch (const GraphFormatError& e) {
    EXPECT_EQ(std::string(e.what()),
              "tcap.graph: " + path + ": unsupported version 7 (this build reads version 1)");
  }
}

TEST(GraphJsonFiles, SaveToUnwritablePathThrows) {
  EXPECT_THROW(save_json(Graph{}, "/nonexistent/dir/g.json"), std::runtime_error);
}

// Forward compatibility: readers ignore keys they do not know.
TEST_F(GraphJsonMalformed, IgnoresUnknownKeys) {
  std::string text = edit(base, "\"version\":1,", "\"version\":1,\"future\":{\"x\":[1]},");
  text = edit(text, "\"shape\":[4,3]", "\"shape\":[4,3],\"sparse_dim\":2");
  EXPECT_TRUE(from_json_string(text) == mlp_forward());
}

// Never crashes: every prefix and many one-byte corruptions give a GraphFormatError
// or (rarely) another valid graph, nothing else.
TEST_F(GraphJsonMalformed, CorruptionsNeverCrash) {
  for (size_t n = 0; n < base.size(); ++n) {
    EXPECT_THROW(from_json_string(base.substr(0, n)), GraphFormatError) << n;
  }
  for (size_t at = 0; at < base.size(); ++at) {
    for (char c : {'9', '-', '"', '}'}) {
      std::string text = base;
      text[at] = c;
      try {
        from_json_string(text);
      } catch (const GraphFormatError& e) {
        ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace tcap::ir
