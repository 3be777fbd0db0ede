// Captures one op through the installed tcap package and prints the graph.
#include <tcap/tcap.h>

#include <torch/torch.h>

#include <iostream>

int main() {
  auto x = torch::randn({2, 3});
  tcap::CaptureGuard capture;
  capture.input(x, "x");
  auto y = x.relu();
  capture.output(y, "y");
  capture.stop();
  const auto g = capture.graph();
  std::cout << g;
  return g.num_calls() == 1 ? 0 : 1;
}
