#pragma once
// Reading Hugging Face's safetensors files (model.safetensors) without Python: an 8-byte
// little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte
// range, then the tensors' bytes (https://github.com/huggingface/safetensors).

#include <string>
#include <vector>

#include "remat/models/state_dict.h"

namespace remat::models {

/// Reads a safetensors file (Hugging Face's model.safetensors), entries in the order of their
/// data in the file (tensors whose data starts at the same byte, which only empty ones can, in
/// header order). Each tensor is a new CPU tensor, contiguous, owning its memory, with the
/// declared shape and dtype: BOOL, U8, I8, I16, I32, I64, F16 (torch::kHalf), BF16
/// (torch::kBFloat16), F32 or F64. The "__metadata__" entry is checked and not returned.
///
/// Checks what the reference implementation (the Rust crate) checks, and refuses anything else
/// with a StateDictError whose what() starts with "<path>: " and says what was wrong and where,
/// e.g. "model.safetensors: tensor 'wte.weight': shape [50257, 768] of F32 is 154389504 bytes,
/// data_offsets [0, 1024] hold 1024". The header is at most 100,000,000 bytes of UTF-8 JSON: an
/// object whose "__metadata__", if any, maps strings to strings, every other key naming a tensor
/// {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} once. The tensors' byte ranges,
/// sorted, cover the data exactly to the end of the file, each the size its shape and dtype say.
/// A BOOL tensor's bytes are 0 or 1. Little-endian machines only.
///
/// Safe on untrusted files (docs/reliability.md): every size is checked against the file's
/// before anything is allocated, so memory stays proportional to the file; shapes whose product
/// overflows 64 bits and shapes of more than 64 dimensions are refused; JSON nested more than 64
/// deep is refused before it is parsed; allocation failures are a StateDictError too.
///
/// Example:
///   for (const auto& [name, tensor] : read_safetensors("model.safetensors"))
///     std::cout << name << " " << tensor.sizes() << " " << tensor.dtype() << "\n";
std::vector<StateDictEntry> read_safetensors(const std::string& path);

}  // namespace remat::models
