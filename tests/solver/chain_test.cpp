// The chain formats remat-chain/2 and /1: what is accepted, what is rejected and how errors
// read.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "remat/solver.h"
#include "test_chains.h"

namespace remat {
namespace {

const char* kValid = R"({
  "format": "remat-chain/1", "name": "two", "input_bytes": 100,
  "stages": [
    {"name": "a", "fwd_ms": 1.5, "bwd_ms": 2, "out_bytes": 50, "saved_bytes": 80,
     "fwd_tmp_bytes": 0, "bwd_tmp_bytes": 8, "fwd_nograd_ms": 1.25},
    {"name": "b", "fwd_ms": 1, "bwd_ms": 2, "out_bytes": 4e1, "saved_bytes": 40,
     "fwd_tmp_bytes": 2, "bwd_tmp_bytes": 0}
  ],
  "loss_tmp_bytes": 16
})";

// Model v2: tuples, members without gradient, partial keeps, a carried member, context.
const char* kValid2 = R"({
  "format": "remat-chain/2", "name": "tuples",
  "inputs": [{"bytes": 100, "grad": false}, {"bytes": 8, "grad": false}],
  "context_bytes": 32,
  "stages": [
    {"name": "embed", "fwd_ms": 1, "bwd_ms": 2, "outputs": [{"bytes": 400}, {"carry": 1}],
     "saved_inputs": [0], "saved_outputs": [], "state_bytes": 0,
     "fwd_tmp_bytes": 0, "bwd_tmp_bytes": 0},
    {"name": "block", "fwd_ms": 3, "bwd_ms": 5, "fwd_nograd_ms": 2.5,
     "outputs": [{"bytes": 400, "grad": true}],
     "saved_inputs": [0, 1], "saved_outputs": [0], "state_bytes": 64,
     "fwd_tmp_bytes": 16, "bwd_tmp_bytes": 24}
  ],
  "loss_tmp_bytes": 4
})";

