# shellcheck shell=sh
# digests.py for a device with no Python: {relative/path: sha256} of every file in FOLDER
# (hidden ones too; links to files followed, links to folders not, as os.walk does).
# Usage: digests.sh FOLDER
sep=""
digest_tree() {  # $1: a folder, "." or ./relative/path
    for path in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        if [ -d "$path" ]; then
            [ -L "$path" ] || digest_tree "$path"
        elif [ -f "$path" ]; then
            rel=${path#./}
            [ "$rel" = .edgebench-verified ] && continue
            printf '%s%s: "%s"' "$sep" "$(json_text "$rel")" "$(sha256_of "$path")"
            sep=", "
        fi
    done
}
printf '{'
if cd "$1" 2>/dev/null; then digest_tree .; fi  # no folder: nothing in it, as os.walk finds
printf '}\n'
