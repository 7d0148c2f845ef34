#!/usr/bin/env bash
# Refresh the vendored Markdown renderer (marked) and HTML sanitizer (DOMPurify) the page loads.
# Usage: fedresearch/web/static/vendor/refresh.sh [MARKED_VERSION] [DOMPURIFY_VERSION]
# (defaults: the newest published). Needs npm; the page itself needs no build step.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
marked="marked@${1:-latest}"
dompurify="dompurify@${2:-latest}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "$marked" "$dompurify" >/dev/null
mkdir marked dompurify
tar xzf marked-*.tgz -C marked
tar xzf dompurify-*.tgz -C dompurify
# the page serves no source maps: drop the comment that would make browsers ask for one
grep -v '^//# sourceMappingURL=' marked/package/lib/marked.umd.js >"$here/marked.min.js"
grep -v '^//# sourceMappingURL=' dompurify/package/dist/purify.min.js >"$here/purify.min.js"
cp marked/package/LICENSE "$here/LICENSE.marked.txt"
cp dompurify/package/LICENSE "$here/LICENSE.dompurify.txt"
{
    echo "marked $(node -p "require('./marked/package/package.json').version") (MIT)"
    echo "dompurify $(node -p "require('./dompurify/package/package.json').version") (MPL-2.0 OR Apache-2.0)"
} >"$here/VERSIONS.txt"
cat "$here/VERSIONS.txt"
