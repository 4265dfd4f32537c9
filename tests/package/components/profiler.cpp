// remat::profiler alone: profiles a chain of callable stages into a chain of the solver's.
#include <remat/profiler.h>

#include <iostream>

int main() {
  std::vector<remat::NamedStage> stages;
  for (int i = 0; i < 4; ++i)
    stages.push_back({"tanh" + std::to_string(i),
                      remat::callable_stage([](const remat::Tensors& x, const remat::Tensors&) {
                        return remat::Tensors{torch::tanh(x[0])};
                      })});
  const remat::Profile p = remat::profile(stages, torch::randn({8, 256}).requires_grad_(true),
                                          remat::ProfileOptions().measure_time(false));
  std::cout << "profiler: " << p.chain.length() << " stages, input " << p.chain.input_bytes()
            << " bytes\n";
  return p.chain.length() == 4 && p.chain.input_bytes() == 8 * 256 * 4 ? 0 : 1;
}
