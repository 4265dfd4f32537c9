// The LibTorch commands in the remat executable: listed in the help; in a build with
// LibTorch, main() hands them to remat-torch before parsing, otherwise they say why they
// cannot run.
#include "cli.h"

namespace remat::cli {
namespace {

Action unavailable(CLI::App& app, const std::string& name, const std::string& description) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->allow_extras();
  return [name]() -> int {
    throw std::invalid_argument(
        name + ": this remat was built without LibTorch (configure with -DREMAT_WITH_TORCH=ON)");
  };
}

}  // namespace

Action add_profile_command(CLI::App& app) {
  return unavailable(app, "profile",
                     "Measure a built-in model on a sample batch into a chain file (remat-chain/1)");
}
Action add_demo_command(CLI::App& app) {
  return unavailable(
      app, "demo", "Profile a built-in network, choose a schedule at half its memory and train with it");
}
Action add_models_command(CLI::App& app) {
  return unavailable(app, "models",
                     "List the built-in models, or one model's stages with output shapes and bytes");
}
Action add_train_command(CLI::App& app) {
  return unavailable(app, "train",
                     "Train a built-in model on random data with a schedule for a memory budget");
}

}  // namespace remat::cli
