#!/usr/bin/env bash
# Regenerate the bundled sample run directories with the project's own runner and analysis.
set -euo pipefail
cd "$(dirname "$0")/.."
MS=.venv/bin/meshscope
rm -rf samples/dp2-pp2-1f1b
$MS run --layout dp=2,pp=2 --schedule 1f1b --microbatches 4 --steps 6 --seed 0 \
    --out samples/dp2-pp2-1f1b
$MS analyze samples/dp2-pp2-1f1b
