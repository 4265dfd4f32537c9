# Shared by scripts/run.sh and scripts/torch-free-checks.sh (sourced, from the clone's root):
#   step TITLE                      prints "== [XmYs] TITLE", the time since REMAT_STARTED (and
#                                   appends it to the run's record, where the caller keeps one:
#                                   remat_record)
#   passed_key PATH...              the key of those committed paths and the compilers, or ""
#                                   where the tree has uncommitted changes
#   unless_passed CHECK KEY TITLE COMMAND...
#                                   says so where CHECK passed on this machine for KEY; else
#                                   runs COMMAND under the step TITLE and records its pass
#   remat_ccache_misses LOG         appends to the run's record the sources whose compilation
#                                   missed ccache, read from ccache's LOG (CCACHE_LOGFILE)
#   remat_below LOG COMMAND...      starts COMMAND in the background, its output into LOG, in a
#                                   session of its own at the lowest priority (its scheduling
#                                   group at nice 19 too); $! is its process id (the session's),
#                                   as after `&`
#
# Checks whose outcome committed files decide alone, the same inputs on every run (the fuzz
# targets' committed inputs, each run once; the mutation check's `git archive HEAD`), are not
# run again where those files passed them on this machine with the same compilers: CI, after a
# session that ran them (docs/building.md, "How long `test` takes"). A clone with uncommitted
# changes runs them; so does REMAT_RECHECK=1. REMAT_CLEAN_TREE (1 or 0), where set, says
# whether the tree was clean when the run began (scripts/run.sh sets it for the checks it
# starts in the background, while its builds add ignored files).
export REMAT_STARTED=${REMAT_STARTED:-$(date +%s)}
step() {
  local elapsed=$(( $(date +%s) - REMAT_STARTED ))
  echo "== [$(( elapsed / 60 ))m$(( elapsed % 60 ))s] $*"
  [ -z "${remat_record_file:-}" ] ||
    echo "== [$(( elapsed / 60 ))m$(( elapsed % 60 ))s] $*" >> "$remat_record_file" 2>/dev/null || true
}

# remat_record MODE: keeps this run's steps, as step prints them, in a file of its own outside
# the clone (~/.cache/remat/runs/, the last 30 runs), after a header saying which commit ran
# where, with which locale (ccache hashes it with every compilation), PATH (which decides the
# compilers found, and so the folders ccache hashes) and ccache folder: what a
# later look can read of a run whose output was not kept (CI's, when it passes). The variable
# is the calling shell's own: the scripts it starts keep no record of theirs.
remat_record() {
  local dir=${XDG_CACHE_HOME:-$HOME/.cache}/remat/runs
  mkdir -p "$dir" 2>/dev/null || return 0
  remat_record_file=$dir/$(date -u +%Y%m%d-%H%M%S)-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)-$1.log
  {
    echo "run.sh $1 at $(git rev-parse HEAD 2>/dev/null || echo '?') (tree clean: $REMAT_CLEAN_TREE)"
    echo "in $(pwd -P) as $(id -un 2>/dev/null || echo '?'), started $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "locale: LANG=${LANG-(unset)} LC_ALL=${LC_ALL-(unset)} LC_CTYPE=${LC_CTYPE-(unset)} LC_MESSAGES=${LC_MESSAGES-(unset)}"
    echo "PATH: ${PATH-(unset)}"
    echo "ccache folder: ${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/remat/ccache}"
  } > "$remat_record_file" 2>/dev/null || { remat_record_file=; return 0; }
  ls -1t "$dir" | tail -n +31 | while read -r old; do rm -f "$dir/$old"; done
}

# The sources that missed, at most 60 of them: printed, and kept in the record where there is one
# (CI's output of a run that passed may not be kept; its record is, on the machine it ran on).
# ccache logs a source under its base folder relative to the compilation's working folder, which
# is prefixed (build-asan/../cli/main.cpp says which build); paths inside the clone are given
# relative to it.
remat_ccache_misses() {
  [ -f "$1" ] || return 0
  local missed lines
  missed=$(awk '/ Working directory: /{cwd[$2] = $NF}
                / Source file: /{source[$2] = ($NF ~ /^\// ? $NF : cwd[$2] "/" $NF)}
                / Result: cache_miss$/{print source[$2]}' "$1" |
             sed "s|^$(pwd -P)/||" | sort -u)
  lines=$(echo "ccache missed $(printf '%s' "$missed" | grep -c . || true) sources:"
          printf '%s\n' "$missed" | head -n 60 | sed 's/^/  /')
  printf '%s\n' "$lines"
  [ -z "${remat_record_file:-}" ] || printf '%s\n' "$lines" >> "$remat_record_file" 2>/dev/null || true
}

passed_dir=${XDG_CACHE_HOME:-$HOME/.cache}/remat/passed
if [ -z "${REMAT_CLEAN_TREE:-}" ]; then
  REMAT_CLEAN_TREE=0
  [ -z "$(git status --porcelain 2>/dev/null || echo dirty)" ] && REMAT_CLEAN_TREE=1
fi
export REMAT_CLEAN_TREE
passed_key() {
  [ "$REMAT_CLEAN_TREE" = 1 ] || return 0
  { git rev-parse "${@/#/HEAD:}"; g++ --version | head -1; clang++ --version 2>/dev/null | head -1; } |
    sha256sum | cut -c1-16
}
unless_passed() {
  local check=$1 key=$2 title=$3
  shift 3
  if [ "${REMAT_RECHECK:-0}" != 1 ] && [ -n "$key" ] && [ -f "$passed_dir/$check-$key" ]; then
    step "$check: passed on this machine for these files, $(cat "$passed_dir/$check-$key"); not run again (REMAT_RECHECK=1 runs it)"
    return 0
  fi
  step "$title"
  "$@"
  [ -z "$key" ] || { mkdir -p "$passed_dir" && date -u '+%Y-%m-%d %H:%M UTC' > "$passed_dir/$check-$key"; }
}

# Where the kernel groups processes by session for scheduling (autogroup), a nice value counts
# within its group only: a session of its own would get half the machine whatever its nice, so
# its group is made nice too, by the session itself once it has one (written from the caller
# through /proc/$!/autogroup, the value could reach the caller's group before the child's
# setsid, and did: run.sh ran at nice 19 beside its checks until 2026-12-01). At the lowest
# priority the checks take what the test run leaves: a fresh machine's `test` took 51 min 34 s
# so, against 57 min 8 s with the checks as the test run's equal (2026-12-01, docs/building.md).
# tests/tools/test_background.py checks both groups' nice values.
remat_below() {
  local log=$1
  shift
  # setsid from a process that does not lead its group: no fork, $! is the session's.
  setsid bash -c '{ echo 19 > /proc/self/autogroup; } 2>/dev/null; exec nice -n 19 "$@"' \
    remat_below "$@" > "$log" 2>&1 &
}
