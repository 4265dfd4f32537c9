#include "remat/solver/chain.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "json_fields.h"
#include "remat/base/check.h"
#include "remat/base/files.h"

namespace remat {
namespace {

using detail::str_cat;
using nlohmann::json;
using namespace detail::json_fields;

std::string stage_where(std::size_t index) { return str_cat("stages[", index, "]"); }

// Reads a list of member indices: an array of whole numbers.
std::vector<int> get_indices(const json& value, const std::string& source,
                             const std::string& where) {
  if (!value.is_array())
    fail(source, where, str_cat("must be an array of member indices, got ", type_name(value)));
  std::vector<int> out;
  for (std::size_t k = 0; k < value.size(); ++k) {
    const json& item = value[k];
    const std::string at = str_cat(where, "[", k, "]");
    if (!item.is_number_integer() || item.get<std::int64_t>() < 0 ||
        item.get<std::int64_t>() > 1000000)
      fail(source, at,
           str_cat("must be a member index (a whole number from 0), got ", item.dump()));
    out.push_back(static_cast<int>(item.get<std::int64_t>()));
  }
  return out;
}

// A member's optional "loss_gradient" (Member::loss_gradient; Chain::validate allows false on
// x_L's members only).
bool get_loss_gradient(const json& value, const std::string& source, const std::string& where) {
  if (!value.contains("loss_gradient")) return true;
  if (!value.at("loss_gradient").is_boolean())
    fail(source, where + ".loss_gradient",
         str_cat("must be true or false, got ", type_name(value.at("loss_gradient"))));
  return value.at("loss_gradient").get<bool>();
}

// A member: {"bytes": N, "grad": true} or, in a stage's outputs, {"carry": k}; either with
// "loss_gradient": false in the last stage's outputs.
Member get_member(const json& value, const std::string& source, const std::string& where,
                  bool may_carry) {
  if (!value.is_object())
    fail(source, where, str_cat("must be an object (a tensor), got ", type_name(value)));
  Member member;
  if (!may_carry && value.contains("carry"))
    fail(source, where + ".carry", "is not allowed: the input x_0 has no stage before it");
  if (may_carry && value.contains("carry")) {
    check_keys(value, source, where, {"carry"}, {"loss_gradient"}, "a carried tensor");
    member.loss_gradient = get_loss_gradient(value, source, where);
    const json& carry = value.at("carry");
    if (!carry.is_number_integer() || carry.get<std::int64_t>() < 0 ||
        carry.get<std::int64_t>() > 1000000)
      fail(source, where + ".carry",
           str_cat("must be the index of a member of the stage's input, got ", carry.dump()));
    member.carried_from = static_cast<int>(carry.get<std::int64_t>());
    return member;
  }
  check_keys(value, source, where, {"bytes"}, {"grad", "grad_bytes", "loss_gradient"}, "a tensor");
  member.loss_gradient = get_loss_gradient(value, source, where);
  member.bytes = get_bytes(value.at("bytes"), source, where + ".bytes");
  if (value.contains("grad")) {
    if (!value.at("grad").is_boolean())
      fail(source, where + ".grad",
           str_cat("must be true or false, got ", type_name(value.at("grad"))));
    member.grad = value.at("grad").get<bool>();
  }
  // Given without a gradient: refused by Chain::validate, which parse_chain ends with.
  if (value.contains("grad_bytes"))
    member.grad_bytes = get_bytes(value.at("grad_bytes"), source, where + ".grad_bytes");
  return member;
}

std::vector<Member> get_members(const json& value, const std::string& source,
                                const std::string& where, bool may_carry) {
  if (!value.is_array())
    fail(source, where, str_cat("must be an array of tensors, got ", type_name(value)));
  std::vector<Member> out;
  for (std::size_t k = 0; k < value.size(); ++k)
    out.push_back(get_member(value[k], source, str_cat(where, "[", k, "]"), may_carry));
  return out;
}

// The document's array of stages.
const json& stages_array(const json& doc, const std::string& source) {
  const json& stages = doc.at("stages");
  if (!stages.is_array())
    fail(source, "stages", str_cat("must be an array of stages, got ", type_name(stages)));
  return stages;
}

// Stage `where` of a document: an object with `required` fields and maybe `optional` ones.
const json& stage_object(const json& item, const std::string& source, const std::string& where,
                         const std::vector<std::string>& required,
                         const std::vector<std::string>& optional) {
  if (!item.is_object()) fail(source, where, str_cat("must be an object, got ", type_name(item)));
  check_keys(item, source, where, required, optional);
  return item;
}

// The fields both versions give every stage: its times and temporaries.
void read_times_and_temporaries(const json& item, const std::string& source,
                                const std::string& where, Stage& stage) {
  stage.fwd_ms = get_ms(item.at("fwd_ms"), source, where + ".fwd_ms");
  stage.bwd_ms = get_ms(item.at("bwd_ms"), source, where + ".bwd_ms");
  stage.fwd_tmp_bytes = get_bytes(item.at("fwd_tmp_bytes"), source, where + ".fwd_tmp_bytes");
  stage.bwd_tmp_bytes = get_bytes(item.at("bwd_tmp_bytes"), source, where + ".bwd_tmp_bytes");
  if (item.contains("fwd_nograd_ms"))
    stage.fwd_nograd_ms = get_ms(item.at("fwd_nograd_ms"), source, where + ".fwd_nograd_ms");
}

// The optional "output_held" of both formats.
void read_output_held(const json& doc, const std::string& source, Chain& chain) {
  if (!doc.contains("output_held")) return;
  if (!doc.at("output_held").is_boolean())
    fail(source, "output_held",
         str_cat("must be true or false, got ", type_name(doc.at("output_held"))));
  chain.output_held = doc.at("output_held").get<bool>();
}

Chain parse_v1(const json& doc, const std::string& source) {
  check_keys(doc, source, "", {"format", "name", "input_bytes", "stages"},
             {"loss_tmp_bytes", "output_held"});
  Chain chain;
  chain.name = get_string(doc.at("name"), source, "name");
  chain.set_input(get_bytes(doc.at("input_bytes"), source, "input_bytes"));
  if (doc.contains("loss_tmp_bytes"))
    chain.loss_tmp_bytes = get_bytes(doc.at("loss_tmp_bytes"), source, "loss_tmp_bytes");
  read_output_held(doc, source, chain);
  const json& stages = stages_array(doc, source);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::string where = stage_where(i);
    const json& item = stage_object(
        stages[i], source, where,
        {"name", "fwd_ms", "bwd_ms", "out_bytes", "saved_bytes", "fwd_tmp_bytes", "bwd_tmp_bytes"},
        {"fwd_nograd_ms"});
    const std::int64_t out = get_bytes(item.at("out_bytes"), source, where + ".out_bytes");
    const std::int64_t saved = get_bytes(item.at("saved_bytes"), source, where + ".saved_bytes");
    if (saved < out)
      fail(source, where + ".saved_bytes",
           str_cat("(", saved, ") is smaller than out_bytes (", out,
                   "): saved_bytes counts the output too"));
    Stage stage =
        Stage::keeping_all(get_string(item.at("name"), source, where + ".name"), out, saved);
    read_times_and_temporaries(item, source, where, stage);
    chain.stages.push_back(std::move(stage));
  }
  return chain;
}

// The "link" of a version 3 document: {"d2h_gbps": B, "h2d_gbps": B, "latency_ms": T}.
Link get_link(const json& value, const std::string& source) {
  if (!value.is_object())
    fail(source, "link", str_cat("must be an object (the device's link), got ", type_name(value)));
  check_keys(value, source, "link", {"d2h_gbps", "h2d_gbps", "latency_ms"}, {}, "a link");
  Link link;
  for (auto [field, out] : {std::pair{"d2h_gbps", &link.d2h_gbps},
                            std::pair{"h2d_gbps", &link.h2d_gbps}}) {
    const json& item = value.at(field);
    if (!item.is_number())
      fail(source, str_cat("link.", field),
           str_cat("must be a bandwidth in GB/s, got ", type_name(item)));
    *out = item.get<double>();
  }
  link.latency_ms = get_ms(value.at("latency_ms"), source, "link.latency_ms");
  return link;  // the bandwidths' range: Chain::validate
}

// Versions 2 and 3 (version 2 and a link).
Chain parse_v2(const json& doc, const std::string& source, bool v3) {
  std::vector<std::string> optional = {"loss_tmp_bytes", "output_held", "context_bytes",
                                       "restart_ms"};
  if (v3) optional.push_back("link");
  check_keys(doc, source, "", {"format", "name", "inputs", "stages"}, optional);
  Chain chain;
  if (v3 && doc.contains("link")) chain.link = get_link(doc.at("link"), source);
  chain.name = get_string(doc.at("name"), source, "name");
  chain.inputs = get_members(doc.at("inputs"), source, "inputs", false);
  if (chain.inputs.empty())
    fail(source, "inputs", "is empty: the input x_0 needs at least one tensor");
  if (doc.contains("restart_ms")) chain.restart_ms = get_ms(doc.at("restart_ms"), source, "restart_ms");
  if (doc.contains("loss_tmp_bytes"))
    chain.loss_tmp_bytes = get_bytes(doc.at("loss_tmp_bytes"), source, "loss_tmp_bytes");
  read_output_held(doc, source, chain);
  if (doc.contains("context_bytes"))
    chain.context_bytes = get_bytes(doc.at("context_bytes"), source, "context_bytes");
  const json& stages = stages_array(doc, source);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::string where = stage_where(i);
    const json& item =
        stage_object(stages[i], source, where,
                     {"name", "fwd_ms", "bwd_ms", "outputs", "saved_inputs", "saved_outputs",
                      "state_bytes", "fwd_tmp_bytes", "bwd_tmp_bytes"},
                     {"fwd_nograd_ms", "fwd_nograd_tmp_bytes"});
    Stage stage;
    stage.name = get_string(item.at("name"), source, where + ".name");
    read_times_and_temporaries(item, source, where, stage);
    stage.outputs = get_members(item.at("outputs"), source, where + ".outputs", true);
    stage.saved_inputs = get_indices(item.at("saved_inputs"), source, where + ".saved_inputs");
    stage.saved_outputs = get_indices(item.at("saved_outputs"), source, where + ".saved_outputs");
    stage.state_bytes = get_bytes(item.at("state_bytes"), source, where + ".state_bytes");
    if (item.contains("fwd_nograd_tmp_bytes"))
      stage.fwd_nograd_tmp_bytes =
          get_bytes(item.at("fwd_nograd_tmp_bytes"), source, where + ".fwd_nograd_tmp_bytes");
    // A carried member is its source: fill in its size and gradient from x_i.
    const std::vector<Member>& input = chain.members(static_cast<int>(i));
    for (std::size_t k = 0; k < stage.outputs.size(); ++k) {
      Member& member = stage.outputs[k];
      if (!member.carried()) continue;
      if (static_cast<std::size_t>(member.carried_from) >= input.size())
        fail(source, str_cat(where, ".outputs[", k, "].carry"),
             str_cat("(", member.carried_from, ") is not a member of the stage's input, which has ",
                     input.size(), input.size() == 1 ? " member" : " members"));
      member.bytes = input[static_cast<std::size_t>(member.carried_from)].bytes;
      member.grad = input[static_cast<std::size_t>(member.carried_from)].grad;
      member.grad_bytes = input[static_cast<std::size_t>(member.carried_from)].grad_bytes;
    }
    chain.stages.push_back(std::move(stage));
  }
  return chain;
}

