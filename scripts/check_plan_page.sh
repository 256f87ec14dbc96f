#!/usr/bin/env bash
# Opens the plan page (`ingot plan --html`) of gpt-mini and gpt2 in a real headless Chromium:
# the page's script must run to its end without an error (it sets data-ready="1" on <body>
# when it has drawn everything; window.onerror sets data-error), its self-test (zoom, hit-test
# and pick a buffer, sort the table) must pass, and a screenshot of each goes
# to docs/img/plan-MODEL.png (colour-quantized with ImageMagick when `convert` is there).
#
#   scripts/check_plan_page.sh [path/to/ingot]      (default: target/release/ingot)
#
# Without a browser (chromium, chromium-browser or google-chrome on PATH) it prints why and
# exits 0, so CI without one skips it; INGOT_REQUIRE_BROWSER=1 makes that an error instead.
# Set INGOT_PLAN_SHOTS=0 to check without writing screenshots.
set -euo pipefail
INGOT=${1:-target/release/ingot}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$BROWSER" ]; then
    if [ "${INGOT_REQUIRE_BROWSER:-0}" = 1 ]; then
        echo "check_plan_page: no chromium on PATH, and INGOT_REQUIRE_BROWSER=1" >&2
        exit 1
    fi
    echo "check_plan_page: skipped: no chromium, chromium-browser or google-chrome on PATH"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=10000)
status=0
for model in gpt-mini gpt2; do
    page="$work/$model.html"
    "$INGOT" plan --model "$model" --html "$page" > /dev/null
    bytes=$(stat -c %s "$page")
    # #selftest: the page zooms, picks the largest buffer at the peak by hit-testing, shows its
    # details and sorts the table, then says how that went in data-selftest.
    dom=$("$BROWSER" "${flags[@]}" --dump-dom "file://$page#selftest" 2> "$work/$model.log" || true)
    body=$(grep -o '<body[^>]*>' <<< "$dom" | head -1 || true)
    if [[ "$body" != *'data-ready="1"'* ]] || [[ "$body" == *data-error* ]] \
        || [[ "$body" != *'data-selftest="ok"'* ]]; then
        echo "check_plan_page: $model: the page's script did not finish: ${body:-no <body> in the DOM}" >&2
        status=1
        continue
    fi
    rows=$(grep -o '<tr' <<< "$dom" | wc -l)
    if [ "$rows" -lt 3 ]; then
        echo "check_plan_page: $model: the table of live buffers is empty" >&2
        status=1
        continue
    fi
    echo "check_plan_page: $model: ok ($bytes bytes, $((rows - 1)) buffers live at the peak listed)"
    if [ "${INGOT_PLAN_SHOTS:-1}" != 0 ]; then
        shot="$ROOT/docs/img/plan-$model.png"
        "$BROWSER" "${flags[@]}" --window-size=1280,900 --screenshot="$work/$model.png" \
            "file://$page" 2>> "$work/$model.log" > /dev/null
        if convert -version 2> /dev/null | grep -q ImageMagick; then
            convert "$work/$model.png" -colors 64 "PNG8:$shot"
        else
            cp "$work/$model.png" "$shot"
        fi
        echo "check_plan_page: $model: screenshot $shot ($(stat -c %s "$shot") bytes)"
    fi
done
exit $status
