#!/usr/bin/env bash
# Renders the memory-plan page (or picture) of a model to a PNG in headless Chromium, and checks
# that what Chromium loaded holds the drawing: for the page, that its script ran to its end
# without an error (data-ready="1" on <body>) and the report table; for --svg, the <svg>, one
# <rect> per drawn buffer and their hover <title>s. (scripts/check_plan_page.sh checks the pages
# of gpt-mini and gpt2 and retakes the screenshots in docs/img.)
#   scripts/render_plan.sh [MODEL] [OUT.png] [--svg]     (defaults: mlp, plan.png, the HTML page)
# Needs `chromium`, `chromium-browser` or `google-chrome` on PATH (Debian: apt-get install
# chromium), and a built `ingot` (target/release/ingot, or `ingot` on PATH).
set -euo pipefail
model="${1:-mlp}"
out="${2:-plan.png}"
kind="${3:-}"
root="$(cd "$(dirname "$0")/.." && pwd)"
ingot="$root/target/release/ingot"
[ -x "$ingot" ] || ingot="$(command -v ingot || true)"
[ -n "$ingot" ] || { echo "no ingot binary: run cargo build --release first" >&2; exit 1; }
browser=""
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$b" >/dev/null 2>&1; then browser="$b"; break; fi
done
[ -n "$browser" ] || { echo "no chromium or google-chrome on PATH" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ "$kind" = "--svg" ]; then
  page="$tmp/plan.svg"; "$ingot" plan --model "$model" --svg "$page" >/dev/null
else
  page="$tmp/plan.html"; "$ingot" plan --model "$model" --html "$page" >/dev/null
fi
# No network, no first-run work: the page must stand alone.
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --user-data-dir="$tmp/profile" --hide-scrollbars)
"$browser" "${flags[@]}" --window-size=1900,1000 --screenshot="$tmp/plan.png" "file://$page" >/dev/null 2>&1
"$browser" "${flags[@]}" --dump-dom "file://$page" > "$tmp/dom.html" 2>/dev/null
rects=$(grep -o '<rect' "$tmp/dom.html" | wc -l || true)
titles=$(grep -o '<title>' "$tmp/dom.html" | wc -l || true)
if [ "$kind" = "--svg" ]; then
  grep -q '<svg' "$tmp/dom.html" || { echo "render_plan: the loaded picture has no <svg>" >&2; exit 1; }
  [ "$rects" -gt 10 ] && [ "$titles" -gt 10 ] || { echo "render_plan: only $rects rects and $titles titles in the loaded picture" >&2; exit 1; }
else
  grep -q '<body data-ready="1"' "$tmp/dom.html" || { echo "render_plan: the page's script did not finish: $(grep -o '<body[^>]*>' "$tmp/dom.html")" >&2; exit 1; }
  grep -q 'memory plan for' "$tmp/dom.html" || { echo "render_plan: no report table in the loaded page" >&2; exit 1; }
fi
size=$(stat -c %s "$tmp/plan.png")
[ "$size" -gt 10000 ] || { echo "render_plan: the screenshot is only $size bytes (blank?)" >&2; exit 1; }
mv "$tmp/plan.png" "$out"
echo "wrote $out ($size bytes)"
