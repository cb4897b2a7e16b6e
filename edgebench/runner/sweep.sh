#!/bin/sh
# The sweep of a device with no Python (a phone over adb, a bare board): every
# SWEEP/specs/NNN-<run_id>.env in order, each run by the native ExecuTorch worker under this
# shell's supervision, into SWEEP/runs/<run_id>/ with the files the Python supervisor writes
# (meta.json, samples.jsonl, events.jsonl from the worker, result.json), and SWEEP/sweep.json.
#
#   sh sweep.sh SWEEP_DIR
#
# POSIX sh with the tools toybox has (cat, date, sleep, sed, grep, tr, mv, rm, mkdir, kill,
# uname): no awk, no Python. Arithmetic stays below 2^31 (Android's mksh has 32-bit
# integers): byte counts read from the kernel are copied as text, kB are turned into bytes
# digit-wise, and timestamps are built from seconds and nanoseconds apart. The host finishes
# result.json's step statistics from events.jsonl when it ingests the run (written_by: shell).
#
# Each .env file (written by the host, values shell-quoted) sets RUN_ID, SPEC_JSON (the spec
# file beside it), PROGRAM, WORKER (bundle folder), PLAN (plan folder), TICK_S and TICK_MS
# (the sample interval, e.g. 0.05 and 50), SLOW_EVERY (ticks between thermal/battery reads), TIMEOUT_S (whole
# seconds, 0: none) and BATTERY (a power_supply folder, or empty).

set -u
SWEEP=$(cd "$1" && pwd) || exit 2
cd "$SWEEP" || exit 2
GRACE_S=5

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

STOP=""
trap 'STOP=${STOP:-SIGTERM}' TERM
trap 'STOP=${STOP:-Ctrl-C (SIGINT)}' INT

json_text() {  # $1 as a JSON string literal (quotes, backslashes and control characters escaped)
    printf '"%s"' "$(printf '%s' "$1" | tr '\n\r\t' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g')"
}

no_zeros() {  # a decimal without leading zeros (a shell reads 0123 as octal)
    n=$1
    while :; do case $n in 0?*) n=${n#0} ;; *) break ;; esac; done
    printf '%s' "${n:-0}"
}

kb_to_bytes() {  # kB * 1024 as text, each part below 2^31
    q=$(($1 / 1000000)); r=$(($1 % 1000000))
    lo=$((r * 1024)); hi=$((q * 1024 + lo / 1000000)); lo=$((lo % 1000000))
    if [ "$hi" -gt 0 ]; then printf '%d%06d' "$hi" "$lo"; else printf '%d' "$lo"; fi
}

milli() {  # an integer in thousandths as a decimal (45123 -> 45.123)
    v=$1; sign=""
    if [ "$v" -lt 0 ]; then sign="-"; v=$((-v)); fi
    printf '%s%d.%03d' "$sign" $((v / 1000)) $((v % 1000))
}

clock_start() {  # the monotonic - wall offset, from the worker (a shell has no monotonic clock)
    set -- $(sh "$WORKER/run.sh" --clock)
    MONO_S=$1; MONO_N=$2; WALL_S=$3; WALL_N=$4
    OFF_S=$((WALL_S - MONO_S)); OFF_N=$((WALL_N - MONO_N))
    HAVE_NS=1
    case $(date +%N 2>/dev/null) in *[!0-9]* | "") HAVE_NS=0 ;; esac
}

now() {  # sets NOW_S and NOW (monotonic ns as text), from the wall clock less the offset
    if [ "$HAVE_NS" = 1 ]; then set -- $(date '+%s %N'); else set -- "$(date +%s)" 0; fi
    s=$(($1 - OFF_S)); n=$(($(no_zeros "$2") - OFF_N))
    if [ "$n" -lt 0 ]; then n=$((n + 1000000000)); s=$((s - 1)); fi
    if [ "$n" -ge 1000000000 ]; then n=$((n - 1000000000)); s=$((s + 1)); fi
    NOW_S=$1
    NOW=$(printf '%d%09d' "$s" "$n")
}

