#!/usr/bin/env bash
# System packages the test suite uses when they are there: Debian's chromium (the live page in a
# real headless browser, driven by Playwright with this chromium: no browser download), fonts for
# the page's CJK text and emoji in its screenshots, redis-server (the Redis run log), and node
# with npm (the AI SDK's own client against the UI message stream route).
# Installed when we are root and they are missing; otherwise the tests that need them skip and
# say why.
set -u
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
for font in fonts-wqy-microhei fonts-noto-color-emoji; do
  dpkg-query -W -f='${Status}' "$font" 2>/dev/null | grep -q 'ok installed' || need+=("$font")
done
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "test-deps: not installing ${need[*]} (needs root and apt-get); the tests that use them will be skipped"
  exit 0
fi
echo "test-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; }; then
  echo "test-deps: could not install ${need[*]}; the tests that use them will be skipped"
fi
exit 0
