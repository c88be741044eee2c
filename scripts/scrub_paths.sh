#!/usr/bin/env bash
# Writes the machine's own paths out of the text files (.log, .txt, .json) under each DIR given, in place:
# the repository root (this script's parent folder) becomes <repo>, the device call's output folder ($OUT,
# when set) $OUT, and the home folder ~. What a device call brings back is committed as results, and the
# repository speaks only of the project. Recordings (.jsonl) and JUnit XML keep their paths: the GPU check
# reads them. Usage: scripts/scrub_paths.sh DIR...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rules=("s#${root}#<repo>#g")
[ -n "${OUT:-}" ] && rules+=("s#${OUT%/}#\$OUT#g")
[ -n "${HOME:-}" ] && [ "$HOME" != "/" ] && rules+=("s#${HOME%/}/#~/#g")
script=$(printf '%s;' "${rules[@]}")
for dir in "$@"; do
    [ -d "$dir" ] || continue
    find "$dir" -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' \) -print0 | xargs -0 -r sed -i "$script"
done
