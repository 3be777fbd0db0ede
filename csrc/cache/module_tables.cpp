#include "cache/module_tables.h"

namespace tcap::cache {

namespace {

using Table = torch::OrderedDict<std::string, at::Tensor>;
using TablePtr = Table torch::nn::Module::*;
using Children = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;
using ChildrenPtr = Children torch::nn::Module::*;

// A template argument of an explicit instantiation may name a member its scope cannot
// access ([temp.spec]/6); the friend function carries the member pointer out.
struct ParametersTag {
  friend TablePtr member(ParametersTag);
};
struct BuffersTag {
  friend TablePtr member(BuffersTag);
};
struct ChildrenTag {
  friend ChildrenPtr member(ChildrenTag);
};
template <typename Tag, auto M>
struct Expose {
  friend decltype(M) member(Tag) { return M; }
};
template struct Expose<ParametersTag, &torch::nn::Module::parameters_>;
template struct Expose<BuffersTag, &torch::nn::Module::buffers_>;
template struct Expose<ChildrenTag, &torch::nn::Module::children_>;

}  // namespace

const Table& own_tensor_table(const torch::nn::Module& m, bool buffers) {
  return m.*(buffers ? member(BuffersTag{}) : member(ParametersTag{}));
}

void append_own_tensors(const torch::nn::Module& m, bool buffers, std::vector<at::Tensor>& out) {
  const Table& table = own_tensor_table(m, buffers);
  for (const auto& item : table) {
    if (item.value().defined()) out.push_back(item.value());
  }
}

const Children& children_of(const torch::nn::Module& m) { return m.*member(ChildrenTag{}); }

}  // namespace tcap::cache
