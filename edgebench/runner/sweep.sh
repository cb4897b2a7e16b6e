#!/bin/sh
# The sweep of a device with no Python (a phone over adb, a bare board): every
# SWEEP/specs/NNN-<run_id>.env in order, each run by the native ExecuTorch worker under this
# shell's supervision, into SWEEP/runs/<run_id>/ with the files the Python supervisor writes
# (meta.json, samples.jsonl, events.jsonl from the worker, result.json), and SWEEP/sweep.json.
#
#   sh sweep.sh SWEEP_DIR
#   sh sweep.sh --sample PID     one `readings` line and one sample line of every source, for PID
#
# It records raw readings only, the keys and units of edgebench/figures/readings.py (a test
# holds this script to that table and to the Python sampler on the same fixture trees): the
# host makes every figure from them, as it does for the Python supervisor's runs. result.json
# holds how the worker ended (`end`) and CPU snapshots before and after, not a status.
#
# POSIX sh with the tools toybox has (cat, date, sleep, sed, grep, tr, mv, rm, mkdir, kill,
# uname, tail, od): no awk, no Python. Arithmetic stays below 2^31 (Android's mksh has 32-bit
# integers): byte counts and counters read from the kernel are copied as text, kB are turned
# into bytes digit-wise, and timestamps are built from seconds and nanoseconds apart.
# EDGEBENCH_ROOT (default: none) is put before /proc and /sys paths, for fixture trees.
#
# Each .env file (written by the host, values shell-quoted) sets RUN_ID, SPEC_JSON (the spec
# file beside it), PROGRAM, WORKER (bundle folder), PLAN (plan folder), TICK_S (the sample
# interval, e.g. 0.05), MID_EVERY and SLOW_EVERY (ticks between reads of the CPU, memory and
# battery readings, and of the cgroup counters and temperatures: the Python sampler's intervals),
# TIMEOUT_S (whole seconds, 0: none) and POWER (battery: read the battery; none: no meter here).

set -u
R=${EDGEBENCH_ROOT:-}
GRACE_S=5
STOP=""
LOW_KB=""; USAGE=""; USED_AT_LOW=""; LIMIT=""  # the run's lowest MemAvailable (kB), the cgroup's usage then, its limit
HOST_OOM_WAIT_S=60  # the longest the next run waits for the memory a host-wide OOM took (as runner/sweep.py)
HOST_LOW_KB=65536  # MemAvailable below this: the device's RAM as a whole ran out (figures/status.py's 64 MiB)

json_text() {  # $1 as a JSON string literal, valid for any bytes: '"', '\' and every byte below 0x20 (and DEL)
    # escaped, UTF-8 kept, each byte that is not UTF-8 replaced by U+FFFD (as Python's "replace" decodes them).
    # Byte by byte from od (no process per byte); what is printed is one printf format: \ooo per byte kept.
    jf=""; jn=0; jlo=128; jhi=191; jseq=""  # jn: continuation bytes due, each from jlo to jhi
    for jb in $(printf '%s' "$1" | od -An -v -tu1); do
        if [ "$jn" -gt 0 ]; then
            if [ "$jb" -ge "$jlo" ] && [ "$jb" -le "$jhi" ]; then
                jseq="$jseq\\$((jb / 64))$((jb / 8 % 8))$((jb % 8))"; jn=$((jn - 1)); jlo=128; jhi=191
                [ "$jn" = 0 ] && jf=$jf$jseq
                continue
            fi
            jf=$jf'\\ufffd'; jn=0; jlo=128; jhi=191  # a sequence cut short: this byte starts afresh
        fi
        if [ "$jb" -lt 32 ] || [ "$jb" = 127 ]; then
            case $((jb % 16)) in
                10) jx=a ;; 11) jx=b ;; 12) jx=c ;; 13) jx=d ;; 14) jx=e ;; 15) jx=f ;; *) jx=$((jb % 16)) ;;
            esac
            jf="$jf\\\\u00$((jb / 16))$jx"
        elif [ "$jb" = 34 ]; then jf=$jf'\\"'
        elif [ "$jb" = 92 ]; then jf="$jf\\\\\\\\"
        elif [ "$jb" = 37 ]; then jf=$jf'%%'
        elif [ "$jb" -lt 128 ]; then jf="$jf\\$((jb / 64))$((jb / 8 % 8))$((jb % 8))"
        else  # a lead byte: how many continuation bytes follow, and their range (no overlong form, no surrogate)
            jseq="\\$((jb / 64))$((jb / 8 % 8))$((jb % 8))"
            if [ "$jb" -ge 194 ] && [ "$jb" -le 223 ]; then jn=1
            elif [ "$jb" -ge 224 ] && [ "$jb" -le 239 ]; then
                jn=2; [ "$jb" = 224 ] && jlo=160; [ "$jb" = 237 ] && jhi=159
            elif [ "$jb" -ge 240 ] && [ "$jb" -le 244 ]; then
                jn=3; [ "$jb" = 240 ] && jlo=144; [ "$jb" = 244 ] && jhi=143
            else jf=$jf'\\ufffd'
            fi
        fi
    done
    [ "$jn" -gt 0 ] && jf=$jf'\\ufffd'
    # shellcheck disable=SC2059  # the format is built above: every byte escaped, '%' doubled
    printf "\"$jf\""
}

