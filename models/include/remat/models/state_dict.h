#pragma once
// Reading the state dicts that Python's torch.save writes (torchvision's pretrained weights,
// training checkpoints) without Python. LibTorch's own torch::pickle_load cannot: its unpickler
// turns collections.OrderedDict into None.

#include <torch/types.h>

#include <string>
#include <vector>

#include "remat/core/error.h"

namespace remat::models {

/// One entry of a state dict: its name as written in the file and its tensor (CPU, contiguous or
/// with the file's strides, owning its memory). Tensors that were views of one storage when saved
/// (a tensor and a slice of it) share their storage again. `requires_grad` is not restored: the
/// tensors are data to copy into a module's parameters and buffers.
struct StateDictEntry {
  std::string name;
  torch::Tensor tensor;
};

/// Thrown for a file that cannot be read as a state dict; what() names the file and what was
/// wrong, e.g. "x.pth: data.pkl: unsupported pickle opcode 0x8f at byte 1234".
class StateDictError : public InputError {
 public:
  using InputError::InputError;
};

/// Reads a state dict saved by Python's `torch.save(model.state_dict(), path)`, entries in file
/// order. Reads both the zip format (torch >= 1.6) and the legacy one
/// (`_use_new_zipfile_serialization=False`), little-endian files only. The top-level object must
/// be a dict (or OrderedDict) of str -> tensor, or a dict that holds one under "state_dict" or
/// "model" (a training checkpoint; its other entries are ignored). Tensors may be float32/64,
/// float16, bfloat16, complex64/128, int64/32/16/8, uint8 or bool. Throws StateDictError for
/// anything else, with the file and the offset, out of memory included.
///
/// Safe on untrusted files (docs/reliability.md): no code runs, nesting of any depth cannot
/// overflow the stack, and memory stays proportional to the file: the zip's declared sizes are
/// checked against the file before anything is allocated, and the pickle may build at most 16
/// values per byte it occupies (plus 65,536), 2^20 on its stack and 2^20 in its memo, with
/// dict keys of at most 4,096 bytes.
///
/// Example:
///   for (const auto& [name, tensor] : read_state_dict("resnet50-0676ba61.pth"))
///     std::cout << name << " " << tensor.sizes() << "\n";
std::vector<StateDictEntry> read_state_dict(const std::string& path);

}  // namespace remat::models
