// remat tradeoff: predicted makespan against budget, for optimal, revolve and periodic.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <utility>
#include <nlohmann/json.hpp>

#include "cli.h"

namespace remat::cli {
namespace {

struct TradeoffArgs {
  std::string chain_path;
  std::string from, to;
  int points = 25;
  std::int64_t slots = 0;
  std::string format = "text";
  std::string plot;
  int threads = 0;
  bool offload = false;
  std::string link;
  std::string host_memory;
};

std::string cell(const TradeoffPoint& p, double store_all_ms, const char* parameter_name) {
  if (!p.feasible) return fmt::format("{:>30}", "-");
  const double overhead = store_all_ms > 0 ? 100.0 * (p.makespan_ms / store_all_ms - 1.0) : 0.0;
  std::string text = fmt::format("{:.3f} {}", p.makespan_ms, format_signed_percent(overhead));
  if (parameter_name != nullptr) text += fmt::format(" ({} {})", p.parameter, parameter_name);
  return fmt::format("{:>30}", text);
}

nlohmann::json point_json(const TradeoffPoint& p, const char* parameter_name) {
  nlohmann::json out = {{"feasible", p.feasible}};
  if (p.feasible) {
    out["makespan_ms"] = p.makespan_ms;
    out["peak_bytes"] = p.peak_bytes;
    if (parameter_name != nullptr) out[parameter_name] = p.parameter;
  }
  return out;
}

}  // namespace

Action add_tradeoff_command(CLI::App& app) {
  auto args = std::make_shared<TradeoffArgs>();
  CLI::App* cmd = app.add_subcommand(
      "tradeoff", "Predicted time against memory budget, for optimal, revolve and periodic");
  cmd->add_option("--chain", args->chain_path, "Chain file (remat-chain/3, /2 or /1 JSON)")
      ->required();
  cmd->add_option("--from", args->from,
                  "Smallest budget (SIZE or % of store-all; default: optimal's least budget, or "
                  "revolve's and periodic's where --slots puts it above the store-all peak)");
  cmd->add_option("--to", args->to,
                  "Largest budget (default: the store-all peak, or optimal's least budget "
                  "where --slots puts it above)");
  cmd->add_option("--points", args->points, "Budgets in the table, evenly spaced")->capture_default_str();
  cmd->add_option("--slots", args->slots, "optimal: memory slots of the one table (default: automatic)");
  cmd->add_option("--format", args->format, "Output: text or json")->capture_default_str();
  cmd->add_option("--plot", args->plot, "Draw the curves into FILE.svg");
  cmd->add_option("--threads", args->threads, "Solver threads (default: all cores)");
  add_offload_options(*cmd, args->offload, args->link, args->host_memory,
                      "Also optimal with offload over the chain's link, at every budget (a column "
                      "and a curve of their own)");
  return [args]() -> int {
    const Format format = parse_format(args->format);
    check_plot_path(args->plot);
    REMAT_CHECK(args->points >= 2 && args->points <= 10000, "--points (", args->points,
                ") must be between 2 and 10000");
    REMAT_CHECK(args->slots >= 0, "--slots (", args->slots, ") must be a positive number of slots");
    check_solver_threads(args->threads);
    Chain chain = load_chain(args->chain_path);
    apply_link_options(chain, args->link, args->offload);
    TradeoffOptions options;
    options.points(args->points).slots(args->slots).threads(args->threads).offload(args->offload);
    options.host_memory_bytes(host_memory_option(args->host_memory, args->offload));
    for (const auto& [option, text] : {std::pair{"--from", &args->from}, std::pair{"--to", &args->to}})
      REMAT_CHECK(!budget_needs_least(*text), option, " ", *text,
                  ": the table's budgets are sizes or percentages; it starts at the least budget "
                  "when --from is left out");
    if (!args->from.empty())
      options.from_bytes(
          std::max<std::int64_t>(1, parse_budget(args->from, store_all_peak(chain))));
    if (!args->to.empty())
      options.to_bytes(std::max<std::int64_t>(1, parse_budget(args->to, store_all_peak(chain))));
    const Tradeoff t = tradeoff(chain, options);
    if (format == Format::kJson) {
      nlohmann::json out;
      out["chain"] = chain.name;
      out["stages"] = chain.length();
      out["store_all_peak_bytes"] = t.store_all_peak_bytes;
      out["store_all_makespan_ms"] = t.store_all_makespan_ms;
      out["min_feasible_budget_bytes"] = t.min_feasible_budget_bytes >= 0
                                             ? nlohmann::json(t.min_feasible_budget_bytes)
                                             : nlohmann::json();
      out["unit_bytes"] = t.unit_bytes;
      out["points"] = nlohmann::json::array();
      for (std::size_t k = 0; k < t.budgets.size(); ++k) {
        nlohmann::json point = {{"budget_bytes", t.budgets[k]},
                                {"optimal", point_json(t.optimal[k], nullptr)},
                                {"revolve", point_json(t.revolve[k], "checkpoints")},
                                {"periodic", point_json(t.periodic_best[k], "segments")}};
        if (!t.offloading.empty()) point["offloading"] = point_json(t.offloading[k], "offloads");
        out["points"].push_back(std::move(point));
      }
      out["periodic_segments"] = nlohmann::json::array();
      for (const TradeoffPoint& p : t.periodic)
        out["periodic_segments"].push_back(
            {{"segments", p.parameter}, {"peak_bytes", p.peak_bytes}, {"makespan_ms", p.makespan_ms}});
      fmt::print("{}\n", out.dump(2));
    } else {
      fmt::print("chain        {} ({})\n", chain.name.empty() ? "-" : printable(chain.name),
                 counted(chain.length(), "stage"));
      fmt::print("store-all    peak {}, {:.3f} ms\n", format_bytes_exact(t.store_all_peak_bytes),
                 t.store_all_makespan_ms);
      if (t.min_feasible_budget_bytes >= 0) {
        fmt::print("min budget   {} for optimal{}\n",
                   format_bytes_exact(t.min_feasible_budget_bytes),
                   t.min_feasible_budget_bytes > t.store_all_peak_bytes
                       ? fmt::format(" with {} slots, more than store-all's peak", args->slots)
                       : "");
      } else {
        const std::int64_t needed = min_feasible_slots(chain, SolveOptions(0));
        fmt::print("min budget   none for optimal with {} slots{}\n", args->slots,
                   needed > args->slots ? fmt::format(" (it needs at least {})", needed) : "");
      }
      fmt::print("optimal      from one table, unit {}\n\n",
                 t.unit_bytes == 1 ? std::string("1 byte (exact)") : format_bytes(t.unit_bytes));
      if (!t.offloading.empty())
        fmt::print("offload      over a link of {} GB/s out, {} GB/s back, {} ms latency: a solve "
                   "at each budget\n\n",
                   chain.link->d2h_gbps, chain.link->h2d_gbps, chain.link->latency_ms);
      const bool offload = !t.offloading.empty();
      fmt::print("{:>12} {:>30} {}{:>30} {:>30}\n", "budget", "optimal ms",
                 offload ? fmt::format("{:>30} ", "with offload ms") : "", "revolve ms",
                 "periodic ms");
      for (std::size_t k = 0; k < t.budgets.size(); ++k)
        fmt::print("{:>12} {} {}{} {}\n", format_bytes(t.budgets[k]),
                   cell(t.optimal[k], t.store_all_makespan_ms, nullptr),
                   offload ? cell(t.offloading[k], t.store_all_makespan_ms, "off") + " " : "",
                   cell(t.revolve[k], t.store_all_makespan_ms, "ckpt"),
                   cell(t.periodic_best[k], t.store_all_makespan_ms, "seg"));
    }
    if (!t.warning.empty()) {
      std::fflush(stdout);  // keep stdout and stderr in order when both go to one place
      fmt::print(stderr, "remat: warning: {}\n", printable(t.warning));
    }
    if (!args->plot.empty()) {
      write_text_file(args->plot, tradeoff_svg(chain, t));
      if (format == Format::kText) fmt::print("\nplot         {}\n", printable(args->plot));
    }
    return kExitOk;
  };
}

}  // namespace remat::cli
