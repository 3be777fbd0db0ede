// The nodes of a loaded PT2 program (export/load_program.cpp): each serialized node parsed
// once into the operator it calls and where its arguments come from, and run on an
// environment of named values.
#pragma once

#include "export/pt2_schema.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tcap::pt2 {

// Where an argument's value comes from when a node runs.
struct Source {
  enum Kind { Literal, Tensor, TensorList, OptTensorList, Sym, SymList } kind = Literal;
  c10::IValue literal;
  std::vector<std::string> names;  // Tensor / lists / Sym: names in the environment ("" for None)
  std::vector<c10::IValue> list_literals;  // SymList: literal ints where names[i] is ""
};

struct OpNode {
  std::string target;  // as written ("torch.ops.aten.addmm.default")
  enum Kind { Aten, SymSize, SymArith } kind = Aten;
  std::optional<c10::OperatorHandle> op;
  std::string arith;                  // SymArith: mul, add, sub, floordiv
  std::vector<std::optional<Source>> args;  // per schema argument; nullopt: its default
  // Per result: the name(s) bound ("" where unused); a list result binds several.
  std::vector<std::vector<std::string>> outputs;
  std::vector<bool> output_is_list;
};

using Env = std::unordered_map<std::string, c10::IValue>;

// Throws the error of a bad archive at `path`.
[[noreturn]] void bad(const std::string& path, const std::string& what);
// Serialized node n of the archive at `path`, parsed; throws on what is not supported.
OpNode parse_node(const std::string& path, const Json& n);
// The value named `name` in env; throws naming `target` when no earlier node made it.
const c10::IValue& lookup(const Env& env, const std::string& name, const std::string& target);
// Runs n on env's values and binds its results there.
void run_node(const OpNode& n, Env& env);

}  // namespace tcap::pt2