// What Chain::validate checks of each value, with the place it names in an error, and the sum of
// all the chain's sizes so far.
class ChainChecker {
 public:
  explicit ChainChecker(const std::string& source) : source_(source) {}

  void bytes(std::int64_t bytes, const std::string& where) const {
    if (bytes < 0) fail(source_, where, str_cat("(", bytes, ") must not be negative"));
    if (bytes > kMaxChainBytes)
      fail(source_, where, str_cat("(", bytes, ") exceeds the largest size, 2^50 bytes"));
  }

  void ms(double ms, const std::string& where) const {
    if (!std::isfinite(ms)) fail(source_, where, "must be finite");
    if (ms < 0) fail(source_, where, str_cat("(", ms, ") must not be negative"));
    if (ms > kMaxStageMs)
      fail(source_, where,
           str_cat("(", ms,
                   ") exceeds the largest time, 1e15 ms (about 31,700 years): check its "
                   "unit; sums of such times could overflow"));
  }

  // The sum that kMaxChainTotalBytes bounds. Each addend has been checked to be at most
  // kMaxChainBytes and the sum is checked after each one, so the sum itself cannot overflow.
  void add_to_total(std::int64_t bytes, const std::string& where) {
    total_ += bytes;
    if (total_ > kMaxChainTotalBytes)
      fail(source_, where,
           "brings the chain's sizes past 2^60 bytes in all (each activation counted twice, "
           "for its gradient, with every state and temporary): remat's sums of sizes could "
           "overflow; check the units of the sizes");
  }

