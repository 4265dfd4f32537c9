#!/usr/bin/env bash
# Regenerates the pictures in docs/img/ from the built remat (build/bin/remat):
#   bash scripts/make_docs_pictures.sh
# schedule and tradeoff: the resnet50 example chain (examples/chains/resnet50-synthetic.json);
# profile: the built-in convnet-deep, profiled on this machine's CPU (batch 8, 64x64).
set -euo pipefail
cd "$(dirname "$0")/.."
remat=${REMAT:-build/bin/remat}
[ -x "$remat" ] || { echo "build remat first: bash scripts/run.sh demo" >&2; exit 2; }
chain=examples/chains/resnet50-synthetic.json
"$remat" schedule --chain "$chain" --budget 40% --plot docs/img/schedule-resnet50.svg >/dev/null
"$remat" tradeoff --chain "$chain" --points 30 --plot docs/img/tradeoff-resnet50.svg >/dev/null
"$remat" profile --model convnet-deep --batch 8 --image 64 --plot docs/img/profile-convnet-deep.svg \
  >/dev/null 2>&1
if command -v rsvg-convert >/dev/null; then
  for svg in docs/img/*.svg; do rsvg-convert -w 1200 "$svg" -o "${svg%.svg}.png"; done
fi
ls -l docs/img
