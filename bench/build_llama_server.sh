#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp vendored in llama-cpp-python's sdist, so the
# server and the Python binding the benches compare against are the same source. Idempotent.
#
#   bash bench/build_llama_server.sh            # -> ~/.cache/edgellama/llama-server/build/bin/llama-server
#   LLAMA_CPP_SRC=/path/to/llama.cpp bash bench/build_llama_server.sh
#
# Portable x86-64-v3 flags as tests/llamacpp_peer.py's site (GGML_NATIVE off, AVX2/FMA/F16C/BMI2 by
# name). Offline: no curl (no -hf/-mu downloads), no OpenSSL, and no web UI download
# (LLAMA_USE_PREBUILT_UI=OFF: the server then embeds no UI assets; the API endpoints are unaffected).
# About 10 minutes on 2 cores, niced.
set -euo pipefail

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${EDGELLAMA_CACHE:-$HOME/.cache/edgellama}
SRC=${LLAMA_CPP_SRC:-$CACHE/llama-cpp-python-$VERSION/llama_cpp_python-$VERSION/vendor/llama.cpp}
OUT=${LLAMA_SERVER_DIR:-$CACHE/llama-server}
BIN=$OUT/build/bin/llama-server

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "no llama.cpp source at $SRC: unpack llama-cpp-python $VERSION's sdist there, e.g." >&2
    echo "    pip download --no-binary :all: --no-deps -d $CACHE/llama-cpp-python-$VERSION llama-cpp-python==$VERSION" >&2
    echo "    tar -xzf $CACHE/llama-cpp-python-$VERSION/llama_cpp_python-$VERSION.tar.gz -C $CACHE/llama-cpp-python-$VERSION" >&2
    echo "or set LLAMA_CPP_SRC to a llama.cpp checkout" >&2
    exit 3
fi
command -v cmake >/dev/null || { echo "cmake not found (apt-get install cmake)" >&2; exit 3; }
command -v g++ >/dev/null || { echo "g++ not found (apt-get install g++)" >&2; exit 3; }

mkdir -p "$OUT"
nice -n 10 cmake -S "$SRC" -B "$OUT/build" \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake-configure.log"
nice -n 10 cmake --build "$OUT/build" --target llama-server -j"${JOBS:-$(nproc)}" >"$OUT/cmake-build.log"
"$BIN" --version >&2 || true
echo "$BIN"
