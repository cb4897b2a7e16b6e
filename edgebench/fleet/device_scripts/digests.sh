# digests.py for a device with no Python: {relative/path: sha256} of every file in FOLDER.
# Usage: digests.sh FOLDER
cd "$1" || exit 1
sep=""
printf '{'
find . -type f | sort | while read -r path; do
    rel=${path#./}
    [ "$rel" = .edgebench-verified ] && continue
    printf '%s%s: "%s"' "$sep" "$(json_text "$rel")" "$(sha256sum "$path" | cut -d' ' -f1)"
    sep=", "
done
printf '}\n'
