# Helpers the shell device scripts share (prepended to each when it is sent): POSIX sh and
# toybox tools only, for devices with no Python.
json_text() {  # $1 as a JSON string literal
    printf '"%s"' "$(printf '%s' "$1" | tr '\n\r\t' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g')"
}
kb_to_bytes() {  # kB * 1024 as text, each part below 2^31 (Android's mksh has 32-bit integers)
    q=$(($1 / 1000000)); r=$(($1 % 1000000))
    lo=$((r * 1024)); hi=$((q * 1024 + lo / 1000000)); lo=$((lo % 1000000))
    if [ "$hi" -gt 0 ]; then printf '%d%06d' "$hi" "$lo"; else printf '%d' "$lo"; fi
}
sha256_of() {  # "size sha256" of a file
    set -- "$1" "$(wc -c < "$1" | tr -d ' ')"
    printf '%s %s' "$2" "$(sha256sum "$1" | cut -d' ' -f1)"
}