clock_json() {
    set -- $(sh "$WORKER/run.sh" --clock)
    printf '{"mono_ns": %d%09d, "wall_ns": %d%09d, "uncertainty_ns": null}' "$1" "$2" "$3" "$4"
}

find_cgroup() {  # this shell's memory cgroup folder (v1 or v2), or empty
    CG=""
    while IFS=: read -r _ controllers path; do
        case ",$controllers," in
            *,memory,*) [ -d "/sys/fs/cgroup/memory$path" ] && CG="/sys/fs/cgroup/memory$path" ;;
            ,,) [ -z "$CG" ] && [ -f "/sys/fs/cgroup$path/memory.current" ] && CG="/sys/fs/cgroup$path" ;;
        esac
    done < /proc/self/cgroup
}

cgroup_usage() {
    for f in memory.usage_in_bytes memory.current; do
        [ -r "$CG/$f" ] && { read -r v < "$CG/$f"; printf '%s' "$v"; return; }
    done
}

oom_kills() {
    k=0
    for f in memory.oom_control memory.events; do
        [ -r "$CG/$f" ] || continue
        while read -r key value; do [ "$key" = oom_kill ] && k=$value; done < "$CG/$f"
    done
    printf '%s' "$k"
}

thermal() {  # ,"temp_<zone type>_c": value for every readable thermal zone
    for z in /sys/class/thermal/thermal_zone*; do
        [ -r "$z/temp" ] && [ -r "$z/type" ] || continue
        read -r t < "$z/temp" 2>/dev/null || continue
        read -r type < "$z/type"
        key=$(printf '%s' "$type" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9\n' '_' | sed 's/__*/_/g; s/^_//; s/_$//')
        printf ',"temp_%s_c":%s' "${key:-unnamed}" "$(milli "$t")"
    done
}

battery() {  # ,"power_w": |current| x voltage (mA x mV, each below 2^31)
    [ -n "$BATTERY" ] && [ -r "$BATTERY/current_now" ] && [ -r "$BATTERY/voltage_now" ] || return
    read -r ua < "$BATTERY/current_now"; read -r uv < "$BATTERY/voltage_now"
    ua=${ua#-}
    mw=$(( (ua / 1000) * (uv / 1000) / 1000 ))
    ENERGY_MJ=$((ENERGY_MJ + mw * TICK_MS * SLOW_EVERY / 1000))
    printf ',"power_w":%s,"energy_j":%s' "$(milli "$mw")" "$(milli "$ENERGY_MJ")"
}

sample() {  # one line of samples.jsonl for the worker $PID
    rss=""; hwm=""
    { while read -r key value _; do
        case $key in VmRSS:) rss=$value ;; VmHWM:) hwm=$value ;; esac
    done < "/proc/$PID/status"; } 2>/dev/null
    now
    line="{\"t_ns\":$NOW"
    if [ -n "$rss" ]; then
        line="$line,\"rss_bytes\":$(kb_to_bytes "$rss")"
        [ "$rss" -gt "$PEAK_KB" ] && PEAK_KB=$rss
        HWM_KB=$hwm
    fi
    [ -n "$CG" ] && line="$line,\"cgroup_usage_bytes\":$(cgroup_usage)"
    if [ $((TICKS % SLOW_EVERY)) = 0 ]; then line="$line$(thermal)$(battery)"; fi
    printf '%s}\n' "$line" >> "$RUN/samples.jsonl"
    TICKS=$((TICKS + 1))
}

alive() {  # the worker runs (a zombie child counts as ended)
    { read -r stat < "/proc/$PID/stat"; } 2>/dev/null || return 1
    case $stat in *") Z "*) return 1 ;; esac
    return 0
}

last_detail() {  # the last event's detail as a JSON string literal, or empty
    grep '"detail": ' "$RUN/events.jsonl" 2>/dev/null | tail -n 1 | sed -E 's/.*"detail": ("([^"\\]|\\.)*").*/\1/'
}

