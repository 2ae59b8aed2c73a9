#!/usr/bin/env bash
# Runs the whole test suite of presenced: formatting, vet, and every test
# under the race detector. This is the README's test command, and CI runs it
# through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH="/usr/local/go/bin:$PATH"
	else
		echo "test: Go is not installed (need Go $(sed -n 's/^go //p' go.mod) or newer)" >&2
		exit 1
	fi
fi

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './node_modules/*'))
if [ -n "$unformatted" ]; then
	echo "these files need gofmt:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go vet"
go vet ./...

echo "== go test -race"
go test -race -count=1 -timeout 20m ./...
