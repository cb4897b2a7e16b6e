# facts.py for a device with no Python: the same JSON, the Python fields null.
# Usage: facts.sh WORKDIR
mkdir -p "$1" && cd "$1" || exit 1
workdir=$(pwd)
avail=null; total=null
while read -r key value _; do
    case $key in MemAvailable:) avail=$(kb_to_bytes "$value") ;; MemTotal:) total=$(kb_to_bytes "$value") ;; esac
done < /proc/meminfo
limit=null; usage=null
while IFS=: read -r _ controllers path; do
    for base in "/sys/fs/cgroup/memory$path" "/sys/fs/cgroup$path"; do
        for pair in "memory.limit_in_bytes memory.usage_in_bytes" "memory.max memory.current"; do
            set -- $pair
            [ -r "$base/$1" ] && [ -r "$base/$2" ] || continue
            read -r l < "$base/$1"
            case $l in max | ???????????????????*) continue ;; esac  # none, or the kernel's 2^63 "unlimited"
            limit=$l; read -r usage < "$base/$2"
        done
    done
done < /proc/self/cgroup
set -- $(df -Pk "$workdir" | tail -n 1)
free=$(kb_to_bytes "$4")
printf '{"python": null, "executable": null, "arch": %s, "emulated": false, "emulator": null, ' "$(json_text "$(uname -m)")"
printf '"torch": null, "executorch": null, "onnxruntime_training": null, "psutil": null, "numpy": null, '
printf '"mem_available_bytes": %s, "mem_total_bytes": %s, "cgroup_limit_bytes": %s, "cgroup_usage_bytes": %s, ' \
    "$avail" "$total" "$limit" "$usage"
printf '"disk_free_bytes": %s, "workdir": %s}\n' "$free" "$(json_text "$workdir")"
