# shellcheck shell=sh
# facts.py for a device with no Python: the same JSON, the Python fields null.
# Usage: facts.sh WORKDIR [ROOT] (/proc and /sys read under ROOT, `/` on a device)
workdir=$(abs_dir "$1")
mkdir -p "$workdir" && cd "$workdir" || exit 1
R=${2:-/}; R=${R%/}
avail=null; total=null
while read -r key value _; do
    case $key in MemAvailable:) avail=$(kb_to_bytes "$value") ;; MemTotal:) total=$(kb_to_bytes "$value") ;; esac
done < "$R/proc/meminfo"
limit=null; usage=null
while IFS=: read -r _ controllers path; do
    case ,$controllers, in *,memory,*) base="$R/sys/fs/cgroup/memory$path" ;; *) base="$R/sys/fs/cgroup$path" ;; esac
    for pair in "memory.limit_in_bytes memory.usage_in_bytes" "memory.max memory.current"; do
        lim=${pair% *}; use=${pair#* }
        l=""; u=""
        { read -r l < "$base/$lim"; read -r u < "$base/$use"; } 2>/dev/null
        case $l$u in *[!0-9]*) continue ;; esac  # "max" (no limit), missing, garbage
        case $l in '' | ???????????????????*) continue ;; esac  # none, or the kernel's 2^63 "unlimited"
        case $u in '') continue ;; esac
        limit=$l; usage=$u
    done
done < "$R/proc/self/cgroup"
# what shutil.disk_usage calls free: blocks available to an unprivileged user x their size (toybox's
# df shows root the reserved blocks too)
free=$(stat -f -c '%a %S' "$workdir" | { read -r blocks size; times_text "$blocks" "$size"; })
emulator=null; emulated=false  # the arm64 lab's python says so (EDGEBENCH_EMULATOR), as facts.py reads it
if [ -n "${EDGEBENCH_EMULATOR:-}" ]; then emulator=$(json_text "$EDGEBENCH_EMULATOR"); emulated=true; fi
printf '{"python": null, "executable": null, "arch": %s, "emulated": %s, "emulator": %s, ' \
    "$(json_text "$(uname -m)")" "$emulated" "$emulator"
printf '"torch": null, "executorch": null, "onnxruntime_training": null, "psutil": null, "numpy": null, '
printf '"mem_available_bytes": %s, "mem_total_bytes": %s, "cgroup_limit_bytes": %s, "cgroup_usage_bytes": %s, ' \
    "$avail" "$total" "$limit" "$usage"
printf '"disk_free_bytes": %s, "workdir": %s}\n' "$free" "$(json_text "$workdir")"
