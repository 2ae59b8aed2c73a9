//go:build race

package e2e

// raceEnabled: the test runs under -race, so the server it starts is built
// with -race too and the browser's traffic is checked for data races.
const raceEnabled = true
