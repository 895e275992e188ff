#!/usr/bin/env bash
# The learner on a machine with a GPU and many cores, in one prepared run: learner_roofline.py with
# the learner on CUDA (SB3 beside it on the same device), then on 1, 16 and 4 CPU threads.
# Needs torch and the project's pure-Python dependencies importable (pydantic, gymnasium, minatar,
# stable-baselines3 for the SB3 column). Writes OUT/{cuda,cpu_t1,cpu_t16,cpu_t4}.{json,md}.
#
#     OUT=benchmarks/results/device benchmarks/device_learner.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/device}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
"$PY" benchmarks/learner_roofline.py --device cuda --updates 50 --peers-python "$PY" --out "$OUT/cuda"
for threads in 1 16 4; do
    "$PY" benchmarks/learner_roofline.py --cases sac_256 ppo_minatar dqn_minatar --threads "$threads" --updates 20 \
        --peers-python "$PY" --out "$OUT/cpu_t$threads"
done