  void grad_bytes(const Member& member, const std::string& at) const {
    if (!member.grad_bytes) return;
    if (!member.grad)
      fail(source_, at + ".grad_bytes", "is given for a tensor without a gradient (grad false)");
    bytes(*member.grad_bytes, at + ".grad_bytes");
  }

  // One stage, whose input is `input`: its times and sizes, its outputs, what it saves.
  void stage(const Stage& stage, const std::vector<Member>& input, const std::string& where) {
    ms(stage.fwd_ms, where + ".fwd_ms");
    ms(stage.bwd_ms, where + ".bwd_ms");
    if (stage.fwd_nograd_ms) ms(*stage.fwd_nograd_ms, where + ".fwd_nograd_ms");
    bytes(stage.state_bytes, where + ".state_bytes");
    bytes(stage.fwd_tmp_bytes, where + ".fwd_tmp_bytes");
    bytes(stage.bwd_tmp_bytes, where + ".bwd_tmp_bytes");
    if (stage.fwd_nograd_tmp_bytes)
      bytes(*stage.fwd_nograd_tmp_bytes, where + ".fwd_nograd_tmp_bytes");
    if (stage.outputs.empty())
      fail(source_, where + ".outputs", "is empty: a stage's output needs at least one tensor");
    outputs(stage.outputs, input, where);
    indices(stage.saved_inputs, input.size(), where + ".saved_inputs", "the input");
    indices(stage.saved_outputs, stage.outputs.size(), where + ".saved_outputs", "the output");
    for (std::size_t k = 0; k < stage.saved_outputs.size(); ++k)
      if (stage.outputs[static_cast<std::size_t>(stage.saved_outputs[k])].carried())
        fail(source_, str_cat(where, ".saved_outputs[", k, "]"),
             str_cat("(", stage.saved_outputs[k],
                     ") is a carried member: it is the input's tensor, list it in saved_inputs"));
    for (const Member& member : stage.outputs) {
      add_to_total(member.bytes, where);
      add_to_total(member.gradient_size(), where);
    }
    add_to_total(stage.state_bytes, where);
    add_to_total(stage.fwd_tmp_bytes, where);
    add_to_total(stage.nograd_tmp_bytes(), where);
    add_to_total(stage.bwd_tmp_bytes, where);
  }

