# Sourced by the recipe scripts (examples/*.sh) once they are in the checkout's root: the sleuth command and its
# Python (SLEUTH, default the checkout's .venv/bin/sleuth, else `sleuth`), EVAL_LIMIT (default 100), EXTRA (the
# words of SLEUTH_SET) and DTYPE (auto: bfloat16 on a GPU or on a CPU with native bf16 arithmetic, added to EXTRA
# as model.dtype; empty: the config's).
if [ -z "${SLEUTH:-}" ]; then
  if [ -x .venv/bin/sleuth ]; then SLEUTH=.venv/bin/sleuth; else SLEUTH=sleuth; fi
fi
PYTHON=$(dirname "$(command -v "$SLEUTH")")/python
[ -x "$PYTHON" ] || PYTHON=python3
EVAL_LIMIT=${EVAL_LIMIT:-100}
read -r -a EXTRA <<< "${SLEUTH_SET:-}"
DTYPE=${DTYPE:-auto}
if [ "$DTYPE" = auto ]; then
  if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
     || grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then DTYPE=bfloat16; else DTYPE=; fi
fi
if [ -n "$DTYPE" ]; then EXTRA+=(--set "model.dtype=$DTYPE"); fi
