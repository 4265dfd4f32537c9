// remat profile in a build without LibTorch: the command exists and says why it cannot run.
#include "cli.h"

namespace remat::cli {

Action add_profile_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("profile", "Measure a built-in model (needs LibTorch)");
  cmd->allow_extras();
  return []() -> int {
    throw std::invalid_argument(
        "profile: this remat was built without LibTorch (configure with -DREMAT_WITH_TORCH=ON)");
  };
}

}  // namespace remat::cli
