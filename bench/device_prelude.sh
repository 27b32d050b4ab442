# Sourced by the device-call scripts (bench/gpu_session_*.sh): the wheels and carried site on the
# path, $OUT, and a deadline with `left` (seconds to it) and `cap N` (N, or what is left).
# Needs .whl (fastapi, uvicorn, pydantic… for Python 3.12) and .carry/site (bash bench/make_carry.sh --site-only).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/.carry/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEADLINE=${DEADLINE:-550}
left() { echo $(( DEADLINE - SECONDS )); }
cap() { local want=$1 l; l=$(left); [ "$l" -lt "$want" ] && want=$l; echo $(( want > 0 ? want : 1 )); }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/device.txt"
