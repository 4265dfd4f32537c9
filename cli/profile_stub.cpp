// `remat profile` in the remat executable: listed in the help; in a build with LibTorch,
// main() hands the command to remat-torch before parsing, otherwise it says why it cannot run.
#include "cli.h"

namespace remat::cli {

Action add_profile_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "profile", "Measure a built-in model on a sample batch into a chain file (remat-chain/1)");
  cmd->allow_extras();
  return []() -> int {
    throw std::invalid_argument(
        "profile: this remat was built without LibTorch (configure with -DREMAT_WITH_TORCH=ON)");
  };
}

Action add_demo_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "demo", "Profile a built-in network, choose a schedule at half its memory and train with it");
  cmd->allow_extras();
  return []() -> int {
    throw std::invalid_argument(
        "demo: this remat was built without LibTorch (configure with -DREMAT_WITH_TORCH=ON)");
  };
}

}  // namespace remat::cli
