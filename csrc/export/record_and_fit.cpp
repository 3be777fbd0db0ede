// tcap::export_program's recording and its dynamic dims fitted (export_steps.h).
#include "export/export_steps.h"

#include <tcap/capture.h>
#include <tcap/partition.h>

#include "support/logging.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

namespace tcap::pt2 {
namespace {

using ir::ValueId;

// A value handed to the host decides what the C++ code does next; a program has no host
// code, so it cannot be exported. One read is harmless: equal(x, x) is true whatever x holds
// (NaN aside), so the branch it decides is the one every call takes (LibTorch's
// MultiheadAttention asks it of self-attention).
void check_host_reads(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    bool host = false;
    for (const ir::Arg& r : n.outputs) host = host || ir::is_host_value(r);
    if (!host) continue;
    if (n.qualified_op() == "aten::equal" && n.args.size() == 2 && n.args[0].is_value() && n.args[1].is_value() &&
        n.args[0].values[0] == n.args[1].values[0]) {
      TCAP_LOG(Export, "equal(" << ir::describe(g, n.args[0].values[0])
                                << ", itself) read on the host: true for every input, left out");
      continue;
    }
    TORCH_CHECK(false, "tcap export: ", n.qualified_op(), " hands a value to the host (item(), equal(), a bool "
                "of a tensor): the C++ code can branch on it and a program cannot; compute it with tensor ops");
  }
}

// Every integer of the graph that can depend on a size, by slot.
void collect_ints(const ir::Graph& g, std::map<std::string, int64_t>& out) {
  for (const ir::Value& v : g.values()) {
    const std::string p = "v" + std::to_string(v.id) + ".";
    for (size_t d = 0; d < v.meta.sizes.size(); ++d) out[p + "size" + std::to_string(d)] = v.meta.sizes[d];
    for (size_t d = 0; d < v.meta.strides.size(); ++d) out[p + "stride" + std::to_string(d)] = v.meta.strides[d];
    out[p + "offset"] = v.meta.storage_offset;
  }
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const ir::Arg& a = n.args[i];
      const std::string p = "n" + std::to_string(n.id) + ".a" + std::to_string(i) + ".";
      if (a.kind == ir::ArgKind::Int) out[p + "0"] = a.i;
      if (a.kind == ir::ArgKind::IntList) {
        for (size_t j = 0; j < a.ints.size(); ++j) out[p + std::to_string(j)] = a.ints[j];
      }
    }
  }
}

std::string structure_of(const ir::Graph& g) {
  std::ostringstream s;
  for (const ir::Node& n : g.nodes()) {
    s << static_cast<int>(n.kind) << n.qualified_op() << ":" << n.args.size() << ":" << n.outputs.size() << ";";
  }
  s << "|" << g.values().size();
  return s.str();
}

at::Tensor grown(const at::Tensor& t, int64_t dim, int64_t by) {
  std::vector<at::Tensor> parts{t};
  for (int64_t i = 0; i < by; ++i) parts.push_back(t.narrow(dim, i % t.size(dim), 1));
  return at::cat(parts, dim);
}

}  // namespace

// One run of fn under capture, eval mode and grad off already set by the caller.
Recording record(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                 const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names) {
  CaptureOptions co;
  co.record_backward = false;
  CaptureGuard capture(co);
  if (module) capture.register_module(*module);
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back(capture.input(inputs[i], names[i]));
  const std::vector<at::Tensor> outs = fn(in);
  TORCH_CHECK(!outs.empty(), "tcap export: the function returned no tensor");
  for (size_t k = 0; k < outs.size(); ++k) {
    TORCH_CHECK(outs[k].defined(), "tcap export: output ", k, " is an undefined tensor");
    capture.output(outs[k], "out" + std::to_string(k));
  }
  capture.stop();
  ir::Graph g = capture.graph();
  check_host_reads(g);
  // Ops whose results nothing reads (MultiheadAttention's averaged weights when the caller
  // drops them) are left out, as torch.export leaves them out.
  return {eliminate_dead_code(g), capture.input_tensors()};
}

