#include "token_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "remat/base/text.h"

namespace remat::cli {

TokenFile::TokenFile(std::string path, int sequence, int vocab)
    : path_(std::move(path)), sequence_(sequence), vocab_(vocab) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path_, error))
    throw std::invalid_argument(fmt::format(
        "--tokens {}: {}", printable(path_),
        std::filesystem::exists(path_, error) ? "not a regular file" : "no such file"));
  file_.open(path_, std::ios::binary);
  if (!file_)
    throw std::invalid_argument(
        fmt::format("--tokens {}: cannot open it: {}", printable(path_), std::strerror(errno)));
  const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(path_));
  if (bytes % 2 != 0)
    throw std::invalid_argument(fmt::format(
        "--tokens {}: {} bytes is not a whole number of tokens (expected little-endian uint16 "
        "ids, 2 bytes each, as nanoGPT's train.bin)",
        printable(path_), bytes));
  tokens_ = bytes / 2;
  if (tokens_ < sequence_)
    throw std::invalid_argument(fmt::format("--tokens {}: {} tokens, fewer than one sequence of {}",
                                            printable(path_), tokens_, sequence_));
  if (bytes <= (std::int64_t{256} << 20)) {
    std::vector<unsigned char> chunk(std::size_t{1} << 20);
    for (std::int64_t at = 0; at < bytes;) {
      const std::int64_t n =
          std::min<std::int64_t>(static_cast<std::int64_t>(chunk.size()), bytes - at);
      file_.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n));
      if (!file_) throw read_error(n, at);
      check(chunk.data(), n / 2, at / 2);
      at += n;
    }
  }
}

torch::Tensor TokenFile::next(int batch) {
  torch::Tensor ids = torch::empty({batch, sequence_}, torch::kLong);
  std::vector<unsigned char> bytes(2 * static_cast<std::size_t>(sequence_));
  for (int b = 0; b < batch; ++b) {
    const std::int64_t offset = torch::randint(tokens_ - sequence_ + 1, {1}).item<std::int64_t>();
    file_.seekg(2 * offset);
    file_.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!file_) throw read_error(static_cast<std::int64_t>(bytes.size()), 2 * offset);
    check(bytes.data(), sequence_, offset);
    std::int64_t* row = ids.data_ptr<std::int64_t>() + static_cast<std::int64_t>(b) * sequence_;
    for (int t = 0; t < sequence_; ++t) row[t] = bytes[2 * t] | (bytes[2 * t + 1] << 8);
  }
  return ids;
}

void TokenFile::check(const unsigned char* bytes, std::int64_t count, std::int64_t first) const {
  for (std::int64_t t = 0; t < count; ++t) {
    const int id = bytes[2 * t] | (bytes[2 * t + 1] << 8);
    if (id >= vocab_)
      throw std::invalid_argument(
          fmt::format("--tokens {}: token {} at byte {} is not below the vocabulary's size {}",
                      printable(path_), id, 2 * (first + t), vocab_));
  }
}

std::runtime_error TokenFile::read_error(std::int64_t count, std::int64_t at) const {
  return std::runtime_error(
      fmt::format("--tokens {}: cannot read {} bytes at byte {}", printable(path_), count, at));
}

}  // namespace remat::cli
