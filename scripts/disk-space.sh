# shellcheck shell=bash
# Sourced by scripts/run.sh: the disk space a run needs, checked before it makes anything, so
# that a run that would fill the disk stops at once with a message instead of failing half an
# hour later in whatever step found the disk full. Tested by tests/tools/test_disk_space.py.
#
#   remat_will_take GB PATH WHAT   the run will write about GB at PATH (made or not yet), for WHAT
#   remat_check_disk               for each filesystem written to: a line with its free space and
#                                  the need (what was named, and 2 GB to spare); returns 1, with
#                                  a message on stderr, where it is short
#   remat_free_gb PATH             the space left on PATH's filesystem, in whole GB (rounded down)
declare -A remat_needed_gb=() remat_needed_for=()

# remat_mount_point PATH: the mount point of the filesystem PATH is on, or will be on once made.
remat_mount_point() {
  local path=$1
  while [ ! -e "$path" ]; do path=$(dirname "$path"); done
  df -P "$path" | awk 'NR == 2 {print $NF}'
}

remat_free_gb() { df -Pk "$(remat_mount_point "$1")" | awk 'NR == 2 {print int($4 / 1048576)}'; }

remat_will_take() {
  local mount
  mount=$(remat_mount_point "$2")
  remat_needed_gb[$mount]=$(( ${remat_needed_gb[$mount]:-0} + $1 ))
  remat_needed_for[$mount]+="${remat_needed_for[$mount]:+, }$3 $1 GB"
}

remat_check_disk() {
  local mount free needed status=0
  for mount in "${!remat_needed_gb[@]}"; do
    free=$(remat_free_gb "$mount")
    needed=$(( remat_needed_gb[$mount] + 2 ))
    echo "disk: $free GB free on $mount, about $needed GB needed (${remat_needed_for[$mount]}, 2 to spare)"
    if [ "$free" -lt "$needed" ]; then
      echo "remat: not enough disk space on $mount: $free GB free, about $needed GB needed." \
        "Free some (the environments of other PyTorch versions in ~/.cache/remat are made again" \
        "when needed), or set REMAT_VENV or XDG_CACHE_HOME to a folder on a larger disk." >&2
      status=1
    fi
  done
  return $status
}
