#pragma once
/// Byte sizes as people write them: `700MiB`, `2.5GiB`, `1e9`, `512kB`.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace remat {

/// Parses a size in bytes: a number (integer, decimal or exponent form) with an optional
/// unit: B, kB/KB (10^3), MB, GB, TB (powers of 10), KiB, MiB, GiB, TiB (powers of 2); k, K,
/// M, G, T alone are binary. Fractional bytes are rounded down. Throws std::invalid_argument
/// with the text and what was wrong. Example: `parse_size("2.5GiB") == 2684354560`.
std::int64_t parse_size(std::string_view text);

/// floor(fraction * whole) for a non-negative decimal written in `text` (`12.5`, `1e-3`),
/// computed exactly: `scale_decimal("12.5", 800) == 100`. Throws std::invalid_argument naming
/// `what` when the text is not a plain decimal number or the result exceeds int64.
std::int64_t scale_decimal(std::string_view text, std::int64_t whole, std::string_view what);

/// A budget as people give it (the CLI's --budget, the Python package's budget=): a size as
/// parse_size reads it, or a percentage of a store-all peak (`50%`), floor(percent / 100 *
/// store_all_peak_bytes) exactly; `min`, or either followed by `+`, as below. The CLI passes the chain's store-all peak for the solver's
/// commands and the runtime's (Checkpointable::store_all_peak(), its reserve included) for
/// those that train. Throws std::invalid_argument.
/// The budgets that say "as little memory as possible", `min` and a budget followed by `+`,
/// need the chain's least feasible budget: this one refuses them, saying so.
std::int64_t parse_budget(std::string_view text, std::int64_t store_all_peak_bytes);

/// parse_budget, with the budgets that depend on the least budget the solver finds a schedule
/// for, `least_feasible()`, called only for those:
/// - `min`: the least feasible budget;
/// - a budget followed by `+` (`50%+`, `700MiB+`): that budget, or the least if it is more.
/// When no budget is enough (least_feasible() is -1: too few slots), `min` is int64's largest,
/// whose solve then says why, and `50%+` is 50%. Throws std::invalid_argument.
std::int64_t parse_budget(std::string_view text, std::int64_t store_all_peak_bytes,
                          const std::function<std::int64_t()>& least_feasible);

/// Whether the budget `text` is `min` or ends with `+` (its bytes need the least feasible
/// budget). Says nothing of the rest of its syntax.
bool budget_needs_least(std::string_view text);

/// Throws std::invalid_argument when `text` is not a budget parse_budget reads: its syntax,
/// checked before the chain (and so the store-all peak and the least budget) is known.
void check_budget_syntax(std::string_view text);

/// Human-readable size with a binary unit and 2 decimals: `700.00 MiB`, `512 B`.
std::string format_bytes(std::int64_t bytes);

/// format_bytes with the exact count, for figures a reader may compare to the byte:
/// `4.82 MiB (5053184 bytes)`, `1 B (1 byte)`.
std::string format_bytes_exact(std::int64_t bytes);

}  // namespace remat
