#!/usr/bin/env bash
# Installs every dependency of specmoe from Debian 12 packages (run as root, or with sudo).
#   compiler and tools: build-essential pkg-config clang (libFuzzer for `make fuzz`)
#   libraries: OpenBLAS (OpenMP build), LAPACKE, zlib, cJSON, Criterion
#   physics: MuJoCo 2.2.2 (libmujoco-dev) and its sample models (libmujoco-samples)
#   data: dataset-fashion-mnist (IDX .gz files under /usr/share/datasets/fashion-mnist)
#   tools: python3-torch + numpy (reference tensors, PyTorch peer benchmark, safetensors interop), gnuplot
#   multi-process runs: OpenMPI (openmpi-bin: mpirun; libopenmpi-dev: mpicc, which the Makefile detects)
# Already-installed packages are skipped, so a second run costs a few seconds.
set -euo pipefail
pkgs=(build-essential pkg-config clang libopenblas-openmp-dev liblapacke-dev zlib1g-dev libcjson-dev
      libcriterion-dev libmujoco-dev libmujoco-samples dataset-fashion-mnist python3 python3-numpy python3-torch gnuplot-nox
      openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    echo "setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present" >&2
