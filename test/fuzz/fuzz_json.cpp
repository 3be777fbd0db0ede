// Fuzz target: the graph JSON reader. Every input is either a graph, which must then
// verify, print, and survive a round trip unchanged, or a GraphFormatError whose message
// is one printable line of at most 512 bytes. Anything else is a failure.
#include "fuzz/fuzz.h"

#include <tcap/graph.h>
#include <tcap/graph_json.h>

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <typeinfo>

namespace {

bool printable_line(const std::string& s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return s.size() <= 512;
}

void check_graph(const tcap::ir::Graph& g, const uint8_t* data, size_t size) {
  using namespace tcap::ir;
  verify(g);
  to_string(g);
  to_table(g);
  to_dot(g);
  const std::string text = to_json_string(g);
  if (!(from_json_string(text) == g)) tcap::fuzz::fail("the graph changed in a JSON round trip", data, size);
  if (to_json_string(from_json_string(to_json_string(g, -1))) != text) {
    tcap::fuzz::fail("the compact form reads back to another text", data, size);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tcap::fuzz::set_up_once();
  auto& c = tcap::fuzz::counters();
  ++c.inputs;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    tcap::ir::Graph g;
    try {
      g = tcap::ir::from_json_string(text);
    } catch (const tcap::ir::GraphFormatError& e) {
      ++c.rejected;
      if (!printable_line(e.what())) tcap::fuzz::fail(std::string("unprintable message: ") + e.what(), data, size);
      return 0;
    }
    ++c.loaded;
    check_graph(g, data, size);
  } catch (const c10::Error& e) {
    tcap::fuzz::fail(std::string("c10::Error: ") + e.what_without_backtrace(), data, size);
  } catch (const std::exception& e) {
    tcap::fuzz::fail(std::string(typeid(e).name()) + ": " + e.what(), data, size);
  } catch (...) {
    tcap::fuzz::fail("an exception that is not a std::exception", data, size);
  }
  return 0;
}
