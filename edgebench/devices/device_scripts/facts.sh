# shellcheck shell=sh
# facts.py for a device with no Python: the same JSON, the Python fields null.
# Usage: facts.sh WORKDIR [ROOT] (/proc and /sys read under ROOT, `/` on a device)
plus_text() {  # $1 + $2 as text, nine digits at a time (Android's mksh has 32-bit integers)
    hi=0; lo=0
    for n in "$1" "$2"; do
        case $n in ??????????*) h=${n%?????????}; n=${n#"$h"} ;; *) h=0 ;; esac
        while :; do case $n in 0?*) n=${n#0} ;; *) break ;; esac; done  # not octal
        hi=$((hi + h)); lo=$((lo + n))
    done
    hi=$((hi + lo / 1000000000)); lo=$((lo % 1000000000))
    if [ "$hi" -gt 0 ]; then printf '%d%09d' "$hi" "$lo"; else printf '%d' "$lo"; fi
}
page_cache() {  # facts.py's page_cache of memory.stat $1: inactive + active file (v1 total_*), else cache; file
    inactive=""; active=""; total=""; file=""; inactive2=""; active2=""
    while read -r key value _; do
        case $value in '' | *[!0-9]*) continue ;; esac
        case $key in total_inactive_file) inactive=$value ;; total_active_file) active=$value ;;
            inactive_file) inactive2=$value ;; active_file) active2=$value ;;
            total_cache) total=$value ;; file) file=$value ;; esac
    done < "$1"
    if [ -n "$total" ]; then  # v1: its hierarchical total_* figures
        if [ -n "$inactive" ] && [ -n "$active" ]; then plus_text "$inactive" "$active"; else printf '%s' "$total"; fi
    elif [ -n "$inactive2" ] && [ -n "$active2" ]; then plus_text "$inactive2" "$active2"
    elif [ -n "$file" ]; then printf '%s' "$file"
    else printf null; fi
}
workdir=$(abs_dir "$1")
mkdir -p "$workdir" && cd "$workdir" || exit 1
R=${2:-/}; R=${R%/}
avail=null; total=null
while read -r key value _; do
    case $key in MemAvailable:) avail=$(kb_to_bytes "$value") ;; MemTotal:) total=$(kb_to_bytes "$value") ;; esac
done < "$R/proc/meminfo"
limit=null; usage=null; cache=null
while IFS=: read -r _ controllers path; do
    case ,$controllers, in *,memory,*) base="$R/sys/fs/cgroup/memory$path" ;; *) base="$R/sys/fs/cgroup$path" ;; esac
    for pair in "memory.limit_in_bytes memory.usage_in_bytes" "memory.max memory.current"; do
        lim=${pair% *}; use=${pair#* }
        l=""; u=""
        { read -r l < "$base/$lim"; read -r u < "$base/$use"; } 2>/dev/null
        case $l$u in *[!0-9]*) continue ;; esac  # "max" (no limit), missing, garbage
        case $l in '' | ???????????????????*) continue ;; esac  # none, or the kernel's 2^63 "unlimited"
        case $u in '') continue ;; esac
        limit=$l; usage=$u; cache=null
        [ -r "$base/memory.stat" ] && cache=$(page_cache "$base/memory.stat")
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
printf '"cgroup_cache_bytes": %s, ' "$cache"
printf '"disk_free_bytes": %s, "workdir": %s}\n' "$free" "$(json_text "$workdir")"
