#include "remat/solver/files.h"

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace remat {

void write_text_file(const std::string& path, const std::string& text, const std::string& what) {
  const std::string temporary = path + ".tmp-remat";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(path + ": cannot write " + what);
    out << text;
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw std::runtime_error(path + ": writing " + what + " failed");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw std::runtime_error(path + ": cannot replace " + what);
  }
}

}  // namespace remat