// Replaces the first occurrence of `from` in the valid document.
std::string edited(const std::string& from, const std::string& to, const char* valid = kValid) {
  std::string text = valid;
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string error_of(const std::string& text) {
  try {
    parse_chain(text, "c.json");
  } catch (const ChainError& error) {
    return error.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("a version 1 chain is read field by field, as stages that keep everything", "[solver]") {
  const Chain chain = parse_chain(kValid, "c.json");
  REQUIRE(chain.name == "two");
  REQUIRE(chain.length() == 2);
  CHECK(chain.input_bytes() == 100);
  CHECK(chain.gradient_bytes(0) == 100);  // model v1 computes y_0
  // saved_bytes 80 = the output (50) + 30 of state; input and output kept.
  CHECK(chain.stages[0].state_bytes == 30);
  CHECK(chain.stages[0].saved_inputs == std::vector<int>{0});
  CHECK(chain.stages[0].saved_outputs == std::vector<int>{0});
  CHECK(chain.stages[0].kept_bytes() == 80);
  CHECK(chain.loss_tmp_bytes == 16);
  CHECK(chain.stages[0].fwd_ms == 1.5);
  CHECK(chain.stages[0].nograd_ms() == 1.25);
  CHECK(chain.stages[1].nograd_ms() == 1.0);  // defaults to fwd_ms
  CHECK_FALSE(chain.stages[1].fwd_nograd_ms.has_value());
  CHECK(chain.stages[1].out_bytes() == 40);  // 4e1: a whole number written as a float
  CHECK(chain.activation_bytes(0) == 100);
  CHECK(chain.activation_bytes(2) == 40);
  CHECK(chain.store_all_ms() == 6.5);
  // Written back, it is a version 2 document describing the same chain.
  const std::string v2 = chain_to_json(chain);
  CHECK_THAT(v2, Catch::Contains("remat-chain/2"));
  CHECK(chain_to_json(parse_chain(v2)) == v2);
}

TEST_CASE("a version 2 chain is read field by field", "[solver]") {
  const Chain chain = parse_chain(kValid2, "c.json");
  REQUIRE(chain.length() == 2);
  REQUIRE(chain.inputs.size() == 2);
  CHECK(chain.input_bytes() == 108);
  CHECK(chain.gradient_bytes(0) == 0);
  CHECK(chain.context_bytes == 32);
  // The carried member is the input's second tensor: its size and gradient come with it.
  const Member& carried = chain.stages[0].outputs[1];
  CHECK(carried.carried_from == 1);
  CHECK(carried.bytes == 8);
  CHECK_FALSE(carried.grad);
  CHECK_FALSE(chain.carries_gradient(1));  // carried, but without a gradient
  Chain with_gradient = chain;
  with_gradient.inputs[1].grad = true;
  with_gradient.stages[0].outputs[1].grad = true;
  CHECK(with_gradient.carries_gradient(1));
  CHECK_FALSE(with_gradient.carries_gradient(0));  // x_0's members are never carried
  CHECK_FALSE(with_gradient.carries_gradient(2));
  CHECK(chain.activation_bytes(1) == 408);
  CHECK(chain.gradient_bytes(1) == 400);
  CHECK(chain.stages[0].out_bytes() == 408);
  CHECK(chain.stages[0].kept_bytes() == 0);
  CHECK(chain.stages[1].kept_bytes() == 464);
  CHECK(chain.stages[1].nograd_ms() == 2.5);
  CHECK(chain.loss_tmp_bytes == 4);
  CHECK(chain.output_held);  // the default, not written
  CHECK(chain_to_json(chain).find("output_held") == std::string::npos);
  CHECK(chain_to_json(parse_chain(chain_to_json(chain))) == chain_to_json(chain));
  // A loss measured with the output let go says so, and keeps saying so.
  const Chain released = parse_chain(
      edited("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"output_held\": false", kValid2));
  CHECK_FALSE(released.output_held);
  CHECK_FALSE(parse_chain(chain_to_json(released)).output_held);
  CHECK(parse_chain(edited("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"output_held\": true",
                           kValid2))
            .output_held);
  // The restart cost: 0 unless given, and then written back; 0 is not written.
  CHECK(chain.restart_ms == 0);
  CHECK(chain_to_json(chain).find("restart_ms") == std::string::npos);
  const Chain restarting = parse_chain(
      edited("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"restart_ms\": 0.125", kValid2));
  CHECK(restarting.restart_ms == 0.125);
  CHECK(parse_chain(chain_to_json(restarting)).restart_ms == 0.125);
  // A gradient of another size than its member (an expanded member's, larger): counted in the
  // activation's gradient, carried with the member, written back; absent, the member's bytes.
  CHECK(chain.stages[0].outputs[0].gradient_size() == 400);
  CHECK(chain.stages[0].outputs[1].gradient_size() == 0);  // no gradient
  CHECK(chain_to_json(chain).find("grad_bytes") == std::string::npos);
  const Chain expanded = parse_chain(edited("\"outputs\": [{\"bytes\": 400}",
                                            "\"outputs\": [{\"bytes\": 400, \"grad_bytes\": 6400}",
                                            kValid2));
  CHECK(expanded.stages[0].outputs[0].gradient_size() == 6400);
  CHECK(expanded.gradient_bytes(1) == 6400);
  CHECK(expanded.activation_bytes(1) == 408);
  CHECK(chain_to_json(parse_chain(chain_to_json(expanded))) == chain_to_json(expanded));
  CHECK(chain_to_json(expanded).find("\"grad_bytes\": 6400") != std::string::npos);
  Chain carried_on = expanded;  // block carries the expanded member on
  carried_on.stages[1].outputs.push_back(Member{400, true, 0, 6400});
  carried_on.validate();
  CHECK(carried_on.gradient_bytes(2) == 6800);
  CHECK(parse_chain(chain_to_json(carried_on)).stages[1].outputs[1].gradient_size() == 6400);
  carried_on.stages[1].outputs[1].grad_bytes = std::nullopt;  // 400: not its source's gradient
  CHECK_THROWS_WITH(carried_on.validate("built"),
                    Catch::Contains("stages[1].outputs[1] is carried from input member 0 but its "
                                    "bytes, grad or grad_bytes differ"));
}

TEST_CASE("members of x_L the loss does not differentiate: read, written, checked", "[solver]") {
  // The last stage carries its input's first member (400 bytes, with a gradient) on beside its
  // own output, as a model returns its logits beside its loss, which does not read them.
  const std::string block_out = "\"outputs\": [{\"bytes\": 400, \"grad\": true}";
  const std::string carried_out =
      edited(block_out, block_out + ", {\"carry\": 0, \"loss_gradient\": false}", kValid2);
  const Chain chain = parse_chain(carried_out, "c.json");
  const std::vector<Member>& out = chain.stages[1].outputs;
  REQUIRE(out.size() == 2);
  CHECK(out[0].loss_gradient);
  CHECK_FALSE(out[1].loss_gradient);
  CHECK(out[1].carried_from == 0);
  CHECK(out[1].grad);  // the tensor has one; the loss gives it none
  CHECK(chain.gradient_bytes(2) == 400);
  CHECK(out[1].loss_gradient_size() == 0);
  CHECK_FALSE(chain.carries_gradient(2));
  const std::string text = chain_to_json(chain);
  CHECK(text.find("\"loss_gradient\": false") != std::string::npos);
  CHECK(chain_to_json(parse_chain(text)) == text);
  CHECK(chain_to_json(parse_chain(kValid2)).find("loss_gradient") == std::string::npos);
  // The same on a new member; true is the default.
  const Chain own = parse_chain(edited(block_out,
                                       "\"outputs\": [{\"bytes\": 400, \"loss_gradient\": true}, "
                                       "{\"bytes\": 32, \"loss_gradient\": false}",
                                       kValid2));
  CHECK(own.gradient_bytes(2) == 400);
  // Refused: not a boolean; on a member that is not x_L's; every member of x_L without one.
  CHECK_THROWS_WITH(
      parse_chain(edited("\"loss_gradient\": false", "\"loss_gradient\": 0", carried_out.c_str()),
                  "c.json"),
      Catch::Contains("c.json: stages[1].outputs[1].loss_gradient must be true or false"));
  CHECK_THROWS_WITH(
      parse_chain(edited("\"outputs\": [{\"bytes\": 400}",
                         "\"outputs\": [{\"bytes\": 400, \"loss_gradient\": false}", kValid2),
                  "c.json"),
      Catch::Contains("stages[0].outputs[0].loss_gradient is false, which only a member of the "
                      "chain's output"));
  CHECK_THROWS_WITH(
      parse_chain(
          edited(block_out, "\"outputs\": [{\"bytes\": 400, \"loss_gradient\": false}", kValid2),
          "c.json"),
      Catch::Contains(
          "stages[1].outputs has no member with a gradient that the loss differentiates"));
}

TEST_CASE("version 2 chain files are rejected with the stage, the member and the field",
          "[solver]") {
  using Catch::Contains;
  auto error2 = [](const std::string& from, const std::string& to) {
    return error_of(edited(from, to, kValid2));
  };
  CHECK(error_of(kValid2) == "(accepted)");
  CHECK_THAT(error2("\"carry\": 1", "\"carry\": 2"),
             Contains("c.json: stages[0].outputs[1].carry (2) is not a member of the stage's "
                      "input, which has 2 members"));
  CHECK_THAT(error2("\"carry\": 1", "\"carry\": -1"),
             Contains("stages[0].outputs[1].carry must be the index of a member"));
  CHECK_THAT(error2("{\"carry\": 1}", "{\"carry\": 1, \"bytes\": 8}"),
             Contains("stages[0].outputs[1].bytes is not a field of a carried tensor"));
  CHECK_THAT(error2("\"saved_inputs\": [0, 1]", "\"saved_inputs\": [0, 2]"),
             Contains("stages[1].saved_inputs[1] (2) is not a member of the input, which has 2"));
  CHECK_THAT(error2("\"saved_inputs\": [0, 1]", "\"saved_inputs\": [1, 1]"),
             Contains("stages[1].saved_inputs[1] (1) is listed twice"));
  CHECK_THAT(error2("\"saved_outputs\": [], \"state_bytes\": 0",
                    "\"saved_outputs\": [1], \"state_bytes\": 0"),
             Contains("stages[0].saved_outputs[0] (1) is a carried member"));
  CHECK_THAT(error2("\"saved_inputs\": [0, 1]", "\"saved_inputs\": [\"a\"]"),
             Contains("stages[1].saved_inputs[0] must be a member index"));
  CHECK_THAT(error2("{\"bytes\": 400, \"grad\": true}", "{\"bytes\": 400, \"grad\": false}"),
             Contains("stages[1].outputs has no member with a gradient"));
  CHECK_THAT(error2("{\"bytes\": 400, \"grad\": true}", "{\"bytes\": 400, \"grad\": 1}"),
             Contains("stages[1].outputs[0].grad must be true or false, got a number"));
  CHECK_THAT(error2("{\"bytes\": 400, \"grad\": true}", "{\"bytes\": 400, \"grad_bytes\": -4}"),
             Contains("stages[1].outputs[0].grad_bytes (-4) must not be negative"));
  CHECK_THAT(error2("{\"bytes\": 400, \"grad\": true}", "{\"bytes\": 400, \"grad_bytes\": \"4\"}"),
             Contains("stages[1].outputs[0].grad_bytes"));
  CHECK_THAT(error2("{\"bytes\": 8, \"grad\": false}", "{\"bytes\": 8, \"grad\": false, \"grad_bytes\": 8}"),
             Contains("inputs[1].grad_bytes is given for a tensor without a gradient (grad false)"));
  CHECK_THAT(error2("{\"carry\": 1}", "{\"carry\": 1, \"grad_bytes\": 8}"),
             Contains("stages[0].outputs[1].grad_bytes is not a field of a carried tensor"));
  CHECK_THAT(error2("\"outputs\": [{\"bytes\": 400, \"grad\": true}]", "\"outputs\": []"),
             Contains("stages[1].outputs is empty"));
  CHECK_THAT(error2("\"context_bytes\": 32", "\"context_bytes\": -1"),
             Contains("context_bytes (-1) must not be negative"));
  CHECK_THAT(error2("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"output_held\": \"no\""),
             Contains("c.json: output_held must be true or false, got a string"));
  CHECK_THAT(error2("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"restart_ms\": -0.5"),
             Contains("c.json: restart_ms (-0.5) must not be negative"));
  CHECK_THAT(error2("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"restart_ms\": \"1\""),
             Contains("c.json: restart_ms must be a number of milliseconds, got a string"));
  CHECK_THAT(error2("\"loss_tmp_bytes\": 4", "\"loss_tmp_bytes\": 4, \"restart_ms\": 1e16"),
             Contains("c.json: restart_ms (1e+16) exceeds the largest time"));
  CHECK_THAT(error2("\"state_bytes\": 64", "\"state_bytes\": 6.5"),
             Contains("stages[1].state_bytes (6.5) must be a whole number of bytes"));
  CHECK_THAT(
      error2("\"inputs\": [{\"bytes\": 100, \"grad\": false}, {\"bytes\": 8, \"grad\": false}]",
             "\"inputs\": []"),
      Contains("c.json: inputs is empty"));
  CHECK_THAT(
      error2("\"inputs\": [{\"bytes\": 100, \"grad\": false},", "\"inputs\": [{\"carry\": 0},"),
      Contains("c.json: inputs[0].carry is not allowed: the input x_0 has no stage"));
  CHECK_THAT(error2("\"state_bytes\": 64,", ""), Contains("stages[1].state_bytes is missing"));
  CHECK_THAT(error2("\"state_bytes\": 64,", "\"state_bytes\": 64, \"saved_bytes\": 1,"),
             Contains("stages[1].saved_bytes is not a field of a stage"));
}

TEST_CASE("chain files are rejected with the file, the stage and the field", "[solver]") {
  using Catch::Contains;
  CHECK_THAT(error_of("{\"format\": "),
             Contains("c.json: is not valid JSON") && Contains("line 1"));
  CHECK_THAT(error_of("[1, 2]"), Contains("c.json: is not a remat chain: expected a JSON object"));
  CHECK_THAT(error_of("{}"), Contains("no \"format\" field"));
  CHECK_THAT(error_of(edited("remat-chain/1", "remat-chain/4")),
             Contains("c.json: format is \"remat-chain/4\"; this version of remat reads"));
  CHECK_THAT(error_of(edited("\"input_bytes\": 100,", "")),
             Contains("c.json: input_bytes is missing"));
  CHECK_THAT(error_of(edited("\"name\": \"two\",", "\"name\": \"two\", \"extra\": 1,")),
             Contains("c.json: extra is not a field of a chain"));
  CHECK_THAT(error_of(edited("\"bwd_ms\": 2,", "\"bwd_ms\": 2, \"gpu\": 1,")),
             Contains("c.json: stages[0].gpu is not a field of a stage"));
  CHECK_THAT(error_of(edited("\"fwd_ms\": 1,", "")),
             Contains("c.json: stages[1].fwd_ms is missing"));
  CHECK_THAT(error_of(edited("\"fwd_ms\": 1.5", "\"fwd_ms\": \"fast\"")),
             Contains("stages[0].fwd_ms must be a number of milliseconds, got a string"));
  CHECK_THAT(error_of(edited("\"out_bytes\": 50", "\"out_bytes\": -50")),
             Contains("stages[0].out_bytes (-50) must not be negative"));
  CHECK_THAT(error_of(edited("\"bwd_ms\": 2,", "\"bwd_ms\": -2,")),
             Contains("stages[0].bwd_ms (-2) must not be negative"));
  CHECK_THAT(error_of(edited("\"fwd_ms\": 1.5", "\"fwd_ms\": 1e999")),
             Contains("c.json: is not valid JSON") && Contains("1e999"));
  // What nlohmann's reader would let through: text after a NUL (it stops there), a key given
  // twice (it keeps the last); and what it would quote whole or raw.
  CHECK_THAT(error_of(edited("remat-chain/1", "remat-chain/1") + std::string(1, '\0') + "junk"),
             Contains("c.json: is not valid JSON: a NUL byte at offset"));
  CHECK_THAT(error_of(edited("\"out_bytes\": 50", "\"out_bytes\": 50, \"out_bytes\": 60")),
             Contains("c.json: stages[0].out_bytes is given twice"));
  CHECK_THAT(error_of(edited("\"name\": \"two\",", "\"name\": \"two\", \"name\": \"three\",")),
             Contains("c.json: name is given twice"));
  const std::string long_number = error_of(edited("\"fwd_ms\": 1.5", "\"fwd_ms\": 1" +
                                                                     std::string(100000, '0')));
  CHECK_THAT(long_number, Contains("is not valid JSON") && Contains("..."));
  CHECK(long_number.size() < 400);
  // A key of 100,000 characters, a field that is not known, a key given twice: the place is
  // shortened too.
  const std::string long_key = std::string(100000, 'k');
  const std::string unknown =
      error_of(edited("\"bwd_ms\": 2,", "\"bwd_ms\": 2, \"" + long_key + "\": 1,"));
  // The place says how long the key was: stages[0]. and its 100,000 characters.
  CHECK_THAT(unknown, Contains("c.json: stages[0].kkk") &&
                          Contains("... (100010 bytes) is not a field of a stage"));
  CHECK(unknown.size() < 1000);
  const std::string twice = error_of(
      edited("\"bwd_ms\": 2,", "\"bwd_ms\": 2, \"" + long_key + "\": 1, \"" + long_key + "\": 2,"));
  CHECK_THAT(twice, Contains("... (100010 bytes) is given twice"));
  CHECK(twice.size() < 400);
  CHECK_THAT(error_of(edited("\"fwd_ms\": 1.5", "\"fwd_ms\": \x1b[2J")),
             Contains("<U+001B>") && !Contains("\x1b"));
  CHECK_THAT(error_of(edited("\"saved_bytes\": 80", "\"saved_bytes\": 20")),
             Contains("c.json: stages[0].saved_bytes (20) is smaller than out_bytes (50)"));
  CHECK_THAT(error_of(edited("\"out_bytes\": 50", "\"out_bytes\": 50.5")),
             Contains("stages[0].out_bytes (50.5) must be a whole number of bytes"));
  CHECK_THAT(error_of(edited("\"out_bytes\": 50", "\"out_bytes\": 1e300")),
             Contains("stages[0].out_bytes") && Contains("exceeds the largest size"));
  CHECK_THAT(error_of(edited("\"input_bytes\": 100", "\"input_bytes\": null")),
             Contains("input_bytes must be a number of bytes, got null"));
  CHECK_THAT(error_of(edited("\"name\": \"a\"", "\"name\": 3")),
             Contains("stages[0].name must be a string, got a number"));
  CHECK_THAT(error_of(R"({"format": "remat-chain/1", "name": "", "input_bytes": 1, "stages": []})"),
             Contains("c.json: stages is empty"));
  CHECK_THAT(error_of(R"({"format": "remat-chain/1", "name": "", "input_bytes": 1, "stages": {}})"),
             Contains("stages must be an array of stages, got an object"));
  CHECK_THAT(
      error_of(R"({"format": "remat-chain/1", "name": "", "input_bytes": 1, "stages": [7]})"),
      Contains("stages[0] must be an object, got a number"));
}

TEST_CASE("chains survive a JSON round trip and are saved atomically", "[solver]") {
  test::RandomChainSpec spec;
  spec.partial_keeps = true;
  spec.carried = true;
  spec.restarts = true;
  spec.gradient_sizes = true;
  const Chain chain = test::random_chain(3, spec);
  REQUIRE(chain.restart_ms > 0);
  const Chain back = parse_chain(chain_to_json(chain));
  REQUIRE(chain_to_json(back) == chain_to_json(chain));
  CHECK(back.restart_ms == chain.restart_ms);
  REQUIRE(back.stages.size() == chain.stages.size());
  for (std::size_t i = 0; i < chain.stages.size(); ++i) {
    CHECK(back.stages[i].fwd_ms == chain.stages[i].fwd_ms);  // doubles printed exactly
    CHECK(back.stages[i].fwd_nograd_ms == chain.stages[i].fwd_nograd_ms);
  }

  char folder[] = "/tmp/remat-chain-XXXXXX";
  REQUIRE(mkdtemp(folder) != nullptr);
  const std::string path = std::string(folder) + "/chain.json";
  save_chain(chain, path);
  CHECK(chain_to_json(load_chain(path)) == chain_to_json(chain));
  // A folder that does not exist: an error, and nothing written anywhere.
  const std::string missing = std::string(folder) + "/no/such/chain.json";
  CHECK_THROWS_WITH(save_chain(chain, missing), Catch::Contains("cannot write"));
  CHECK_THROWS_WITH(load_chain(std::string(folder) + "/absent.json"),
                    Catch::Contains("absent.json: cannot open the chain file"));
  std::remove(path.c_str());
  std::remove(folder);
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> folder_entries(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = opendir(folder.c_str());
  REQUIRE(dir != nullptr);
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

// A folder under /tmp, removed with everything in it at the end of the test.
struct TempFolder {
  std::string path;
  TempFolder() {
    char made[] = "/tmp/remat-files-XXXXXX";
    REQUIRE(mkdtemp(made) != nullptr);
    path = made;
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
};

}  // namespace

TEST_CASE("output files: never through a planted link, never onto a non-regular file", "[solver]") {
  const TempFolder temp;
  const std::string& folder = temp.path;
  const std::string path = folder + "/out.svg";
  const std::string victim = folder + "/victim";
  { std::ofstream(victim) << "precious"; }

  // Links planted at the names the old writer used (path + ".tmp-remat") or at any guess of a
  // temporary name are not followed: the victim keeps its contents.
  REQUIRE(symlink(victim.c_str(), (path + ".tmp-remat").c_str()) == 0);
  write_text_file(path, "new");
  CHECK(read_file(path) == "new");
  CHECK(read_file(victim) == "precious");
  // Nothing else left behind: no temporary.
  CHECK(folder_entries(folder) ==
        std::vector<std::string>{"out.svg", "out.svg.tmp-remat", "victim"});

  // The destination's permissions are kept; a new file gets the umask's.
  REQUIRE(chmod(path.c_str(), 0600) == 0);
  write_text_file(path, "again");
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  // But not set-user-ID, set-group-ID or sticky: a program written over stays no program.
  REQUIRE(chmod(path.c_str(), 06755 | S_ISVTX) == 0);
  write_text_file(path, "over a setuid file");
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0755);
  const mode_t mask = umask(022);
  write_text_file(folder + "/fresh.json", "{}");
  umask(mask);
  REQUIRE(stat((folder + "/fresh.json").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0644);

  // A destination that is not a regular file is refused, and left as it is.
  const std::string link = folder + "/link.json";
  REQUIRE(symlink(victim.c_str(), link.c_str()) == 0);
  CHECK_THROWS_WITH(
      write_text_file(link, "x", "the chain file"),
      Catch::Contains("link.json: cannot write the chain file there: it is a symbolic link"));
  CHECK(read_file(victim) == "precious");
  struct stat lst {};
  REQUIRE(lstat(link.c_str(), &lst) == 0);
  CHECK(S_ISLNK(lst.st_mode));
  CHECK_THROWS_WITH(write_text_file(folder, "x"), Catch::Contains("it is a directory"));
  const std::string fifo = folder + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(write_text_file(fifo, "x"),
                    Catch::Contains("it is a FIFO"));  // and does not block
  CHECK_THROWS_WITH(write_text_file("/dev/null", "x"), Catch::Contains("it is a device"));
  // Checked before any work: a missing folder, a non-regular destination.
  CHECK_THROWS_WITH(check_output_path(folder + "/no/such/x.svg", "the plot"),
                    Catch::Contains("x.svg: cannot write the plot: the folder " + folder +
                                    "/no/such does not exist"));
  CHECK_THROWS_WITH(check_output_path(fifo), Catch::Contains("it is a FIFO"));
  // The check creates the temporary the write will, and removes it: nothing is left.
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(folder))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = entries();
  CHECK_NOTHROW(check_output_path(folder + "/new.json"));
  CHECK(entries() == before);
  CHECK_NOTHROW(check_output_path("-"));
  // A folder whose permissions allow it but whose file system makes no new file (/proc: root's
  // access() check passes there): refused before any work, not after it.
  CHECK_THROWS_WITH(check_output_path("/proc/remat-x.json", "the chain file"),
                    Catch::Contains("/proc/remat-x.json: cannot write the chain file"));
}

TEST_CASE("output files: several are written all or none", "[solver]") {
  const TempFolder temp;
  const std::string& folder = temp.path;
  const std::string chain = folder + "/chain.json";
  const std::string plot = folder + "/plot.svg";
  write_text_file(chain, "old");
  // The second cannot be written (a directory is there): the first keeps its old contents.
  REQUIRE(mkdir(plot.c_str(), 0700) == 0);
  CHECK_THROWS_WITH(
      write_text_files({{chain, "new", "the chain file"}, {plot, "<svg/>", "the plot"}}),
      Catch::Contains(plot + ": cannot write the plot there: it is a directory"));
  CHECK(read_file(chain) == "old");
  CHECK(folder_entries(folder) ==
        std::vector<std::string>{"chain.json", "plot.svg"});  // no temporary
  // Both writable: both written.
  rmdir(plot.c_str());
  write_text_files({{chain, "new", "the chain file"}, {plot, "<svg/>", "the plot"}});
  CHECK(read_file(chain) == "new");
  CHECK(folder_entries(folder) == std::vector<std::string>{"chain.json", "plot.svg"});
}

TEST_CASE("output files: a failed write to standard output is an error", "[solver]") {
  // Standard output becomes a pipe whose reader is gone: the write fails with EPIPE (SIGPIPE
  // ignored, as the CLI's caller may have it), and write_text_file("-") reports it.
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  close(fds[0]);
  std::fflush(stdout);
  const int saved = dup(STDOUT_FILENO);
  REQUIRE(dup2(fds[1], STDOUT_FILENO) >= 0);
  close(fds[1]);
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  std::string message;
  try {
    write_text_file("-", "text", "the chain");
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  std::signal(SIGPIPE, previous);
  dup2(saved, STDOUT_FILENO);
  close(saved);
  CHECK_THAT(message, Catch::Contains("standard output: writing the chain failed"));
}

TEST_CASE("validate() holds chains built in code to the same rules", "[solver]") {
  Chain chain = test::uniform_chain(3);
  chain.validate();
  chain.stages[2].saved_inputs = {3};
  CHECK_THROWS_WITH(chain.validate("built"),
                    Catch::Contains("built: stages[2].saved_inputs[0] (3) is not a member of the "
                                    "input, which has 1 member"));
  chain.stages[2].saved_inputs = {0};
  chain.stages[2].outputs.push_back(Member{5, true, 0});  // carried, but 10 bytes at the source
  CHECK_THROWS_WITH(chain.validate("built"),
                    Catch::Contains("stages[2].outputs[1] is carried from input member 0 but its "
                                    "bytes, grad or grad_bytes differ"));
  chain.stages[2].outputs[1] = Member{10, false, -1};
  chain.stages[2].outputs[1].grad_bytes = 40;
  CHECK_THROWS_WITH(chain.validate("built"),
                    Catch::Contains("stages[2].outputs[1].grad_bytes is given for a tensor without "
                                    "a gradient (grad false)"));
  chain.stages[2].outputs[1].grad = true;
  chain.stages[2].outputs[1].grad_bytes = -1;
  CHECK_THROWS_WITH(chain.validate("built"),
                    Catch::Contains("stages[2].outputs[1].grad_bytes (-1) must not be negative"));
  chain.stages[2].outputs.pop_back();
  chain.stages.clear();
  CHECK_THROWS_WITH(chain.validate("built"), Catch::Contains("stages is empty"));
  CHECK_THROWS_AS(solve(chain, SolveOptions(100)), ChainError);
}

TEST_CASE("times are at most kMaxStageMs: enormous ones are refused, naming the stage",
          "[solver]") {
  // 1e308 is finite, but two of them add up to infinity.
  CHECK(error_of(edited("\"fwd_ms\": 1, \"bwd_ms\": 2, \"out_bytes\": 4e1",
                        "\"fwd_ms\": 1e308, \"bwd_ms\": 2, \"out_bytes\": 4e1")) ==
        "c.json: stages[1].fwd_ms (1e+308) exceeds the largest time, 1e15 ms (about 31,700 "
        "years): check its unit; sums of such times could overflow");
  CHECK_THAT(error_of(edited("\"fwd_nograd_ms\": 1.25", "\"fwd_nograd_ms\": 1e16")),
             Catch::Contains("c.json: stages[0].fwd_nograd_ms (1e+16) exceeds the largest time"));
  Chain chain = test::uniform_chain(3);
  chain.stages[2].bwd_ms = kMaxStageMs;
  chain.validate("built");  // the largest time itself is accepted
  chain.stages[2].bwd_ms = std::nextafter(kMaxStageMs, 2 * kMaxStageMs);
  CHECK_THROWS_WITH(chain.validate("built"),
                    Catch::StartsWith("built: stages[2].bwd_ms (1e+15) exceeds the largest time"));
}

TEST_CASE(
    "sums of sizes are at most kMaxChainTotalBytes: a chain past it is refused, naming "
    "the stage",
    "[solver]") {
  // Each stage adds twice its output (for its gradient): the input and stages 0..510 make
  // 512 * 2^51 = 2^60 bytes, stage 511 goes past.
  Chain chain = test::uniform_chain(600, kMaxChainBytes);
  CHECK_THROWS_AS(chain.validate("big.json"), ChainError);
  CHECK_THROWS_WITH(chain.validate("big.json"),
                    "big.json: stages[511] brings the chain's sizes past 2^60 bytes in all (each "
                    "activation counted twice, for its gradient, with every state and "
                    "temporary): remat's sums of sizes could overflow; check the units of the "
                    "sizes");
  chain.stages.resize(511);
  chain.validate("big.json");
  CHECK(store_all_peak(chain) > 0);  // every sum fits
  // Temporaries count too, and a solve names the chain.
  chain.stages[510].bwd_tmp_bytes = 1;
  CHECK_THROWS_WITH(solve(chain, SolveOptions(1000)),
                    Catch::StartsWith("chain 'uniform-600': stages[510] brings the chain's sizes "
                                      "past 2^60 bytes"));
  // So do the members of one activation, each at most 2^50 bytes.
  Chain wide = test::uniform_chain(1);
  wide.stages[0].outputs.assign(600, Member{kMaxChainBytes});
  CHECK_THROWS_WITH(wide.validate("wide.json"),
                    Catch::StartsWith("wide.json: stages[0] brings the chain's sizes past"));
  // The file format reaches the same check.
  std::string text = R"({"format": "remat-chain/1", "name": "big", "input_bytes": 1,
    "stages": [)";
  for (int i = 0; i < 520; ++i)
    text += std::string(i ? "," : "") +
            R"({"name": "s", "fwd_ms": 1, "bwd_ms": 1, "out_bytes": 1125899906842624,
                "saved_bytes": 1125899906842624, "fwd_tmp_bytes": 0, "bwd_tmp_bytes": 0})";
  text += "]}";
  CHECK_THAT(error_of(text), Catch::StartsWith("c.json: stages[511] brings the chain's sizes"));
}

TEST_CASE("the number of stages is at most kMaxStages", "[solver]") {
  Chain chain = test::uniform_chain(kMaxStages + 1);
  CHECK_THROWS_AS(chain.validate("long.json"), ChainError);
  CHECK_THROWS_WITH(chain.validate("long.json"),
                    "long.json: stages has 10001 stages, more than remat handles (10000): the "
                    "optimal solver's tables grow as the square of the number of stages; group "
                    "layers into fewer stages");
  // Every algorithm refuses it before allocating anything that grows with it.
  for (const Algorithm algorithm : all_algorithms())
    CHECK_THROWS_WITH(solve(chain, SolveOptions(1000).algorithm(algorithm)),
                      Catch::StartsWith("chain 'uniform-10001': stages has 10001 stages"));
  chain.stages.pop_back();
  chain.validate("long.json");
}

}  // namespace remat
