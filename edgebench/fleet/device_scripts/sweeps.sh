# sweeps.py for a device with no Python: each sweep's state as it really is (a sweep whose
# process is gone but whose sweep.json says running reads `stopped`).
# Usage: sweeps.sh WORKDIR
root="$(cd "$1" 2>/dev/null && pwd)/sweeps"
printf '{'
ssep=""
for sdir in "$root"/*; do
    [ -d "$sdir" ] || continue
    alive=false
    pid=$(cat "$sdir/sweep.pid" 2>/dev/null)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && grep -q sweep.sh "/proc/$pid/cmdline" 2>/dev/null; then
        { read -r stat < "/proc/$pid/stat"; } 2>/dev/null
        case $stat in *") Z "*) ;; *) alive=true ;; esac
    fi
    recorded=$(sed -n 's/^{"pid": [0-9]*, "state": "\([a-z ]*\)".*/\1/p' "$sdir/sweep.json" 2>/dev/null)
    why=$(sed -n -E 's/.*"why": (null|"([^"\\]|\\.)*").*/\1/p' "$sdir/sweep.json" 2>/dev/null)
    if $alive; then shown=running
    elif [ -z "$recorded" ] || [ "$recorded" = running ]; then
        if [ -n "$recorded" ] || [ -f "$sdir/sweep.pid" ]; then
            shown=stopped
            [ "${why:-null}" = null ] && why=$(json_text "the sweep process is gone before it finished (killed, or the device restarted)")
        else shown="not started"; fi
    else shown=$recorded; fi
    printf '%s%s: {"alive": %s, "state": "%s", "why": %s, "runs": {' "$ssep" "$(json_text "${sdir##*/}")" \
        "$alive" "$shown" "${why:-null}"
    ssep=", "
    sed -n 's/^\("[^"]*": "[a-z ]*"\).*/\1/p' "$sdir/sweep.json" 2>/dev/null | while read -r line; do
        [ "$shown" = stopped ] && line=$(printf '%s' "$line" | sed 's/: "running"$/: "stopped"/')
        printf '%s' "$line,"
    done | sed 's/,$//'
    printf '}, "specs": ['
    sep=""
    for spec in "$sdir"/specs/*.json; do
        [ -f "$spec" ] || continue
        name=${spec##*/}
        printf '%s%s' "$sep" "$(json_text "${name%.json}")"; sep=", "
    done
    printf ']}'
done
printf '}\n'
