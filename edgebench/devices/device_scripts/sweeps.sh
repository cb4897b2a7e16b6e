# shellcheck shell=sh
# sweeps.py for a device with no Python: each sweep's state as it really is, and its host.json. A sweep whose
# process is gone but whose sweep.json still says `running` reads `stopped`, with why when
# sweep.log tells, and its record is made final here as sweeps.py's finalize makes it: the run
# it was running gets a result.json (`killed`, `cut_off`; or `oom` when the kernel counted an
# OOM kill during it) and sweep.json says `stopped`. sweep.json is read as runner/sweep.sh
# writes it (its first line the sweep's fields, then one `"run_id": "status"` line a run).
# Usage: sweeps.sh WORKDIR

json_field() {  # the text of string field $2 in JSON text $1, as written (its escapes kept), or nothing
    case $1 in *"\"$2\": \""*) ;; *) return ;; esac
    set -- "${1#*\""$2"\": \"}"
    printf '%s' "${1%%\"*}"
}

alive() {  # whether the pid in file $1 is a live sweep process (not a zombie, not a reused pid)
    pid=$(cat "$1" 2>/dev/null)
    case $pid in '' | *[!0-9]*) return 1 ;; esac
    kill -0 "$pid" 2>/dev/null || return 1
    { read -r stat < "/proc/$pid/stat"; } 2>/dev/null || return 1
    stat=${stat##*") "}
    [ "${stat%% *}" != Z ] || return 1
    grep -qF -e edgebench.runner.sweep -e edgebench/runner/sweep.sh "/proc/$pid/cmdline" 2>/dev/null
}

why_stopped() {  # what sweep.log's tail says about the end, or a plain statement
    for clue in "no space left:the disk filled up (no space left on device)" \
        "memoryerror:the sweep ran out of memory" "killed:the sweep process was killed" \
        "traceback:the sweep process crashed (see sweep.log)"; do
        if tail -c 4096 "$1/sweep.log" 2>/dev/null | grep -qiF -e "${clue%%:*}"; then
            printf '%s' "${clue#*:}"; return
        fi
    done
    printf 'the sweep process is gone before it finished (killed, or the device restarted)'
}

