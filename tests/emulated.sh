#!/usr/bin/env bash
# The kernel, quantization and compiled-path tests on an emulated CPU with AVX2 and nothing above it
# (qemu-user's Haswell model: no AVX-512, no AVX-VNNI, no AMX), whatever this machine's CPU is.
#
# Why: a forced profile (TS_LLM_CPU_PROFILE=avx2) chooses what we build, but the host still runs any
# instruction it has, so code that reaches a process beyond its profile (a test that loaded AVX-VNNI
# kernels, issue 57) passes on a VNNI host and dies with SIGILL on Zen 3. Under the emulator such an
# instruction is an illegal instruction on every host.
#
# The probe reads /proc/cpuinfo, which qemu-user passes through from the host, so the avx2 profile is
# forced (ATen's CPUID probe sees the emulated CPU: both say avx2). Child processes (the compiler, a
# test's subprocess) run natively, unemulated. Needs qemu-x86_64 (Debian's qemu-user, 7.2 or later:
# AVX2 under TCG; installed here when missing and run as root). Run by test.sh on x86-64 machines above
# avx2; alone: tests/emulated.sh [pytest args] (its time: README, "Two commands").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -m)" != x86_64 ]; then
  echo "emulated.sh: not an x86-64 machine: the emulated AVX2 pass is for x86-64" >&2
  exit 2
fi
if ! command -v qemu-x86_64 >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "emulated.sh: installing Debian's qemu-user (qemu-x86_64)"
  (apt-get update -qq && apt-get install -y -qq qemu-user) >/dev/null
fi
if ! command -v qemu-x86_64 >/dev/null; then
  echo "emulated.sh: qemu-x86_64 not found: install Debian's qemu-user (apt-get install qemu-user), 7.2 or later" >&2
  exit 2
fi
eval "$(TS_LLM_CPU_PROFILE=avx2 .venv/bin/python -m handler.engine.platform --exports)"
# Inductor's cache is the one the native passes filled: a build keyed so that another profile's
# code is found here would be caught too
start=$SECONDS
set +e
qemu-x86_64 -cpu Haswell .venv/bin/python -m pytest -p no:cacheprovider "$@" \
  tests/engine/kernels tests/engine/quant tests/engine/compiled 2> >(grep -v "TCG doesn't support" >&2)
status=$?
set -e
echo "emulated.sh: AVX2-only emulated pass (qemu-x86_64 -cpu Haswell) took $((SECONDS - start)) s"
exit $status
