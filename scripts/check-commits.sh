#!/usr/bin/env bash
# Checks that commit messages follow the convention of CONTRIBUTING.md: a subject of at most
# 72 characters, and where there is more, a blank line after it. Every commit from the first
# that followed it (5e973c0) to HEAD is checked; the earlier ones stay as they were written.
#   bash scripts/check-commits.sh              those commits (scripts/run.sh test runs this)
#   bash scripts/check-commits.sh --message F  one message, in file F (a commit-msg hook:
#                                              git config core.hooksPath scripts/hooks)
# Exit status 0 when every message follows it, 1 when one does not (each named), 2 for a
# wrong call.
set -euo pipefail
cd "$(dirname "$0")/.."
first=5e973c0
limit=72
status=0
# check_message NAME: the message on standard input.
check_message() {
  local name=$1 subject second
  IFS= read -r subject || subject=""
  IFS= read -r second || second=""
  if [ -z "$subject" ]; then
    echo "$name: the subject is empty" >&2; status=1
  elif [ ${#subject} -gt $limit ]; then
    echo "$name: the subject has ${#subject} characters, more than $limit: $subject" >&2
    status=1
  fi
  if [ -n "$second" ]; then
    echo "$name: the second line is not blank (a subject, a blank line, then the body)" >&2
    status=1
  fi
}
case "${1:-}" in
  --message)
    [ $# -eq 2 ] && [ -f "$2" ] || { echo "usage: $0 [--message FILE]" >&2; exit 2; }
    # git's commit-msg hook: comments and trailing blank lines are stripped as git does.
    check_message "the commit message" < <(git stripspace --strip-comments < "$2")
    exit $status ;;
  "") ;;
  *) echo "usage: $0 [--message FILE]" >&2; exit 2 ;;
esac
if ! git rev-parse -q --verify "$first^{commit}" > /dev/null; then
  echo "remat: commit $first is not in this clone's history: nothing to check" >&2
  exit 0
fi
count=0
while read -r commit; do
  count=$((count + 1))
  check_message "commit ${commit:0:7}" < <(git log -1 --format=%B "$commit")
done < <(git rev-list "$first^..HEAD")
[ $status = 0 ] && echo "commit messages: $count checked, all follow CONTRIBUTING.md"
exit $status