json_or_null() {  # $1 as a JSON string literal, or null when empty
    if [ -n "$1" ]; then json_text "$1"; else printf null; fi
}

no_zeros() {  # a decimal without leading zeros (a shell reads 0123 as octal)
    n=$1
    while :; do case $n in 0?*) n=${n#0} ;; *) break ;; esac; done
    printf '%s' "${n:-0}"
}

is_int() {  # $1 is a (possibly negative) decimal integer
    case ${1#-} in "" | *[!0-9]*) return 1 ;; esac
}

key_name() {  # a sensor's name as a key part, as edgebench.telemetry.sysfs.key_name makes it
    k=$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9\n' '_' | sed 's/__*/_/g; s/^_//; s/_$//')
    printf '%s' "${k:-unnamed}"
}

rd() {  # V: the first line of file $1, or empty (read by the shell itself: no process started)
    V=""
    { read -r V < "$1"; } 2>/dev/null
    return 0
}

if [ -n "${KSH_VERSION:-}" ]; then  # mksh (Android): print is its builtin, printf may be a program
    out() { print -r -- "$1"; }
else
    out() { printf '%s
' "$1"; }
fi

clock_start() {  # the monotonic - wall offset, from the worker (a shell has no monotonic clock)
    # shellcheck disable=SC2046  # four numbers, split on purpose
    set -- $(sh "$WORKER/run.sh" --clock)
    MONO_S=$1; MONO_N=$2; WALL_S=$3; WALL_N=$4
    OFF_S=$((WALL_S - MONO_S)); OFF_N=$((WALL_N - MONO_N))
    HAVE_NS=1
    case $(date +%N 2>/dev/null) in *[!0-9]* | "") HAVE_NS=0 ;; esac
}

now() {  # sets NOW (monotonic ns as text) and NOW_S (wall seconds), from the wall clock less the offset
    # shellcheck disable=SC2046  # seconds and nanoseconds, split on purpose
    if [ "$HAVE_NS" = 1 ]; then set -- $(date '+%s %N'); else set -- "$(date +%s)" 0; fi
    NOW_S=$1
    n=$2
    while :; do case $n in 0?*) n=${n#0} ;; *) break ;; esac; done
    s=$(($1 - OFF_S)); n=$((n - OFF_N))
    if [ "$n" -lt 0 ]; then n=$((n + 1000000000)); s=$((s - 1)); fi
    if [ "$n" -ge 1000000000 ]; then n=$((n - 1000000000)); s=$((s + 1)); fi
    while [ ${#n} -lt 9 ]; do n=0$n; done
    NOW=$s$n
}

clock_json() {
    # shellcheck disable=SC2046  # four numbers, split on purpose
    set -- $(sh "$WORKER/run.sh" --clock)
    printf '{"mono_ns": %d%09d, "wall_ns": %d%09d, "uncertainty_ns": null}' "$1" "$2" "$3" "$4"
}

# --- where the readings come from (meta.json `readings`) ------------------------------------

cgroup_of() {  # $1 pid, $2 controller (memory, cpuacct, cpu): sets CGDIR (v1 or v2 folder) and CGPATH, or empty
    CGDIR=""; CGPATH=""; CGVER=""
    [ -r "$R/proc/$1/cgroup" ] || return 0
    while IFS=: read -r _ controllers path; do
        case ",$controllers," in
            *",$2,"*) for d in "$R/sys/fs/cgroup/$controllers$path" "$R/sys/fs/cgroup/$2$path"; do
                    [ -z "$CGDIR" ] && [ -d "$d" ] && { CGDIR=${d%/}; CGVER=v1; CGPATH=$path; }
                done ;;
        esac
    done < "$R/proc/$1/cgroup"
    if [ -z "$CGDIR" ]; then
        while IFS=: read -r _ controllers path; do
            [ -z "$controllers" ] && [ -d "$R/sys/fs/cgroup$path" ] && { CGDIR=$R/sys/fs/cgroup${path%/}; CGVER=v2; CGPATH=$path; }
        done < "$R/proc/$1/cgroup"
    fi
    # the root of a v1 hierarchy counts the whole system: not a cgroup of the run's own
    [ -n "$CGDIR" ] && [ -e "$CGDIR/cgroup.sane_behavior" ] && CGDIR=""
    CGPATH=${CGPATH#/}
    return 0
}

find_sources() {  # $1 the worker's pid: sets MEM_CG, CPU_CG, CPU_USAGE, CPU_CORES, ZONES, HWMON, BAT
    cgroup_of "$1" memory
    MEM_CG=""; MEM_VER=$CGVER
    for f in memory.usage_in_bytes memory.current; do [ -n "$CGDIR" ] && [ -f "$CGDIR/$f" ] && MEM_CG=$CGDIR; done
    CPU_CG=""; CPU_USAGE=""; CPU_CORES=""
    cgroup_of "$1" cpu
    [ -f "$CGDIR/cpu.stat" ] || CGDIR=""
    CPU_DIR=$CGDIR
    if [ -n "$CGDIR" ]; then
        if [ "$CGVER" = v2 ]; then
            rd "$CGDIR/cpu.max"; v=$V
            # shellcheck disable=SC2086  # quota and period, split on purpose
            set -- ${v:-max} 100000
            quota=$1; period=$2; CPU_USAGE=$CGDIR/cpu.stat
        else
            rd "$CGDIR/cpu.cfs_quota_us"; quota=$V; rd "$CGDIR/cpu.cfs_period_us"; period=$V
            cpath=$CGPATH
            cgroup_of "$1" cpuacct
            [ -n "$CGDIR" ] && [ -f "$CGDIR/cpuacct.usage" ] && CPU_USAGE=$CGDIR/cpuacct.usage
            CGPATH=$cpath
        fi
        if is_int "$quota" && is_int "$period" && [ "$quota" -gt 0 ] && [ "$period" -gt 0 ] && [ -n "$CPU_USAGE" ]; then
            CPU_CG=$CGPATH; CPU_CORES=$(milli $((quota * 1000 / period)))
        fi
    fi
    ZONES=""
    for base in "$R/sys/class/thermal" "$R/sys/devices/virtual/thermal"; do
        for z in "$base"/thermal_zone*; do [ -e "$z/temp" ] && ZONES="$ZONES $z"; done
        [ -n "$ZONES" ] && break
    done
    ZONES=$(for z in $ZONES; do printf '%s %s\n' "${z##*thermal_zone}" "$z"; done | sort -n | while read -r _ z; do printf '%s ' "$z"; done)
    mirrored=" "
    for z in $ZONES; do rd "$z/type"; mirrored="$mirrored$(key_name "${V:-${z##*/}}") "; done
    HWMON=""
    for h in "$R"/sys/class/hwmon/hwmon*; do
        [ -d "$h" ] || continue
        rd "$h/name"; chip=$(key_name "${V:-${h##*/}}")
        case $mirrored in *" $chip "*) continue ;; esac
        for t in "$h"/temp*_input; do [ -e "$t" ] && HWMON="$HWMON $t"; done
    done
    BAT=""
    if [ "$POWER" = battery ]; then
        if [ -e "$R/sys/class/power_supply/battery" ]; then BAT=$R/sys/class/power_supply/battery
        else
            for s in "$R"/sys/class/power_supply/*; do
                rd "$s/type"; [ -z "$BAT" ] && [ "$V" = Battery ] && BAT=$s
            done
        fi
        if [ -n "$BAT" ]; then
            rd "$BAT/current_now"; ua=$V; rd "$BAT/voltage_now"
            { is_int "$ua" && [ -n "$V" ]; } || BAT=""
        fi
    fi
}

milli() {  # an integer in thousandths as a decimal (45123 -> 45.123)
    v=$1; sign=""
    if [ "$v" -lt 0 ]; then sign="-"; v=$((-v)); fi
    printf '%s%d.%03d' "$sign" $((v / 1000)) $((v % 1000))
}

readings_json() {  # meta.json's `readings` for the sources find_sources found
    printf '{"recorded_by": "shell", "clock_ticks": %s, "temperatures": {' "$(getconf CLK_TCK 2>/dev/null || echo 100)"
    sep=""
    for z in $ZONES; do
        rd "$z/type"; t=$V
        printf '%s"%s_mc": %s' "$sep" "${z##*/}" "$(json_text "${t:-${z##*/}}")"; sep=", "
    done
    for t in $HWMON; do
        h=${t%/*}; stem=${t##*/}; stem=${stem%_input}
        rd "$h/name"; chip=$V; rd "$h/${stem}_label"; label=$V
        printf '%s"%s_%s_mc": %s' "$sep" "${h##*/}" "$stem" "$(json_text "$(key_name "${chip:-${h##*/}}") ${label:-$stem}")"
        sep=", "
    done
    printf '}'
    [ -n "$MEM_CG" ] && printf ', "memory_cgroup": {"path": %s, "peak_scope": %s}' \
        "$(json_text "$MEM_VER:$MEM_CG")" "$(json_text "$PEAK_SCOPE")"
    [ -n "$CPU_CG" ] && printf ', "cgroup_cpu": {"path": %s, "cores": %s}' "$(json_text "$CPU_CG")" "$CPU_CORES"
    if [ -n "$BAT" ]; then
        printf ', "battery": {"path": %s, "supplies": {' "$(json_text "$BAT")"
        sep=""
        for s in "$R"/sys/class/power_supply/*; do
            [ -e "$s" ] || continue
            rd "$s/type"; type=$V; rd "$s/online"
            printf '%s%s: {"type": %s, "online": %s}' "$sep" "$(json_text "${s##*/}")" \
                "$(json_or_null "$type")" "$(json_or_null "$V")"
            sep=", "
        done
        calibration=null
        state=${EDGEBENCH_STATE_DIR:-${HOME:-/}/.local/state/edgebench}/battery_sign.json
        grep -q '"battery_current_sign": *-\{0,1\}1[,} ]' "$state" 2>/dev/null && calibration=$(tr '\n\t' '  ' < "$state")
        printf '}, "calibration": %s}' "$calibration"
    fi
    printf '}'
}

# --- readings: each appends `,"key":value` to LINE, with no process started (a phone's shell
# forks slowly; a reading that costs a fork per file would slow the sampling it measures) -----

add() {  # LINE gets "$1": $2 (a JSON value)
    LINE="$LINE,\"$1\":$2"
}

bytes_of_kb() {  # B: kB * 1024 as text, each part below 2^31
    q=$(($1 / 1000000)); r=$(($1 % 1000000))
    lo=$((r * 1024)); hi=$((q * 1024 + lo / 1000000)); lo=$((lo % 1000000))
    if [ "$hi" -gt 0 ]; then
        while [ ${#lo} -lt 6 ]; do lo=0$lo; done
        B=$hi$lo
    else B=$lo; fi
}

oom_kills() {  # K: the memory cgroup's oom_kill counter, or empty
    K=""
    for f in memory.oom_control memory.events.local memory.events; do
        [ -n "$K" ] || [ -z "$MEM_CG" ] || [ ! -r "$MEM_CG/$f" ] && continue
        while read -r key value; do [ "$key" = oom_kill ] && K=$value; done < "$MEM_CG/$f"
    done
    return 0
}

memory_counters() {  # the cgroup's high-water mark, limit, anonymous memory and OOM kills
    [ -n "$MEM_CG" ] || return 0
    if [ "$MEM_VER" = v1 ]; then peak=max_usage_in_bytes; limit=limit_in_bytes; rss=total_rss
    else peak=peak; limit=max; rss=anon; fi
    rd "$MEM_CG/memory.$peak"; is_int "$V" && add cgroup_peak_bytes "$V"
    rd "$MEM_CG/memory.$limit"
    # a limit of "max" (v2) or ~2^63 (v1) is none; 19 digits and more is at least 10^18
    is_int "$V" && [ ${#V} -lt 19 ] && add cgroup_limit_bytes "$V" && LIMIT=$V
    { while read -r key value; do [ "$key" = "$rss" ] && add cgroup_rss_bytes "$value"; done \
        < "$MEM_CG/memory.stat"; } 2>/dev/null
    oom_kills; [ -n "$K" ] && add cgroup_oom_kills "$K"
    return 0
}

temperatures() {  # m°C of every readable sensor
    for z in $ZONES; do
        rd "$z/temp"; is_int "$V" && add "${z##*/}_mc" "$V"
    done
    for t in $HWMON; do
        h=${t%/*}; stem=${t##*/}
        rd "$t"; is_int "$V" && add "${h##*/}_${stem%_input}_mc" "$V"
    done
    return 0
}

battery() {  # current, voltage and status as read
    [ -n "$BAT" ] || return 0
    rd "$BAT/status"
    case $V in
        "") ;;
        *[!A-Za-z\ ]*) add battery_status "$(json_text "$V")" ;;  # not a kernel status word: escaped
        *) add battery_status "\"$V\"" ;;
    esac
    rd "$BAT/current_now"; ua=$V; rd "$BAT/voltage_now"
    is_int "$ua" && is_int "$V" && add battery_current_ua "$ua" && add battery_voltage_uv "$V"
    return 0
}

stat_cpu() {  # S: the fields of /proc/stat's cpu line, or empty
    S=""
    { read -r cpu fields < "$R/proc/stat"; } 2>/dev/null && [ "$cpu" = cpu ] && S=$fields
    case $S in *[!0-9\ ]*) S="" ;; esac
    return 0
}

cpu_readings() {  # every MID_EVERY ticks: the machine's, the worker's and the cgroup's CPU, memory, battery
    { while read -r key value _; do
        [ "$key" = MemAvailable: ] || continue
        bytes_of_kb "$value" && add mem_available_bytes "$B"
        # the lowest, with the cgroup's usage then: result.json's memory_low_point (as the supervisor's)
        if [ -z "$LOW_KB" ] || [ "$value" -lt "$LOW_KB" ]; then LOW_KB=$value; USED_AT_LOW=$USAGE; fi
    done < "$R/proc/meminfo"; } 2>/dev/null
    stat_cpu; [ -n "$S" ] && add proc_stat_cpu "\"$S\""
    if { read -r stat < "$R/proc/$PID/stat"; } 2>/dev/null; then
        # shellcheck disable=SC2086  # the fields after the command name, split on purpose
        set -- ${stat##*) }
        add worker_cpu_ticks $((${12} + ${13} + ${14} + ${15}))
    fi
    if [ -n "$CPU_CG" ]; then
        case $CPU_USAGE in
            */cpu.stat) { while read -r key value; do
                    [ "$key" = usage_usec ] && is_int "$value" && add cgroup_cpu_usage_ns "$(no_zeros "$value")000"
                done < "$CPU_USAGE"; } 2>/dev/null ;;
            *) rd "$CPU_USAGE"; is_int "$V" && add cgroup_cpu_usage_ns "$V" ;;
        esac
    fi
    battery
}

slow_readings() {  # every SLOW_EVERY ticks: cgroup counters, throttling, temperatures
    if [ -n "$CPU_DIR" ]; then  # the time the CPU quota held the run back (v1 in ns: its last 3 digits dropped)
        { while read -r key value; do
            case $key in
                throttled_usec) add cpu_throttled_us "$value" ;;
                throttled_time) add cpu_throttled_us "$(no_zeros "${value%???}")" ;;
            esac
        done < "$CPU_DIR/cpu.stat"; } 2>/dev/null
    fi
    memory_counters
    temperatures
}

