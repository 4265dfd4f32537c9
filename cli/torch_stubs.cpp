// The LibTorch commands in the remat executable: listed in the help; in a build with
// LibTorch, main() hands them to remat-torch before parsing, otherwise they say why they
// cannot run.
#include "cli.h"

namespace remat::cli {
namespace {

Action unavailable(CLI::App& app, const std::string& name) {
  add_torch_subcommand(app, name)->allow_extras();
  return [name]() -> int {
    throw std::invalid_argument(
        name + ": this remat was built without LibTorch (configure with -DREMAT_WITH_TORCH=ON)");
  };
}

}  // namespace

Action add_profile_command(CLI::App& app) { return unavailable(app, "profile"); }
Action add_demo_command(CLI::App& app) { return unavailable(app, "demo"); }
Action add_models_command(CLI::App& app) { return unavailable(app, "models"); }
Action add_train_command(CLI::App& app) { return unavailable(app, "train"); }

}  // namespace remat::cli
