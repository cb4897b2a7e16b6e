# shellcheck shell=sh
# Helpers the shell device scripts share (prepended to each when it is sent): POSIX sh (dash,
# busybox sh, Android's mksh) and toybox's tools only (no awk; no tr, which Debian's toybox lacks),
# for devices with no Python. Each script prints the JSON its Python twin prints for the same
# files (tests/test_device_script_parity.py runs both).
LC_ALL=C; export LC_ALL  # globs and sort in byte order: Python's sorted() of UTF-8 names
JSON_TAB=$(printf '\t'); JSON_CR=$(printf '\r')
# sed commands escaping the other control characters as json.dumps does (\u00XX)
JSON_CTL=$(printf 's/\001/\\\\u0001/g;s/\002/\\\\u0002/g;s/\003/\\\\u0003/g;s/\004/\\\\u0004/g;s/\005/\\\\u0005/g;s/\006/\\\\u0006/g;s/\007/\\\\u0007/g;s/\010/\\\\u0008/g;s/\013/\\\\u000b/g;s/\014/\\\\u000c/g;s/\016/\\\\u000e/g;s/\017/\\\\u000f/g;s/\020/\\\\u0010/g;s/\021/\\\\u0011/g;s/\022/\\\\u0012/g;s/\023/\\\\u0013/g;s/\024/\\\\u0014/g;s/\025/\\\\u0015/g;s/\026/\\\\u0016/g;s/\027/\\\\u0017/g;s/\030/\\\\u0018/g;s/\031/\\\\u0019/g;s/\032/\\\\u001a/g;s/\033/\\\\u001b/g;s/\034/\\\\u001c/g;s/\035/\\\\u001d/g;s/\036/\\\\u001e/g;s/\037/\\\\u001f/g')
json_text() {  # $1 as a JSON string literal (json.dumps's escapes; non-ASCII stays UTF-8)
    set -- "$(printf '%s.' "$1" | sed -e ':a' -e '$!{N;ba' -e '}' -e 's/\\/\\\\/g; s/"/\\"/g' \
        -e "s/$JSON_TAB/\\\\t/g; s/$JSON_CR/\\\\r/g; $JSON_CTL" -e 's/\n/\\n/g')"
    printf '"%s"' "${1%.}"
}
abs_dir() {  # $1 as Python's os.path.abspath(os.path.expanduser($1)) gives it ("~" is $HOME)
    # shellcheck disable=SC2088  # a literal "~" in $1, expanded here
    case $1 in "~") set -- "$HOME" ;; "~/"*) set -- "$HOME/${1#"~/"}" ;; esac
    if (cd "$1" 2>/dev/null); then (cd "$1" && pwd); return; fi
    case $1 in /*) ;; *) set -- "$PWD/$1" ;; esac
    while :; do case $1 in ?*/) set -- "${1%/}" ;; *) break ;; esac; done
    printf '%s' "$1"
}
is_json_object() {  # whether file $1 has a JSON object's shape: `{` first, `}` last. Not a parser:
    # sweep.json and result.json are written whole (renamed into place), so a bad one is cut short
    [ -f "$1" ] && [ -r "$1" ] || return 1
    read -r first < "$1"
    # shellcheck disable=SC2016  # sed's $: the last line
    last=$(sed -n '/[^[:space:]]/h; ${x;s/[[:space:]]*$//;p;}' "$1")
    case $first:$last in "{"*:*"}") return 0 ;; esac
    return 1
}
kb_to_bytes() {  # kB * 1024 as text, each part below 2^31 (Android's mksh has 32-bit integers)
    q=$(($1 / 1000000)); r=$(($1 % 1000000))
    lo=$((r * 1024)); hi=$((q * 1024 + lo / 1000000)); lo=$((lo % 1000000))
    if [ "$hi" -gt 0 ]; then printf '%d%06d' "$hi" "$lo"; else printf '%d' "$lo"; fi
}
times_text() {  # $1 * $2 as text, $1 of any length, $2 up to 100000: 4 digits at a time, each part below 2^31
    n=$1; out=""; carry=0
    while [ -n "$n" ]; do
        case $n in ?????*) chunk=${n#"${n%????}"}; n=${n%????} ;; *) chunk=$n; n="" ;; esac
        while :; do case $chunk in 0?*) chunk=${chunk#0} ;; *) break ;; esac; done  # not octal
        v=$((chunk * $2 + carry)); carry=$((v / 10000)); v=$((v % 10000))
        while [ ${#v} -lt 4 ]; do v=0$v; done
        out=$v$out
    done
    out=$carry$out
    while :; do case $out in 0?*) out=${out#0} ;; *) break ;; esac; done
    printf '%s' "$out"
}
size_of() {  # a file's size in bytes, as text (no arithmetic: 32-bit shells)
    set -- "$(wc -c < "$1")"
    printf '%s' "${1##* }"
}
sha256_of() {  # a file's sha256 (read from stdin: GNU sha256sum escapes odd names in its output)
    set -- "$(sha256sum < "$1")"
    printf '%s' "${1%% *}"
}
