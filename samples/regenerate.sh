#!/usr/bin/env bash
# Regenerate the bundled sample run directories with the project's own runner and analysis
# (`make samples`). About two minutes on a 2-core CPU machine; about 15 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
MS=.venv/bin/meshscope
export OMP_NUM_THREADS=1

sample() {  # NAME, then `meshscope run` arguments
    local name=$1; shift
    rm -rf "samples/$name"
    $MS run "$@" --steps 6 --profile-steps 4-5 --seed 0 --out "samples/$name"
    $MS analyze --no-cache "samples/$name" > /dev/null
}

sample dp4-ddp                 --layout dp=4
sample dp2-pp2-1f1b            --layout dp=2,pp=2 --schedule 1f1b --microbatches 4
sample tp2-pp2-interleaved     --layout tp=2,pp=2 --schedule interleaved-1f1b --microbatches 4
sample dp2-ep2-moe             --layout dp=2,ep=2 --model tiny-moe
sample dp2-pp2-slow-rank1      --layout dp=2,pp=2 --schedule 1f1b --microbatches 4 \
                               --inject slow-rank=1:20
du -sh samples
