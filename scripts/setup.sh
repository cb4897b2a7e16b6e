#!/usr/bin/env bash
# Sets up edgebench on a fresh machine: system tools the tests and the lab need
# (sshd, adb, tmux, Chromium, C++ compilers), then a virtual environment in .venv with everything
# pinned, then the native ExecuTorch worker for this host.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v adb >/dev/null 2>&1 || need+=(adb)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# the HTML report's browser test draws it in headless Chromium (tests/test_report_browser.py)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the shells and tools of a device with no Python, and shellcheck: the device scripts' parity test
# runs their shell twins under each (tests/test_device_script_parity.py)
for tool in dash busybox mksh toybox shellcheck; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
# the arm64 lab's aarch64 binutils (unpacked from Debian's package into its cache) link it
ldconfig -p 2>/dev/null | grep -q 'libjansson.so.4 ' || need+=(libjansson4)
# the native ExecuTorch worker: built here (g++) and cross-built for aarch64 boards
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "setup: installing ${need[*]} (apt)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        echo "setup: ${need[*]} missing; the lab and its tests need them: sudo apt-get install ${need[*]}" >&2
    fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PYTHON" -m venv .venv
fi
# torch first and pinned, so nothing else can pull another (CUDA) build.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e '.[all]'
.venv/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
# The native ExecuTorch worker for this host (--runtime native, the default where it is built).
.venv/bin/python -m edgebench.native.build
echo "setup: ready (.venv/bin/edgebench)"
