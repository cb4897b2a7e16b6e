# listing.py for a device with no Python: every run file's size and sha256, each sweep.json.
# Usage: listing.sh WORKDIR
root="$(cd "$1" 2>/dev/null && pwd)/sweeps"
printf '{"root": %s, "sweeps": {' "$(json_text "$root")"
ssep=""
for sdir in "$root"/*; do
    [ -d "$sdir" ] || continue
    printf '%s%s: {"state": ' "$ssep" "$(json_text "${sdir##*/}")"; ssep=", "
    if [ -s "$sdir/sweep.json" ]; then cat "$sdir/sweep.json"; else printf 'null'; fi
    printf ', "runs": {'
    rsep=""
    for rdir in "$sdir"/runs/*; do
        [ -d "$rdir" ] || continue
        printf '%s%s: {' "$rsep" "$(json_text "${rdir##*/}")"; rsep=", "
        fsep=""
        for f in "$rdir"/*; do
            name=${f##*/}
            [ -f "$f" ] || continue
            case $name in *.tmp) continue ;; esac
            set -- $(sha256_of "$f")
            printf '%s%s: {"size": %s, "sha256": "%s"}' "$fsep" "$(json_text "$name")" "$1" "$2"; fsep=", "
        done
        printf '}'
    done
    printf '}}'
done
printf '}}\n'