sample() {  # one line of samples.jsonl for the worker $PID; $1: every source (1) or those due
    rss=""
    { while read -r key value _; do
        case $key in VmRSS:) rss=$value ;; VmHWM:) HWM_KB=$value ;; esac
    done < "$R/proc/$PID/status"; } 2>/dev/null
    now
    LINE="{\"t_ns\":$NOW"
    [ -n "$rss" ] && bytes_of_kb "$rss" && add rss_bytes "$B"
    if [ -n "$MEM_CG" ]; then
        for f in memory.usage_in_bytes memory.current; do
            rd "$MEM_CG/$f"; is_int "$V" && add cgroup_usage_bytes "$V" && USAGE=$V
        done
    fi
    if [ "$1" = 1 ] || [ $((TICKS % MID_EVERY)) = 0 ]; then cpu_readings; fi
    if [ "$1" = 1 ] || [ $((TICKS % SLOW_EVERY)) = 0 ]; then slow_readings; fi
    out "$LINE}"
    TICKS=$((TICKS + 1))
}

cpu_snapshot() {  # the raw snapshot of the noise guard (edgebench.figures.cpu), after `times > $RUN/.times`
    now
    stat_cpu
    cores=$(grep -c '^cpu[0-9]' "$R/proc/stat" 2>/dev/null)
    rd "$R/proc/loadavg"
    printf '{"t_ns": %s, "proc_stat_cpu": %s, "stat_cores": %s, "loadavg": %s, "times": %s}' "$NOW" \
        "$(json_or_null "$S")" "${cores:-null}" "$(json_or_null "$V")" \
        "$(json_or_null "$(cat "$RUN/.times" 2>/dev/null)")"
}