 private:
  // A stage's output members; a carried one is one of the input's, each at most once, alike.
  void outputs(const std::vector<Member>& outputs, const std::vector<Member>& input,
               const std::string& where) const {
    std::vector<bool> carried(input.size(), false);
    for (std::size_t k = 0; k < outputs.size(); ++k) {
      const Member& member = outputs[k];
      const std::string at = str_cat(where, ".outputs[", k, "]");
      bytes(member.bytes, at + ".bytes");
      grad_bytes(member, at);
      if (!member.carried()) continue;
      const auto from = static_cast<std::size_t>(member.carried_from);
      if (from >= input.size())
        fail(source_, at + ".carry",
             str_cat("(", member.carried_from, ") is not a member of the stage's input, which has ",
                     input.size(), input.size() == 1 ? " member" : " members"));
      if (carried[from])
        fail(source_, at + ".carry",
             str_cat("(", member.carried_from, ") is carried twice: one tensor, one member"));
      carried[from] = true;
      if (member.bytes != input[from].bytes || member.grad != input[from].grad ||
          member.gradient_size() != input[from].gradient_size())
        fail(source_, at,
             str_cat("is carried from input member ", from,
                     " but its bytes, grad or grad_bytes differ"));
    }
  }

  // Each index once, within 0..size-1.
  void indices(const std::vector<int>& indices, std::size_t size, const std::string& where,
               const char* of) const {
    std::vector<bool> seen(size, false);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const int index = indices[k];
      const std::string at = str_cat(where, "[", k, "]");
      if (index < 0 || static_cast<std::size_t>(index) >= size)
        fail(source_, at,
             str_cat("(", index, ") is not a member of ", of, ", which has ", size,
                     size == 1 ? " member" : " members"));
      if (seen[static_cast<std::size_t>(index)])
        fail(source_, at, str_cat("(", index, ") is listed twice"));
      seen[static_cast<std::size_t>(index)] = true;
    }
  }

  const std::string& source_;
  std::int64_t total_ = 0;
};

}  // namespace