status_of() {  # sets STATUS and DETAIL (a JSON literal) from how the worker ended
    sig=""; code=$RC
    if [ "$RC" -gt 128 ]; then sig=$((RC - 128)); code=""; fi
    DETAIL='""'; EXIT_CODE=${code:-null}; EXIT_SIGNAL=null
    [ -n "$sig" ] && EXIT_SIGNAL=$(json_text "$(kill -l "$sig" 2>/dev/null || echo "$sig")")
    if [ -n "$TIMED_OUT" ]; then
        STATUS=timeout; DETAIL=$(json_text "the run passed its wall-clock limit (timeout_s) and was killed"); return
    fi
    if [ -n "$STOPPED" ]; then STATUS=interrupted; DETAIL=$(json_text "stopped by $STOPPED"); return; fi
    if [ -n "$sig" ]; then
        if [ "$(oom_kills)" != "$OOM_BEFORE" ]; then
            STATUS=oom; DETAIL=$(json_text "worker killed by signal $sig (the cgroup's oom_kill counter rose)")
        else
            case $sig in
                4|6|7|8|11) STATUS=error; DETAIL=$(json_text "the worker crashed (signal $sig); worker.log in the run directory has its last words") ;;
                *) STATUS=killed; DETAIL=$(json_text "worker killed by signal $sig") ;;
            esac
        fi
        return
    fi
    case $RC in
        0) STATUS=ok ;; 3) STATUS=diverged ;; 4) STATUS=oom ;; 5) STATUS=unsupported ;;
        6) STATUS=interrupted ;; *) STATUS=error ;;
    esac
    [ "$STATUS" = ok ] && return
    DETAIL=$(last_detail)
    if [ -z "$DETAIL" ]; then
        why=$(tail -n 3 "$RUN/worker.log" 2>/dev/null | tr '\n' ' ')
        case $why in
            *"shared librar"*) why="the native worker could not start: $why; its bundle is incomplete: deploy again" ;;
            *) why="worker exited with code $RC: $why" ;;
        esac
        DETAIL=$(json_text "$why")
    fi
}

write_meta() {  # $1: the end clock (JSON) or null
    {
        printf '{"run_id": %s, "supervisor": "shell", "runtime": "native",\n' "$(json_text "$RUN_ID")"
        printf '"spec": '; cat "specs/$SPEC_JSON"; printf ',\n'
        printf '"device": {"arch": %s, "hostname": %s, "python": null, "mem_total_bytes": %s, "emulator": null},\n' \
            "$(json_text "$(uname -m)")" "$(json_text "$(uname -n)")" "$MEM_TOTAL"
        printf '"versions": {}, "native_worker": '; cat "$WORKER/bundle.json"; printf ',\n'
        printf '"clock": {"start": %s, "end": %s}, "predicted": null}\n' "$CLOCK_START" "$1"
    } > "$RUN/meta.json.tmp" && mv "$RUN/meta.json.tmp" "$RUN/meta.json"
}

run_one() {
    RUN="runs/$RUN_ID"
    mkdir -p "$RUN"
    cp "specs/$SPEC_JSON" "$RUN/spec.json"
    clock_start
    CLOCK_START=$(clock_json)
    write_meta null
    find_cgroup
    OOM_BEFORE=$(oom_kills)
    PEAK_KB=0; HWM_KB=""; TICKS=0; ENERGY_MJ=0; TIMED_OUT=""; STOPPED=""
    sh "$WORKER/run.sh" "$PLAN/plan.txt" --program "$PROGRAM" --out "$RUN" >> "$RUN/worker.log" 2>&1 &
    PID=$!
    START_S=$(date +%s); KILL_AT=""
    while alive; do
        sample
        if [ -n "$STOP" ] && [ -z "$STOPPED" ]; then
            STOPPED=$STOP; kill -TERM "$PID" 2>/dev/null; KILL_AT=$(($(date +%s) + GRACE_S))
        fi
        if [ "$TIMEOUT_S" -gt 0 ] && [ -z "$TIMED_OUT" ] && [ $(($(date +%s) - START_S)) -ge "$TIMEOUT_S" ]; then
            TIMED_OUT=1; kill -KILL "$PID" 2>/dev/null
        fi
        if [ -n "$KILL_AT" ] && [ "$(date +%s)" -ge "$KILL_AT" ]; then kill -KILL "$PID" 2>/dev/null; fi
        sleep "$TICK_S"
    done
    wait "$PID"; RC=$?
    status_of
    write_meta "$(clock_json)"
    peak=null; hwm=null
    [ "$PEAK_KB" -gt 0 ] && peak=$(kb_to_bytes "$PEAK_KB")
    [ -n "$HWM_KB" ] && hwm=$(kb_to_bytes "$HWM_KB")
    {
        printf '{"status": "%s", "detail": %s, "run_id": %s, "backend": "executorch", "runtime": "native",\n' \
            "$STATUS" "$DETAIL" "$(json_text "$RUN_ID")"
        printf '"exit_code": %s, "exit_signal": %s, "written_by": "shell",\n' "$EXIT_CODE" "$EXIT_SIGNAL"
        printf '"peak_rss_bytes_sampled": %s, "peak_rss_bytes_kernel": %s,\n' "$peak" "$hwm"
        printf '"peak_rss_kernel_source": "VmHWM of the worker, last read while it ran",\n'
        printf '"sampler": {"supervisor": "shell", "samples": %d, "tick_s": %s}}\n' "$TICKS" "$TICK_S"
    } > "$RUN/result.json.tmp" && mv "$RUN/result.json.tmp" "$RUN/result.json"
}

