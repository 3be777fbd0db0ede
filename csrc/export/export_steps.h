// The steps of tcap::export_program (export_program.cpp) before the archive is written:
// the function recorded (record), its dynamic dims fitted (fit_dynamic_dims, in
// record_and_fit.cpp) and the graph lowered to the PT2 program's JSON (lower, in
// lower_program.cpp, Note [Export lowering]).
#pragma once

#include <tcap/export.h>
#include <tcap/graph.h>

#include "export/pt2_schema.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tcap::pt2 {


struct Recording {
  ir::Graph graph;
  std::vector<at::Tensor> tensors;  // bound to the graph's Input nodes, in order
};

// One run of fn under capture (eval mode and grad off already set by the caller), dead
// ops removed; a value handed to the host is refused (save equal(x, x)).
Recording record(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                 const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names);

// Note [Dynamic dims by linear fit]
// A size the user marks dynamic is found in the graph the way dynamo's automatic dynamic
// finds it: the function is recorded again with that size grown by one (an input made by
// appending its own first slice, so values stay valid indices and masks), and every integer
// of the graph that moved (a value's size, stride or offset, an integer argument) is taken
// as c + sum_j k_j * s_j, fitted from the records; a last record with every dynamic size
// grown by two checks the fit. Graphs whose ops differ between the records (a branch on a
// size) or an integer that is not linear in the sizes (s0*s1) are refused.
struct SymbolicInts {
  std::vector<std::string> symbols;  // s0, s1, ...
  std::vector<int64_t> base;         // each symbol's size in the example inputs
  // Keyed by slot ("v<id>.size<d>", "n<id>.a<i>.<j>"): coefficients per symbol, constant.
  struct Affine {
    std::vector<int64_t> k;
    int64_t c = 0;
  };
  std::map<std::string, Affine> slots;

  static std::string render(const Affine& a, const std::vector<std::string>& symbols) {
    std::ostringstream s;
    bool first = true;
    for (size_t j = 0; j < a.k.size(); ++j) {
      if (a.k[j] == 0) continue;
      if (!first) s << " + ";
      if (a.k[j] != 1) s << a.k[j] << "*";
      s << symbols[j];
      first = false;
    }
    if (a.c != 0 || first) {
      if (!first) s << (a.c < 0 ? " - " : " + ") << (a.c < 0 ? -a.c : a.c);
      else s << a.c;
    }
    return s.str();
  }
};

// Note [Dynamic dims by linear fit]: `dims` of `inputs` as symbols, fitted from records of
// fn at grown sizes against `base`; throws when the graph branches on a size or an integer
// is not linear in them.
SymbolicInts fit_dynamic_dims(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                              const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names,
                              const std::vector<DynamicDim>& dims, const Recording& base);

// A recorded graph lowered to the parts of a PT2 archive (Note [Export lowering]).
struct Lowered {
  Json graph;
  Json signature;
  Json range_constraints;
  Json weights_config;
  Json constants_config;
  std::vector<std::pair<std::string, std::string>> files;  // record -> bytes
  ExportReport report;
};

Lowered lower(const ir::Graph& g, const std::vector<at::Tensor>& tensors, const SymbolicInts& sym,
              const std::vector<DynamicDim>& dims, const std::shared_ptr<torch::nn::Module>& module);

}  // namespace tcap::pt2