std::int64_t Stage::out_bytes() const {
  std::int64_t total = 0;
  for (const Member& member : outputs) total += member.bytes;
  return total;
}

std::int64_t Stage::kept_bytes() const {
  std::int64_t total = state_bytes;
  for (const int k : saved_outputs) total += outputs[static_cast<std::size_t>(k)].bytes;
  return total;
}

Stage Stage::keeping_all(std::string name, std::int64_t out_bytes, std::int64_t saved_bytes) {
  Stage stage;
  stage.name = std::move(name);
  stage.outputs = {Member{out_bytes}};
  stage.saved_inputs = {0};
  stage.saved_outputs = {0};
  stage.state_bytes = saved_bytes - out_bytes;
  return stage;
}

const std::vector<Member>& Chain::members(int k) const {
  REMAT_CHECK(k >= 0 && k <= length(), "activation index ", k, " is outside 0..", length());
  return k == 0 ? inputs : stages[static_cast<std::size_t>(k - 1)].outputs;
}

Chain::Storages Chain::storages(int first, int end) const {
  if (end < 0) end = length();
  REMAT_CHECK(first >= 0 && first <= end && end <= length(), "activations ", first, "..", end,
              " are outside 0..", length());
  Storages out;
  out.ids.resize(static_cast<std::size_t>(end - first) + 1);
  out.makers = members(first);
  for (std::size_t m = 0; m < out.makers.size(); ++m) out.ids[0].push_back(static_cast<int>(m));
  for (int k = first; k < end; ++k) {
    const auto local = static_cast<std::size_t>(k - first);
    for (const Member& member : stages[static_cast<std::size_t>(k)].outputs) {
      if (member.carried()) {
        out.ids[local + 1].push_back(out.ids[local][static_cast<std::size_t>(member.carried_from)]);
      } else {
        out.ids[local + 1].push_back(static_cast<int>(out.makers.size()));
        out.makers.push_back(member);
      }
    }
  }
  return out;
}

std::int64_t Chain::activation_bytes(int k) const {
  std::int64_t total = 0;
  for (const Member& member : members(k)) total += member.bytes;
  return total;
}

std::int64_t Chain::gradient_bytes(int k) const {
  std::int64_t total = 0;
  for (const Member& member : members(k))
    total += member.loss_gradient_size();  // gradient_size() but for x_L's (validate)
  return total;
}