reset_peak() {  # the v1 high-water mark restarts at the run (as telemetry.memory.CgroupMemory.reset_peak)
    PEAK_SCOPE=run
    [ -n "$MEM_CG" ] || return 0
    if [ "$MEM_VER" != v1 ]; then
        PEAK_SCOPE="cgroup lifetime (cgroup v2 memory.peak cannot be reset for every reader: use a fresh cgroup per run)"
    elif ! { echo 0 > "$MEM_CG/memory.max_usage_in_bytes"; } 2>/dev/null; then
        PEAK_SCOPE="cgroup lifetime (cannot write $MEM_CG/memory.max_usage_in_bytes)"
    fi
}

if [ "${1:-}" = --sample ]; then  # the readings of pid $2 now, as a run would record them
    PID=$2; POWER=${POWER:-battery}; TICKS=0; MID_EVERY=1; SLOW_EVERY=1; HAVE_NS=0; OFF_S=0; OFF_N=0
    find_sources "$PID"
    reset_peak
    readings_json; printf '\n'
    sample 1
    exit 0
fi

# --- the sweep ----------------------------------------------------------------------------

SWEEP=$(cd "$1" && pwd) || exit 2
cd "$SWEEP" || exit 2

if ! mkdir .sweep.lock.d 2>/dev/null; then
    old=$(cat sweep.pid 2>/dev/null)
    if [ -n "$old" ] && kill -0 "$old" 2>/dev/null; then
        echo "$SWEEP: another sweep process is running there (pid $old); wait for it or stop it (kill -TERM $old)" >&2
        exit 2
    fi
