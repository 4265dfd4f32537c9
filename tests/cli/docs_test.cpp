// Runs every ```console example of docs/*.md and compares its output with the page.
// `$ ` starts a command (run by /bin/sh from the repository root with the built remat first
// on the PATH, stderr merged into stdout); the lines after it are its expected output, where
// `[...]` matches any text within a line and a line of just `[...]` any number of lines.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.h"

namespace {

// The commands that run in remat-torch (cli/cli.h's list).
constexpr const char* kTorchCommands[] = {"profile", "demo", "models", "train"};

struct Example {
  std::string file;
  int line = 0;
  std::string command;
  std::vector<std::string> expected;
};

std::vector<Example> console_examples(const std::string& file) {
  std::ifstream in(std::string(remat::test_paths::source_dir) + "/" + file);
  REQUIRE(in.good());
  std::vector<Example> out;
  bool inside = false;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!inside) {
      inside = line == "```console";
      continue;
    }
    if (line == "```") {
      inside = false;
    } else if (line.rfind("$ ", 0) == 0) {
      out.push_back({file, number, line.substr(2), {}});
    } else if (!out.empty()) {
      out.back().expected.push_back(line);
    }
  }
  return out;
}

std::vector<std::string> run(const std::string& command) {
  std::string executable = remat::test_paths::remat_executable;
  const std::string bin = executable.substr(0, executable.rfind('/'));
  const std::string shell = "cd '" + std::string(remat::test_paths::source_dir) + "' && PATH='" + bin +
                            "':\"$PATH\" && (" + command + ") 2>&1";
  FILE* pipe = popen(shell.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buffer[4096];
  for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
  pclose(pipe);
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Glob match with `[...]` as the only wildcard.
bool line_matches(const std::string& pattern, const std::string& text) {
  const std::string wildcard = "[...]";
  const auto star = pattern.find(wildcard);
  if (star == std::string::npos) return pattern == text;
  const std::string head = pattern.substr(0, star);
  const std::string tail = pattern.substr(star + wildcard.size());
  if (text.compare(0, head.size(), head) != 0) return false;
  for (std::size_t from = head.size(); from <= text.size(); ++from)
    if (line_matches(tail, text.substr(from))) return true;
  return false;
}

bool lines_match(const std::vector<std::string>& expected, std::size_t e,
                 const std::vector<std::string>& actual, std::size_t a) {
  if (e == expected.size()) return a == actual.size();
  if (expected[e] == "[...]") {
    for (std::size_t skip = a; skip <= actual.size(); ++skip)
      if (lines_match(expected, e + 1, actual, skip)) return true;
    return false;
  }
  return a < actual.size() && line_matches(expected[e], actual[a]) &&
         lines_match(expected, e + 1, actual, a + 1);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("the examples in docs/ print what the docs say", "[cli][docs]") {
  int examples = 0;
  // Every page: README.md and docs/*.md.
  std::vector<std::string> files{"README.md"};
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(remat::test_paths::source_dir) + "/docs"))
    if (entry.path().extension() == ".md")
      files.push_back("docs/" + entry.path().filename().string());
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    for (const Example& example : console_examples(file)) {
      // The LibTorch commands exist only in a build with LibTorch (not the sanitizer build).
      const bool needs_torch =
          std::any_of(std::begin(kTorchCommands), std::end(kTorchCommands), [&](const char* c) {
            return example.command.find(std::string("remat ") + c) != std::string::npos;
          });
      if (!REMAT_CLI_HAS_TORCH && needs_torch) continue;
      ++examples;
      const std::vector<std::string> actual = run(example.command);
      INFO(example.file << ":" << example.line << ": $ " << example.command << "\n--- expected\n"
                        << joined(example.expected) << "--- actual\n"
                        << joined(actual));
      CHECK(lines_match(example.expected, 0, actual, 0));
    }
  }
  CHECK(examples >= (REMAT_CLI_HAS_TORCH ? 18 : 11));  // without LibTorch: the solver's examples
}

TEST_CASE("the doc-example matcher can fail", "[cli][docs]") {
  CHECK(line_matches("solve time   [...] s", "solve time   0.017 s"));
  CHECK_FALSE(line_matches("solve time   [...] s", "solve time   0.017 ms"));
  CHECK(lines_match({"a", "[...]", "d"}, 0, {"a", "b", "c", "d"}, 0));
  CHECK_FALSE(lines_match({"a", "d"}, 0, {"a", "b", "d"}, 0));
  CHECK_FALSE(lines_match({"a"}, 0, {"a", "extra"}, 0));
}
