#!/usr/bin/env bash
# Renders the memory-plan page of a model to a PNG with a headless Chromium or Chrome.
#   scripts/render_plan.sh [MODEL] [OUT.png]     (defaults: mlp, plan.png)
# Needs `chromium`, `chromium-browser` or `google-chrome` on PATH, and a built `ingot`
# (target/release/ingot, or `ingot` on PATH).
set -euo pipefail
model="${1:-mlp}"
out="${2:-plan.png}"
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
"$ingot" plan --model "$model" --html "$tmp/plan.html" >/dev/null
"$browser" --headless --disable-gpu --no-sandbox --hide-scrollbars \
  --window-size=1900,1000 --screenshot="$tmp/plan.png" "file://$tmp/plan.html" >/dev/null 2>&1
mv "$tmp/plan.png" "$out"
echo "wrote $out"
