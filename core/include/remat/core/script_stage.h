#pragma once
// A TorchScript module as a stage: blocks scripted in Python (torch.jit.script(block).save(...))
// and trained under remat from C++.
//
//   auto block = std::make_shared<torch::jit::Module>(torch::jit::load("block.pt"));
//   stages.push_back({"block3", remat::script_stage(block)});
//
// Its forward is called with the input members and then, when `takes_context`, the context
// tensors; it returns a tensor, or a tuple or list of tensors. Its parameters,
// buffers and training modes are the module's (shared: the module object is held, not copied).

#include <torch/csrc/jit/api/module.h>

#include <memory>

#include "remat/core/stage.h"

namespace remat {

std::shared_ptr<StageModule> script_stage(std::shared_ptr<torch::jit::Module> module,
                                          bool takes_context = false);

}  // namespace remat