fi
echo $$ > sweep.pid
# The OOM killer's last choice (lowering needs root; elsewhere it stays as it was): a worker
# killed for memory frees it only as it exits, and a second kill then must not take this shell.
{ echo -999 > "/proc/$$/oom_score_adj"; } 2>/dev/null

trap 'STOP=${STOP:-SIGTERM}' TERM
trap 'STOP=${STOP:-Ctrl-C (SIGINT)}' INT

alive() {  # the worker runs (a zombie child counts as ended)
    { read -r stat < "/proc/$PID/stat"; } 2>/dev/null || return 1
    case $stat in *") Z "*) return 1 ;; esac
    return 0
}

write_meta() {  # $1: the end clock (JSON) or null; $2: the readings (JSON) or null. meta.json:
    # edgebench.figures.run_meta.RunMeta's keys, all of them (what a shell cannot read is null)
    {
        printf '{"run_id": %s, "supervisor": "shell", "runtime": "native",\n' "$(json_text "$RUN_ID")"
        printf '"spec": '; cat "specs/$SPEC_JSON"; printf ',\n'
        printf '"device": {"hostname": %s, "arch": %s, "platform": null, "python": null, "cpu_count": %s, ' \
            "$(json_text "$(uname -n)")" "$(json_text "$(uname -m)")" "$CPU_COUNT"
        printf '"cpu_affinity": null, "mem_total_bytes": %s, "emulator": null},\n' "$MEM_TOTAL"
        printf '"versions": {}, "native_worker": '; cat "$WORKER/bundle.json"; printf ',\n'
        printf '"ran": %s,\n"readings": %s,\n' "$RAN" "$2"
        printf '"clock": {"start": %s, "end": %s}, "predicted": null, "oom_kills_at_start": null}\n' "$CLOCK_START" "$1"
    } > "$RUN/meta.json.tmp" && mv "$RUN/meta.json.tmp" "$RUN/meta.json"
}

