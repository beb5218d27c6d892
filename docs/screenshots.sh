#!/usr/bin/env bash
# Render pages of the built site in headless Chromium, to look at them as a reader would:
# bash docs/screenshots.sh BUILT_DIR OUT_DIR [PAGE...]. make docs-screenshots runs it.
set -euo pipefail
built=${1:-docs/_build/html}
out=${2:-docs/_build/screenshots}
shift $(( $# > 2 ? 2 : $# ))
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(index api architecture)

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    timeout 600 apt-get install -y -qq chromium >/dev/null 2>&1 \
        || (timeout 300 apt-get update -qq >/dev/null 2>&1 \
            && timeout 600 apt-get install -y -qq chromium >/dev/null 2>&1) || true
    browser=$(command -v chromium || true)
fi
if [ -z "$browser" ]; then
    echo "no chromium: install Debian's chromium package (or Chromium) to take screenshots" >&2
    exit 1
fi
# As root, Chromium runs only without its sandbox.
sandbox=()
[ "$(id -u)" = 0 ] && sandbox=(--no-sandbox)
mkdir -p "$out"
for page in "${pages[@]}"; do
    timeout 60 "$browser" --headless "${sandbox[@]}" --disable-gpu --hide-scrollbars \
        --window-size=1280,1600 --screenshot="$out/$page.png" \
        "file://$(cd "$built" && pwd)/$page.html" >/dev/null 2>&1
    echo "$out/$page.png"
done