RUNS=""
save() {  # sweep.json: one run per line, so the shell's status script can read it back
    {
        printf '{"pid": %d, "state": "%s", "supervisor": "shell", "why": %s, "runs": {\n' "$$" "$1" "${WHY:-null}"
        printf '%s' "$RUNS" | sed '$!s/$/,/'
        printf '\n}}\n'
    } > sweep.json.tmp && mv sweep.json.tmp sweep.json
}
set_run() {  # $1 run id, $2 status: replaces the run's line
    RUNS=$(printf '%s\n' "$RUNS" | grep -v "^\"$1\":" | grep -v '^$'; printf '"%s": "%s"' "$1" "$2")
}

WHY=""
MEM_TOTAL=null
while read -r key value _; do [ "$key" = MemTotal: ] && MEM_TOTAL=$(kb_to_bytes "$value"); done < /proc/meminfo
for env in specs/*.env; do
    [ -f "$env" ] || continue
    . "./$env"
    if [ -f "runs/$RUN_ID/result.json" ]; then
        set_run "$RUN_ID" "$(sed -n 's/^{"status": "\([a-z]*\)".*/\1/p' "runs/$RUN_ID/result.json")"
        continue
    fi
    if [ -n "$STOP" ]; then set_run "$RUN_ID" "not started"; continue; fi
    if [ -d "runs/$RUN_ID" ]; then  # cut off by an earlier sweep: kept aside, started afresh
        n=1; while [ -e "runs/$RUN_ID.attempt-$n" ]; do n=$((n + 1)); done
        mv "runs/$RUN_ID" "runs/$RUN_ID.attempt-$n"
        printf '{"status": "interrupted", "run_id": "%s.attempt-%d", "written_by": "shell", "detail": "attempt %d of %s was cut off: the sweep process was gone before the run ended; the run was started again"}\n' \
            "$RUN_ID" "$n" "$n" "$RUN_ID" > "runs/$RUN_ID.attempt-$n/result.json"
        sed "s/^{\"run_id\": \"$RUN_ID\"/{\"run_id\": \"$RUN_ID.attempt-$n\"/" "runs/$RUN_ID.attempt-$n/meta.json" \
            > "runs/$RUN_ID.attempt-$n/meta.json.tmp" 2>/dev/null && mv "runs/$RUN_ID.attempt-$n/meta.json.tmp" "runs/$RUN_ID.attempt-$n/meta.json"
        set_run "$RUN_ID.attempt-$n" interrupted
    fi
    set_run "$RUN_ID" running
    save running
    run_one
    set_run "$RUN_ID" "$STATUS"
    save running
done
if [ -n "$STOP" ]; then WHY=$(json_text "stopped by $STOP"); save interrupted; else save finished; fi
rmdir .sweep.lock.d 2>/dev/null
[ -z "$STOP" ]