ran_json() {  # the sha256 of every file the run starts with, read now (as runner.native.files_that_run)
    printf '{'
    for part in "worker:$WORKER" "plan:$PLAN" "program:$PROGRAM"; do
        base=${part#*:}
        [ -d "$base" ] || continue
        find "$base" -type f ! -name bundle.json | LC_ALL=C sort | while IFS= read -r f; do
            digest=$(sha256sum < "$f")
            printf ', %s: "%s"' "$(json_text "${part%%:*}/${f#"$base"/}")" "${digest%% *}"
        done
    done | sed 's/^, //'
    printf '}'
}

end_json() {  # how the worker ended, as seen here: edgebench.figures.run_end.RunEnd's keys, all of them
    code=$RC; sig=null
    if [ "$RC" -gt 128 ]; then sig=$((RC - 128)); code=null; fi
    tail=null
    [ -s "$RUN/events.jsonl" ] || tail=$(json_text "$(tail -c 2000 "$RUN/worker.log" 2>/dev/null)")
    # the kernel's peak of the worker: the last VmHWM read while it ran
    worker_peak=null; peak_from=null
    if [ -n "$HWM_KB" ] && bytes_of_kb "$HWM_KB"; then worker_peak=$B; peak_from='"vm_hwm"'; fi
    printf '{"exit_code": %s, "exit_signal": %s, "timed_out": %s, "stopped_by": %s, ' "$code" "$sig" \
        "$([ -n "$TIMED_OUT" ] && echo true || echo false)" "$(json_or_null "$STOPPED")"
    oom_kills
    # a shell does not read /dev/kmsg (root's, and toybox has no parser): the kernel's record stays null
    printf '"oom_kills_start": %s, "oom_kills_end": %s, "kernel_oom": null, "kernel_oom_constraint": null, ' \
        "${OOM_BEFORE:-null}" "${K:-null}"
    low=null; [ -n "$LOW_KB" ] && bytes_of_kb "$LOW_KB" && low=$B
    printf '"mem_available_low_bytes": %s, "cgroup_usage_at_low_bytes": %s, "cgroup_limit_bytes": %s, ' \
        "$low" "${USED_AT_LOW:-null}" "${LIMIT:-null}"
    printf '"start_problem": null, '
    printf '"write_failure": null, "disk_full": false, "worker_peak_bytes": %s, "worker_peak_from": %s, ' \
        "$worker_peak" "$peak_from"
    printf '"worker_log_tail": %s, "exit_codes": "edgebench"}' "$tail"
}

run_one() {
    RUN="runs/$RUN_ID"
    mkdir -p "$RUN"
    cp "specs/$SPEC_JSON" "$RUN/spec.json"
    clock_start
    CLOCK_START=$(clock_json)
    RAN=$(ran_json)
    write_meta null null
    times > "$RUN/.times" 2>/dev/null  # here, not in a subshell: a subshell's children are not the run's
    CPU_START=$(cpu_snapshot)
    HWM_KB=""; TICKS=0; TIMED_OUT=""; STOPPED=""; LOW_KB=""; USAGE=""; USED_AT_LOW=""; LIMIT=""
    sh "$WORKER/run.sh" "$PLAN/plan.txt" --program "$PROGRAM" --out "$RUN" >> "$RUN/worker.log" 2>&1 &
    PID=$!
    find_sources "$PID"
    reset_peak
    oom_kills; OOM_BEFORE=$K
    READINGS=$(readings_json)
    write_meta null "$READINGS"
    now; START_S=$NOW_S; KILL_AT=""
    while alive; do
        sample 0 >> "$RUN/samples.jsonl"  # NOW_S: its wall seconds
        if [ -n "$STOP" ] && [ -z "$STOPPED" ]; then
            STOPPED=$STOP; KILL_AT=$((NOW_S + GRACE_S))
            case $STOP in *SIGINT*) kill -INT "$PID" 2>/dev/null ;; *) kill -TERM "$PID" 2>/dev/null ;; esac
        fi
        if [ "$TIMEOUT_S" -gt 0 ] && [ -z "$TIMED_OUT" ] && [ $((NOW_S - START_S)) -ge "$TIMEOUT_S" ]; then
            TIMED_OUT=1; kill -KILL "$PID" 2>/dev/null
        fi
        if [ -n "$KILL_AT" ] && [ "$NOW_S" -ge "$KILL_AT" ]; then kill -KILL "$PID" 2>/dev/null; fi
        # shellcheck disable=SC2153  # TICK_S is set by the run's .env
        sleep "$TICK_S"
    done
    wait "$PID"; RC=$?
    times > "$RUN/.times" 2>/dev/null  # the reaped worker's CPU time is in its children's now
    CPU_END=$(cpu_snapshot)
    rm -f "$RUN/.times"
    sample 1 >> "$RUN/samples.jsonl"  # a last line with every source: counters end complete
    write_meta "$(clock_json)" "$READINGS"
    {
        printf '{"run_id": %s, "backend": "executorch", "runtime": "native", "recorded_by": "shell",\n' \
            "$(json_text "$RUN_ID")"
        printf '"end": %s,\n' "$(end_json)"
        printf '"cpu_start": %s,\n"cpu_end": %s,\n' "$CPU_START" "$CPU_END"
        printf '"sampler": {"supervisor": "shell", "samples": %d, "tick_s": %s}}\n' "$TICKS" "$TICK_S"
    } > "$RUN/result.json.tmp" && mv "$RUN/result.json.tmp" "$RUN/result.json"
}

