#pragma once
// remat train --tokens: training sequences from a file of token ids.

#include <torch/types.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

namespace remat::cli {

/// Training sequences from a file of token ids: little-endian uint16 values one after the other,
/// the format of nanoGPT's train.bin (GPT-2's 50,257 ids fit). Each batch takes windows at
/// random offsets (torch's generator: a seeded run repeats); every id read is checked against
/// the vocabulary. A file of up to 256 MiB is checked whole when opened, before profiling; a
/// larger one as it is read. Errors are std::invalid_argument naming the file (exit 2).
class TokenFile {
 public:
  TokenFile(std::string path, int sequence, int vocab);

  /// `batch` sequences, (batch, sequence) int64.
  torch::Tensor next(int batch);

 private:
  // Every id of `count` tokens read at token `first` is in the vocabulary.
  void check(const unsigned char* bytes, std::int64_t count, std::int64_t first) const;
  std::runtime_error read_error(std::int64_t count, std::int64_t at) const;

  std::string path_;
  int sequence_, vocab_;
  std::ifstream file_;
  std::int64_t tokens_ = 0;
};

}  // namespace remat::cli
