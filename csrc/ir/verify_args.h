// Internal to verify(), the interpreter and passes that add calls: a call's arguments and
// results against the schema of its operator. See Note [Arguments against the schema] in verify_args.cpp.
#pragma once

#include <tcap/graph.h>

#include <ATen/core/function_schema.h>

#include <string>

namespace tcap::ir {

// The schema this LibTorch registers for the node's operator, or nullptr when it has
// none (an operator of another LibTorch version, or of a library not loaded).
const c10::FunctionSchema* find_schema(const Node& n);

// The schema string of op.overload as the recorder writes it into Graph::schemas(), or ""
// when this LibTorch has no such operator. For passes that add calls to a graph.
std::string schema_string(const std::string& op, const std::string& overload);
// The same for an operator every supported LibTorch has (an internal error otherwise).
std::string known_schema_string(const std::string& op, const std::string& overload);

// Why argument `a` cannot be passed for schema argument `s`, or "" when it can.
std::string arg_mismatch(const Arg& a, const c10::Argument& s);

// Why the node's arguments and results do not fit `schema`, or "" when they do. A node
// recorded with another number of arguments (another LibTorch version) is not checked
// here: the interpreter refuses it by name.
std::string call_mismatch(const Graph& g, const Node& n, const c10::FunctionSchema& schema);

}  // namespace tcap::ir
