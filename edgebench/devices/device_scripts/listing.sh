# shellcheck shell=sh
# listing.py for a device with no Python: every run file's (and its weights/ folder's) size and
# sha256, each sweep.json and host.json; hidden and half-written (.tmp) files left out.
# Usage: listing.sh WORKDIR
root="$(abs_dir "$1")/sweeps"
printf '{"root": %s, "sweeps": {' "$(json_text "$root")"
ssep=""
for sdir in "$root"/*; do
    [ -d "$sdir" ] || continue
    printf '%s%s: {"state": ' "$ssep" "$(json_text "${sdir##*/}")"; ssep=", "
    if is_json_object "$sdir/sweep.json"; then cat "$sdir/sweep.json"; else printf 'null'; fi
    printf ', "host": '
    if is_json_object "$sdir/host.json"; then cat "$sdir/host.json"; else printf 'null'; fi
    printf ', "runs": {'
    rsep=""
    for rdir in "$sdir"/runs/*; do
        [ -d "$rdir" ] || continue
        printf '%s%s: {' "$rsep" "$(json_text "${rdir##*/}")"; rsep=", "
        fsep=""
        # the run's own files, and the trained weights a --save run keeps in weights/
        for f in "$rdir"/* "$rdir"/weights/*; do
            [ -f "$f" ] || continue
            case ${f##*/} in *.tmp) continue ;; esac
            name=${f#"$rdir"/}
            printf '%s%s: {"size": %s, "sha256": "%s"}' "$fsep" "$(json_text "$name")" "$(size_of "$f")" \
                "$(sha256_of "$f")"
            fsep=", "
        done
        printf '}'
    done
    printf '}}'
done
printf '}}\n'