bool Chain::carries_gradient(int k) const {
  for (const Member& member : members(k))
    if (member.carried() && member.grad && member.loss_gradient) return true;
  return false;
}

void Chain::set_input(std::int64_t bytes, bool grad) { inputs = {Member{bytes, grad}}; }

double Chain::store_all_ms() const {
  double total = 0;
  for (const auto& stage : stages) total += stage.fwd_ms;
  for (const auto& stage : stages) total += stage.bwd_ms;
  return total;
}

std::int64_t Chain::carried_bytes() const {
  std::int64_t total = 0;
  for (const Stage& stage : stages)
    for (const Member& member : stage.outputs)
      if (member.carried()) total += std::max(member.bytes, member.gradient_size());
  return total;
}

void Link::validate(const std::string& source) const {
  for (auto [field, gbps] : {std::pair{"link.d2h_gbps", d2h_gbps}, std::pair{"link.h2d_gbps", h2d_gbps}})
    if (!(gbps >= kMinLinkGbps && gbps <= kMaxLinkGbps))  // NaN fails too
      fail(source, field,
           str_cat("(", gbps, ") must be a bandwidth from ", kMinLinkGbps, " to ", kMaxLinkGbps,
                   " GB/s"));
  ChainChecker{source}.ms(latency_ms, "link.latency_ms");
}

void Chain::validate(const std::string& source) const {
  ChainChecker check{source};
  if (inputs.empty()) fail(source, "inputs", "is empty: the input x_0 needs at least one tensor");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    check.bytes(inputs[k].bytes, str_cat("inputs[", k, "].bytes"));
    check.grad_bytes(inputs[k], str_cat("inputs[", k, "]"));
    if (inputs[k].carried())
      fail(source, str_cat("inputs[", k, "]"), "cannot be carried: x_0 has no stage before it");
  }
  if (stages.empty()) fail(source, "stages", "is empty: a chain needs at least one stage");
  if (stages.size() > static_cast<std::size_t>(kMaxStages))
    fail(source, "stages",
         str_cat("has ", stages.size(), " stages, more than remat handles (", kMaxStages,
                 "): the optimal solver's tables grow as the square of the number of stages; "
                 "group layers into fewer stages"));
  check.bytes(context_bytes, "context_bytes");
  check.bytes(loss_tmp_bytes, "loss_tmp_bytes");
  check.ms(restart_ms, "restart_ms");
  if (link) link->validate(source);
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    check.add_to_total(inputs[k].bytes, str_cat("inputs[", k, "]"));
    check.add_to_total(inputs[k].gradient_size(), str_cat("inputs[", k, "]"));
  }
  check.add_to_total(context_bytes, "context_bytes");
  check.add_to_total(loss_tmp_bytes, "loss_tmp_bytes");
  for (std::size_t i = 0; i < stages.size(); ++i)
    check.stage(stages[i], members(static_cast<int>(i)), stage_where(i));
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].loss_gradient)
      fail(source, str_cat("inputs[", k, "].loss_gradient"),
           "is false, which only a member of the chain's output (the last stage's) may be");
  for (std::size_t i = 0; i + 1 < stages.size(); ++i)
    for (std::size_t o = 0; o < stages[i].outputs.size(); ++o)
      if (!stages[i].outputs[o].loss_gradient)
        fail(source, str_cat(stage_where(i), ".outputs[", o, "].loss_gradient"),
             "is false, which only a member of the chain's output (the last stage's) may be");
  bool any_gradient = false;
  for (const Member& member : stages.back().outputs) any_gradient = any_gradient || member.grad;
  if (!any_gradient)
    fail(source, stage_where(stages.size() - 1) + ".outputs",
         "has no member with a gradient: the loss has nothing to differentiate");
  bool differentiated = false;
  for (const Member& member : stages.back().outputs)
    differentiated = differentiated || (member.grad && member.loss_gradient);
  if (!differentiated)
    fail(source, stage_where(stages.size() - 1) + ".outputs",
         "has no member with a gradient that the loss differentiates (every one has "
         "\"loss_gradient\": false)");
}

