#!/bin/sh
# Starts the native worker beside this script with its own libraries: through the bundle's own
# loader where it has one (a cross-built bundle carries the glibc it was linked against, so it
# runs on a board with an older glibc, and on Android, which has none: adb's shell user runs it
# from /data/local/tmp), else through the system's. EDGEBENCH_EXEC_PREFIX goes in front (the
# arm64 lab's qemu, where no binfmt_misc runs aarch64 programs). The worker replaces this shell.
here=${0%/*}
case $here in /*) ;; *) here=$(pwd)/$here ;; esac
if [ -f "$here/lib/ld-linux-aarch64.so.1" ]; then
    exec ${EDGEBENCH_EXEC_PREFIX:-} "$here/lib/ld-linux-aarch64.so.1" --library-path "$here/lib" "$here/edgebench-worker" "$@"
fi
exec ${EDGEBENCH_EXEC_PREFIX:-} "$here/edgebench-worker" "$@"
