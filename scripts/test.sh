#!/usr/bin/env bash
# Runs the whole test suite of presenced: formatting, vet, staticcheck,
# and every test under the race detector. This is the README's test
# command, and CI runs it through .ci/run.
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

echo "== staticcheck"
# staticcheck, at a pinned release that knows the Go of go.mod, built
# once from the Go module proxy into a cache directory (like nats-server
# below). A failed build skips the check with a warning, and fails the
# command under CI=true; a finding fails it always: fix it, or suppress
# it with a //lint:ignore comment that says why.
STATICCHECK_VERSION=v0.8.2
# go_tool builds the command NAME of the Go package PKG at VERSION once
# from the Go module proxy into a cache directory of its own, and prints
# that directory; it returns 1 when the build fails.
go_tool() {
	local name=$1 pkg=$2 version=$3
	local dir="${XDG_CACHE_HOME:-$HOME/.cache}/presenced/$name-$version"
	if [ ! -x "$dir/$name" ]; then
		echo "building $name $version into $dir" >&2
		mkdir -p "$dir"
		GOBIN="$dir" GOFLAGS=-mod=mod go install "$pkg@$version" >&2 || return 1
	fi
	echo "$dir"
}
if staticcheck=$(go_tool staticcheck honnef.co/go/tools/cmd/staticcheck "$STATICCHECK_VERSION"); then
	"$staticcheck/staticcheck" ./...
elif [ "${CI:-}" = true ]; then
	echo "test: could not build staticcheck $STATICCHECK_VERSION" >&2
	exit 1
else
	echo "test: could not build staticcheck $STATICCHECK_VERSION; not run (under CI=true this fails)" >&2
fi

echo "== browser test tools"
# apt_install installs the Debian packages named (as root, or with sudo -n),
# running apt-get update only if a first try fails. A failure is reported
# with what breaks ($1), never fatal here: the tests themselves then fail.
apt_install() {
	local consequence=$1
	shift
	[ $# -gt 0 ] || return 0
	local sudo=""
	if [ "$(id -u)" != 0 ]; then
		if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
			sudo="sudo -n"
		else
			echo "test: cannot install $* without root; $consequence" >&2
			return 0
		fi
	fi
	echo "installing $*"
	export DEBIAN_FRONTEND=noninteractive
	$sudo apt-get install -y -q "$@" >/dev/null ||
		{ $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "$@" >/dev/null; } ||
		echo "test: could not install $*; $consequence" >&2
}

# e2e/ drives Debian's chromium with playwright-core from npm (never a
# downloaded browser), and packs, installs and type-checks the npm package
# js/presence with npm and typescript (from the root lockfile). Install
# what is missing; if that fails the tests say so, and fail under CI=true.
browser_tools() {
	local want=()
	command -v node >/dev/null 2>&1 || want+=(nodejs)
	command -v npm >/dev/null 2>&1 || want+=(npm)
	[ -x /usr/bin/chromium ] || want+=(chromium)
	apt_install "the browser test will fail" "${want[@]}"
	# npm ci only when the lockfile changed since the last install.
	if command -v npm >/dev/null 2>&1 && ! cmp -s package-lock.json node_modules/.presenced-lock; then
		if npm ci --ignore-scripts --no-audit --no-fund --loglevel=error; then
			cp package-lock.json node_modules/.presenced-lock
		else
			echo "test: npm ci failed" >&2
		fi
	fi
}
browser_tools

echo "== backend servers"
# internal/testsvc starts private redis-server, nats-server and PostgreSQL
# (initdb + postgres) processes for the store and bus tests; they fail,
# never skip, when a binary is missing. Install Debian's packages for what
# is missing (the packages' own services are not used).
backend_servers() {
	local want=()
	command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || want+=(redis-server)
	command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || want+=(postgresql)
	apt_install "the backend tests will fail" "${want[@]}"
	nats_server
}

# nats-server: Debian 12 ships 2.9.10, which crashes or stops answering
# when several clients create the same JetStream stream at once (as nodes
# starting together do; see internal/jsstream). The tests use a current
# release, built once from the Go module proxy (about 20 s) into a cache
# directory and put first on PATH; Debian's package is the fallback when
# that build is not possible.
NATS_SERVER_VERSION=v2.15.2
nats_server() {
	local dir
	if ! dir=$(go_tool nats-server github.com/nats-io/nats-server/v2 "$NATS_SERVER_VERSION"); then
		echo "test: could not build nats-server $NATS_SERVER_VERSION; falling back to Debian's package" >&2
		command -v nats-server >/dev/null 2>&1 || [ -x /usr/sbin/nats-server ] ||
			apt_install "the NATS tests will fail" nats-server
		return 0
	fi
	export PATH="$dir:$PATH"
	echo "using $(nats-server --version)"
}
backend_servers

# deploy/ renders the Kubernetes overlays of deploy/kustomize with
# kustomize, at a pinned release built once from the Go module proxy
# (about 30 s) into a cache directory and put first on PATH, like
# nats-server above. (v5.8.3 and later need a newer Go than go.mod's.)
# If the build fails the deploy tests fail under CI=true, saying so.
KUSTOMIZE_VERSION=v5.8.2
kustomize_bin() {
	local dir
	if ! dir=$(go_tool kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION"); then
		echo "test: could not build kustomize $KUSTOMIZE_VERSION; the Kubernetes tests will fail" >&2
		return 0
	fi
	export PATH="$dir:$PATH"
	echo "using kustomize $(kustomize version)"
}
kustomize_bin

# deploy/ runs systemd-analyze verify on the systemd unit (Debian's systemd
# package; only the tool is used, no service is started).
command -v systemd-analyze >/dev/null 2>&1 || apt_install "the systemd unit test will fail" systemd

echo "== go test -race"
# The summary tool prints what go test prints without -v, then how many
# tests passed, failed and were skipped, naming each skipped one.
summary="$(mktemp -d)"
trap 'rm -rf "$summary"' EXIT
go build -o "$summary/testsummary" ./scripts/testsummary
go test -race -count=1 -timeout 20m -json ./... | "$summary/testsummary"

echo "== measurements without -race"
# Tests that count bytes or allocations skip under -race (the detector
# changes both); they run here, on the plain build.
go test -count=1 -run 'TestMembershipBytes|TestJoinLeaveAllocs' ./internal/rooms