SymbolicInts fit_dynamic_dims(const std::shared_ptr<torch::nn::Module>& module, const ExportFn& fn,
                              const std::vector<at::Tensor>& inputs, const std::vector<std::string>& names,
                              const std::vector<DynamicDim>& dims, const Recording& base) {
  SymbolicInts sym;
  std::map<std::string, int64_t> b;
  collect_ints(base.graph, b);
  const std::string shape = structure_of(base.graph);
  std::vector<std::map<std::string, int64_t>> moved;
  auto rerun = [&](const std::vector<int64_t>& growth, const char* why) {
    std::vector<at::Tensor> in = inputs;
    for (size_t j = 0; j < dims.size(); ++j) {
      if (growth[j] != 0) in[dims[j].input] = grown(in[dims[j].input], dims[j].dim, growth[j]);
    }
    Recording r = record(module, fn, in, names);
    TORCH_CHECK(structure_of(r.graph) == shape, "tcap export: the function records other ops when ", why,
                ": its code branches on that size; export it with that size static");
    std::map<std::string, int64_t> ints;
    collect_ints(r.graph, ints);
    TORCH_CHECK(ints.size() == b.size(), "tcap export: the graph's integers differ in number when ", why);
    return ints;
  };
  for (size_t j = 0; j < dims.size(); ++j) {
    const DynamicDim& d = dims[j];
    TORCH_CHECK(d.input < inputs.size(), "tcap export: dynamic dim ", j, " names input ", d.input, " of ",
                inputs.size());
    const at::Tensor& t = inputs[d.input];
    TORCH_CHECK(d.dim >= 0 && d.dim < t.dim(), "tcap export: dynamic dim ", j, " names dim ", d.dim, " of input ",
                d.input, ", which has ", t.dim());
    const int64_t n = t.size(d.dim);
    TORCH_CHECK(n >= 2 && n >= d.min && n <= d.max, "tcap export: input ", d.input, " has size ", n, " at dim ",
                d.dim, ", outside the dynamic range [", d.min, ", ", d.max, "] or below 2 (sizes 0 and 1 are "
                "special-cased by ATen, as torch.export's Dim does)");
    // Symbols are s0, s1, ... whatever the user calls the dim: AOTInductor's code generator
    // takes only names of that form for sizes (a symbol "batch" is left undeclared in its C++).
    sym.symbols.push_back("s" + std::to_string(j));
    sym.base.push_back(n);
    std::vector<int64_t> growth(dims.size(), 0);
    growth[j] = 1;
    moved.push_back(rerun(growth, ("input " + std::to_string(d.input) + "'s dim " + std::to_string(d.dim) +
                                   " grows").c_str()));
  }
  for (const auto& [slot, v0] : b) {
    SymbolicInts::Affine a;
    a.k.resize(dims.size());
    bool any = false;
    for (size_t j = 0; j < dims.size(); ++j) {
      a.k[j] = moved[j].at(slot) - v0;
      any = any || a.k[j] != 0;
    }
    if (!any) continue;
    a.c = v0;
    for (size_t j = 0; j < dims.size(); ++j) a.c -= a.k[j] * sym.base[j];
    sym.slots[slot] = a;
  }
  const auto check = rerun(std::vector<int64_t>(dims.size(), 2), "every dynamic size grows by two");
  for (const auto& [slot, v0] : b) {
    auto it = sym.slots.find(slot);
    int64_t predicted = v0;
    if (it != sym.slots.end()) {
      predicted = it->second.c;
      for (size_t j = 0; j < dims.size(); ++j) predicted += it->second.k[j] * (sym.base[j] + 2);
    }
    TORCH_CHECK(check.at(slot) == predicted, "tcap export: an integer of the graph (", slot,
                ") is not linear in the dynamic sizes (", predicted, " expected, ", check.at(slot),
                " seen): export with those sizes static");
  }
  return sym;
}

}  // namespace tcap::pt2