Chain parse_chain(const std::string& json_text, const std::string& source) {
  json doc = parse_document(json_text, source);
  if (!doc.is_object())
    fail(source, "", str_cat("is not a remat chain: expected a JSON object, got ", type_name(doc)));
  if (!doc.contains("format"))
    fail(source, "",
         str_cat("is not a remat chain: no \"format\" field (expected \"", kChainFormat, "\")"));
  const std::string format = get_string(doc.at("format"), source, "format");
  Chain chain;
  if (format == kChainFormat || format == kChainFormatV3)
    chain = parse_v2(doc, source, format == kChainFormatV3);
  else if (format == kChainFormatV1)
    chain = parse_v1(doc, source);
  else
    fail(source, "format",
         str_cat("is \"", format, "\"; this version of remat reads \"", kChainFormatV3, "\", \"",
                 kChainFormat, "\" and \"", kChainFormatV1, "\""));
  chain.validate(source);
  return chain;
}

Chain load_chain(const std::string& path) {
  return parse_chain(detail::json_fields::read_file(path, "chain"), path);
}

std::string chain_to_json(const Chain& chain) {
  auto member_json = [](const Member& member) {
    json item = json::object();
    if (member.carried()) {
      item["carry"] = member.carried_from;
    } else {
      item["bytes"] = member.bytes;
      item["grad"] = member.grad;
      if (member.grad && member.grad_bytes && *member.grad_bytes != member.bytes)
        item["grad_bytes"] = *member.grad_bytes;
    }
    if (!member.loss_gradient) item["loss_gradient"] = false;  // the default is not written
    return item;
  };
  json doc = json::object();
  doc["format"] = chain.link ? kChainFormatV3 : kChainFormat;
  doc["name"] = chain.name;
  json inputs = json::array();
  for (const Member& member : chain.inputs) inputs.push_back(member_json(member));
  doc["inputs"] = std::move(inputs);
  if (chain.context_bytes != 0) doc["context_bytes"] = chain.context_bytes;
  json stages = json::array();
  for (const Stage& stage : chain.stages) {
    json item = json::object();
    item["name"] = stage.name;
    item["fwd_ms"] = stage.fwd_ms;
    item["bwd_ms"] = stage.bwd_ms;
    if (stage.fwd_nograd_ms) item["fwd_nograd_ms"] = *stage.fwd_nograd_ms;
    json outputs = json::array();
    for (const Member& member : stage.outputs) outputs.push_back(member_json(member));
    item["outputs"] = std::move(outputs);
    item["saved_inputs"] = stage.saved_inputs;
    item["saved_outputs"] = stage.saved_outputs;
    item["state_bytes"] = stage.state_bytes;
    item["fwd_tmp_bytes"] = stage.fwd_tmp_bytes;
    if (stage.fwd_nograd_tmp_bytes) item["fwd_nograd_tmp_bytes"] = *stage.fwd_nograd_tmp_bytes;
    item["bwd_tmp_bytes"] = stage.bwd_tmp_bytes;
    stages.push_back(std::move(item));
  }
  doc["stages"] = std::move(stages);
  doc["loss_tmp_bytes"] = chain.loss_tmp_bytes;
  if (!chain.output_held) doc["output_held"] = false;  // the default is not written
  if (chain.restart_ms != 0) doc["restart_ms"] = chain.restart_ms;  // nor is 0
  if (chain.link)
    doc["link"] = json{{"d2h_gbps", chain.link->d2h_gbps},
                       {"h2d_gbps", chain.link->h2d_gbps},
                       {"latency_ms", chain.link->latency_ms}};
  return doc.dump(2) + "\n";
}

void save_chain(const Chain& chain, const std::string& path) {
  write_text_file(path, chain_to_json(chain), "the chain file");
}

}  // namespace remat