mem_available_kb() {  # A: MemAvailable in kB, or empty
    A=""
    { while read -r key value _; do [ "$key" = MemAvailable: ] && A=$value; done < "$R/proc/meminfo"; } 2>/dev/null
    return 0
}

wait_for_memory() {  # $1: the run, $2: MemAvailable (kB) before it: waits (HOST_OOM_WAIT_S at most) until it is back
    waited=0
    mem_available_kb
    while is_int "$A" && [ "$A" -lt "$2" ] && [ "$waited" -lt "$HOST_OOM_WAIT_S" ] && [ -z "$STOP" ]; do
        sleep 1; waited=$((waited + 1)); mem_available_kb
    done
    said="sweep: $1 ended while the device's memory ran out (MemAvailable below $((HOST_LOW_KB / 1024)) MiB);"
    if ! is_int "$A"; then echo "$said MemAvailable is unreadable under ${R:-/}: the next run starts without waiting"
    elif [ "$A" -ge "$2" ]; then
        echo "$said waited $waited s for MemAvailable to be back to $(($2 / 1024)) MiB ($((A / 1024)) MiB)"
    else echo "$said waited $waited s, the limit: MemAvailable is $((A / 1024)) MiB, not yet back to $(($2 / 1024)) MiB; the next run starts anyway"
    fi >&2
}

RUNS=""
save() {  # sweep.json: one run per line, so the shell's status script can read it back
    {
        printf '{"pid": %d, "state": "%s", "supervisor": "shell", "why": %s, "runs": {\n' "$$" "$1" "${WHY:-null}"
        printf '%s' "$RUNS" | sed '$!s/$/,/'
        printf '\n}}\n'
    } > sweep.json.tmp && mv sweep.json.tmp sweep.json
}
set_run() {  # $1 run id, $2 state: replaces the run's line
    RUNS=$(printf '%s\n' "$RUNS" | grep -v "^\"$1\":" | grep -v '^$'; printf '"%s": "%s"' "$1" "$2")
}

