# shellcheck shell=bash
# Sourced by the scripts that make virtual environments (run.sh, torch-check.sh): packages from
# PyPI are installed by uv (a pinned release from PyPI, in its own environment under
# ~/.cache/remat/), which downloads a requirement set's wheels in parallel and unpacks them
# faster than pip: PyTorch 2.11's environment in 15 s against pip's 68 s on the development
# machine (2026-12-01), the larger share of a fresh machine's time on a slow day
# (docs/building.md, "How long `test` takes"). `REMAT_UV=0`, or a machine where uv cannot be
# installed, uses pip. The Python package itself is still built by pip (`pip install .`).
#   remat_pip_install PYTHON ARG...   installs ARG... (pip install's requirements and options:
#                                     -r FILE, --no-deps, specifiers) into PYTHON's environment
# uv reads no pip settings: pip's certificate bundle (PIP_CERT), timeout (PIP_DEFAULT_TIMEOUT)
# and a folder of local wheels (PIP_FIND_LINKS) are passed on to it (SSL_CERT_FILE,
# UV_HTTP_TIMEOUT, UV_FIND_LINKS). It keeps no cache (--no-cache), as pip kept none of the
# wheels here: disk space is what docs/building.md says.
remat_uv_version=0.13.9

# Prints the path of uv, installing it first where needed; fails where it cannot.
remat_uv() {
  local home=${XDG_CACHE_HOME:-$HOME/.cache}/remat/uv-$remat_uv_version
  # Made once, under a lock: run.sh's background environments may ask for it at once.
  mkdir -p "$(dirname "$home")"
  (
    flock 9
    [ -x "$home/bin/uv" ] && exit 0
    rm -rf "$home"
    { python3 -m venv "$home" && "$home/bin/python" -m pip install -q "uv==$remat_uv_version"; } >&2 ||
      { rm -rf "$home"; exit 1; }
  ) 9> "$home.lock" || return 1
  echo "$home/bin/uv"
}

remat_pip_install() {
  local python=$1 uv
  shift
  if [ "${REMAT_UV:-1}" != 0 ] && uv=$(remat_uv); then
    local settings=()
    [ -z "${SSL_CERT_FILE:-}" ] && [ -n "${PIP_CERT:-}" ] && settings+=("SSL_CERT_FILE=$PIP_CERT")
    [ -z "${UV_HTTP_TIMEOUT:-}" ] && [ -n "${PIP_DEFAULT_TIMEOUT:-}" ] &&
      settings+=("UV_HTTP_TIMEOUT=$PIP_DEFAULT_TIMEOUT")
    [ -z "${UV_FIND_LINKS:-}" ] && [ -d "${PIP_FIND_LINKS:-}" ] &&
      settings+=("UV_FIND_LINKS=$PIP_FIND_LINKS")
    env ${settings[@]+"${settings[@]}"} "$uv" pip install -q --no-cache --python "$python" "$@"
  else
    "$python" -m pip install -q "$@"
  fi
}
