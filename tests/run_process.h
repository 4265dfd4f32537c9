#pragma once
// Running a program as a user would: a fresh process, its standard output and error captured,
// its exit code. The CLI tests run the built `remat` so; tests that need a process of their own
// (tests/models/hostile_files.h) run their own test program so.

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace remat::test {

struct RunResult {
  int exit_code = -1;  // 128 + signal number when the process was killed
  std::string out;
  std::string err;
  std::string command;  // for failure messages
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Runs `executable` with `args`, stdin from /dev/null, stdout and stderr captured, with `env`
/// ("NAME=VALUE") added to the environment (ahead of the inherited entries, so they win).
/// `stdout_to` and `stderr_to`, when given, are where standard output and error go instead
/// (/dev/full). `name` stands for the executable in RunResult::command.
inline RunResult run_process(const std::string& executable, const std::string& name,
                             const std::vector<std::string>& args,
                             const std::vector<std::string>& env = {},
                             const std::string& stdout_to = "", const std::string& stderr_to = "") {
  char scratch_name[] = "/tmp/remat-run-XXXXXX";
  REQUIRE(mkdtemp(scratch_name) != nullptr);
  const std::string scratch = scratch_name;
  const std::string out_path = stdout_to.empty() ? scratch + "/stdout" : stdout_to;
  const std::string err_path = stderr_to.empty() ? scratch + "/stderr" : stderr_to;

  RunResult result;
  result.command = name;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(executable.c_str()));
  for (const auto& arg : args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
    result.command += " '" + arg + "'";
  }
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& entry : env) {
    envp.push_back(const_cast<char*>(entry.c_str()));
    result.command = entry + " " + result.command;
  }
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(nullptr);

  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    const int in_fd = open("/dev/null", O_RDONLY);
    const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);  // or /dev/full
    const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);  // or /dev/full
    if (in_fd < 0 || out_fd < 0 || err_fd < 0) _exit(126);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    execve(executable.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  int status = 0;
  pid_t waited;
  do {
    waited = waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  REQUIRE(waited == pid);
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  if (stdout_to.empty()) {
    result.out = read_file(out_path);
    std::remove(out_path.c_str());
  }
  if (stderr_to.empty()) {
    result.err = read_file(err_path);
    std::remove(err_path.c_str());
  }
  rmdir(scratch.c_str());
  return result;
}

inline std::string describe(const RunResult& run) {
  return run.command + "\nexit code " + std::to_string(run.exit_code) + "\nstdout:\n" + run.out +
         "\nstderr:\n" + run.err;
}

}  // namespace remat::test