WHY=""
# One sweep per device (as runner/sweep.py's DEVICE_LOCK): two deploys started together both pass
# deploy's check; the second sweep starts nothing. A holder that is gone (killed while its host
# was away) leaves its folder behind: it is this sweep's then.
DEVICE_LOCK=../.one-sweep-at-a-time.d
if ! mkdir "$DEVICE_LOCK" 2>/dev/null; then
    holder=$(cat "$DEVICE_LOCK/pid" 2>/dev/null)
    if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null && grep -q sweep.sh "/proc/$holder/cmdline" 2>/dev/null; then
        for env in specs/*.env; do
            [ -f "$env" ] || continue
            # shellcheck source=/dev/null  # the host's .env of a run (RUN_ID)
            . "./$env"
            set_run "$RUN_ID" "not started"
        done
        WHY=$(json_text "sweep $(cat "$DEVICE_LOCK/sweep" 2>/dev/null) is running on this device (one sweep at a time: two at once share its RAM and CPU, and neither's figures hold); deploy again once it has ended (edgebench status)")
        save refused
        echo "$SWEEP: refused: another sweep runs on this device" >&2
        rmdir .sweep.lock.d 2>/dev/null
        exit 2
    fi
fi
echo $$ > "$DEVICE_LOCK/pid"
echo "${SWEEP##*/}" > "$DEVICE_LOCK/sweep"
MEM_TOTAL=null; REFILL=""; BEFORE_KB=""
while read -r key value _; do [ "$key" = MemTotal: ] && bytes_of_kb "$value" && MEM_TOTAL=$B; done < /proc/meminfo
CPU_COUNT=$(grep -c '^cpu[0-9]' /proc/stat 2>/dev/null)  # the CPUs the OS counts (meta.json device.cpu_count)
is_int "$CPU_COUNT" && [ "$CPU_COUNT" -gt 0 ] || CPU_COUNT=null
for env in specs/*.env; do
    [ -f "$env" ] || continue
    POWER=none
    # shellcheck source=/dev/null  # the host's .env of this run (RUN_ID, TICK_S, ...)
    . "./$env"
    # ended, unless the status script closed it for a sweep that died meanwhile (`cut_off`): run again
    if [ -f "runs/$RUN_ID/result.json" ] && ! grep -q '"cut_off": true' "runs/$RUN_ID/result.json"; then
        set_run "$RUN_ID" ended
        continue
    fi
    if [ -n "$STOP" ]; then set_run "$RUN_ID" "not started"; continue; fi
    if [ -d "runs/$RUN_ID" ]; then  # cut off by an earlier sweep: kept aside, started afresh
        n=1; while [ -e "runs/$RUN_ID.attempt-$n" ]; do n=$((n + 1)); done
        mv "runs/$RUN_ID" "runs/$RUN_ID.attempt-$n"
        printf '{"status": "interrupted", "run_id": "%s.attempt-%d", "recorded_by": "shell", "detail": "attempt %d of %s was cut off: the sweep process was gone before the run ended; the run was started again"}\n' \
            "$RUN_ID" "$n" "$n" "$RUN_ID" > "runs/$RUN_ID.attempt-$n/result.json"
        sed "s/^{\"run_id\": \"$RUN_ID\"/{\"run_id\": \"$RUN_ID.attempt-$n\"/" "runs/$RUN_ID.attempt-$n/meta.json" \
            > "runs/$RUN_ID.attempt-$n/meta.json.tmp" 2>/dev/null && mv "runs/$RUN_ID.attempt-$n/meta.json.tmp" "runs/$RUN_ID.attempt-$n/meta.json"
        set_run "$RUN_ID.attempt-$n" interrupted
    fi
    [ -n "$REFILL" ] && wait_for_memory "$REFILL" "$BEFORE_KB"
    REFILL=""
    [ -n "$STOP" ] && { set_run "$RUN_ID" "not started"; continue; }
    set_run "$RUN_ID" running
    save running
    mem_available_kb; BEFORE_KB=$A
    run_one
    # killed from outside while the device's RAM ran out: a shell cannot tell the host's OOM from the
    # run's (no kmsg), so the next run waits for the memory after either (a bounded wait)
    if [ "$RC" = 137 ] && [ -z "$TIMED_OUT$STOPPED" ] && is_int "$BEFORE_KB" && is_int "$LOW_KB" \
        && [ "$LOW_KB" -lt "$HOST_LOW_KB" ]; then REFILL=$RUN_ID; fi
    set_run "$RUN_ID" ended
    save running
done
if [ -n "$STOP" ]; then WHY=$(json_text "stopped by $STOP"); save interrupted; else save finished; fi
[ "$(cat "$DEVICE_LOCK/pid" 2>/dev/null)" = $$ ] && rm -r "$DEVICE_LOCK"
rmdir .sweep.lock.d 2>/dev/null
[ -z "$STOP" ]