ended_without_supervisor() {  # $1 the run folder, $2 its id, $3 why (JSON-escaped): its result.json
    start=$(sed -n 's/.*"oom_kills_at_start": {\([^}]*\)}.*/\1/p' "$1/meta.json" 2>/dev/null | head -n 1)
    file=$(json_field "$start" file)
    count=${start#*\"count\": }; count=${count%%[!0-9]*}
    now=""
    [ -n "$file" ] && [ -n "$count" ] && now=$(sed -n 's/^oom_kill \([0-9][0-9]*\).*/\1/p' "$file" 2>/dev/null | head -n 1)
    if [ -n "$now" ] && [ $((now - count)) -gt 0 ]; then  # fewer after a reboot: none of this run's
        printf '{"status": "oom", "run_id": %s, "oom_kills_during_run": %d, ' "$(json_text "$2")" $((now - count))
        printf '"detail": "the worker was killed for memory (the oom_kill count in %s rose by %d during the run), ' \
            "$file" $((now - count))
        printf 'and %s: the runs after it did not start; restart the sweep to run them"}\n' "$3"
    else
        printf '{"status": "killed", "run_id": %s, "cut_off": true, ' "$(json_text "$2")"
        printf '"detail": "the run never ended: %s; restart the sweep to run it again"}\n' "$3"
    fi
}

status_of() {  # the status in result.json $1, or killed
    status=""
    if is_json_object "$1"; then status=$(json_field "$(grep -F -m 1 '"status": "' "$1")" status); fi
    printf '%s' "${status:-killed}"
}

finalize() {  # $1 a sweep whose process is gone, $2 why (JSON-escaped): sweeps.py's finalize
    { : >> "$1/.sweep.lock"; } 2>/dev/null || return 1  # sweeps.py's lock file: a folder we can write
    if is_json_object "$1/sweep.json"; then
        { IFS= read -r head; cat; } < "$1/sweep.json" > "$1/sweep.json.old"
    else
        head='{"runs": {'; printf '}}\n' > "$1/sweep.json.old"
    fi
    running='"state": "running"'; null='"why": null'; empty='"why": ""'
    case $head in
        *"$running"*) head="${head%%"$running"*}\"state\": \"stopped\"${head#*"$running"}" ;;
        *'"state": '*) ;;
        *) head="{\"state\": \"stopped\", ${head#\{}" ;;
    esac
    case $head in
        *"$null"*) head="${head%%"$null"*}\"why\": \"$2\"${head#*"$null"}" ;;
        *"$empty"*) head="${head%%"$empty"*}\"why\": \"$2\"${head#*"$empty"}" ;;
        *'"why": '*) ;;
        *) head="{\"why\": \"$2\", ${head#\{}" ;;
    esac
    running='": "running"'
    {
        printf '%s\n' "$head"
        while IFS= read -r line || [ -n "$line" ]; do
            case $line in
                '"'*"$running" | '"'*"$running,")
                    rid=${line#\"}; rid=${rid%"$running"*}
                    run="$1/runs/$rid"
                    case $rid in '' | .* | */* | *\\*) run="" ;; esac  # sweeps.py's one_component: no other folder
                    if [ -n "$run" ] && [ ! -e "$run/result.json" ] && [ -d "$run" ]; then
                        ended_without_supervisor "$run" "$rid" "$2" > "$run/result.json.tmp" &&
                            mv "$run/result.json.tmp" "$run/result.json"
                    fi
                    status=killed; [ -z "$run" ] || status=$(status_of "$run/result.json")
                    line="\"$rid\": \"$status\"${line##*"$running"}" ;;
            esac
            printf '%s\n' "$line"
        done < "$1/sweep.json.old"
    } > "$1/sweep.json.tmp" && mv "$1/sweep.json.tmp" "$1/sweep.json"
    rm -f "$1/sweep.json.old"
}

runs_of() {  # the `"run_id": "status"` lines of sweep.json $1, joined by commas
    sed -n 's/^\("[^"]*": "[^"\\]*"\).*/\1/p' "$1" 2>/dev/null | sed -e ':a' -e '$!{N;ba' -e '}' -e 's/\n/, /g'
}

root="$(abs_dir "$1")/sweeps"
printf '{'
ssep=""
for sdir in "$root"/*; do
    [ -d "$sdir" ] || continue
    recorded=""; why=null; runs=""
    if is_json_object "$sdir/sweep.json"; then
        { IFS= read -r head; } < "$sdir/sweep.json"
        recorded=$(json_field "$head" state)
        why=$(printf '%s\n' "$head" | sed -n -E 's/.*"why": (null|"([^"\\]|\\.)*").*/\1/p')
        runs=$(runs_of "$sdir/sweep.json")
    fi
    if alive "$sdir/sweep.pid"; then alive=true; shown=running; else alive=false; shown=$recorded; fi
    if ! $alive && { [ -z "$recorded" ] || [ "$recorded" = running ]; }; then
        shown="not started"
        if [ -n "$recorded" ] || [ -f "$sdir/sweep.pid" ]; then
            shown=stopped
            case ${why:-null} in null | '""') why=$(json_text "$(why_stopped "$sdir")") ;; esac
            inner=${why#\"}
            if finalize "$sdir" "${inner%\"}"; then
                runs=$(runs_of "$sdir/sweep.json")
            else
                runs=$(printf '%s\n' "$runs" | sed 's/: "running"/: "stopped"/g')
            fi
        fi
    fi
    printf '%s%s: {"alive": %s, "state": "%s", "why": %s, "runs": {%s}, "specs": [' "$ssep" \
        "$(json_text "${sdir##*/}")" "$alive" "$shown" "${why:-null}" "$runs"
    ssep=", "
    sep=""
    for spec in "$sdir"/specs/*.json; do
        [ -f "$spec" ] || continue
        name=${spec##*/}
        printf '%s%s' "$sep" "$(json_text "${name%.json}")"; sep=", "
    done
    printf '], "host": '
    if is_json_object "$sdir/host.json"; then cat "$sdir/host.json"; else printf 'null'; fi
    printf '}'
done
printf '}\n'
