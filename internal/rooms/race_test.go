//go:build race

package rooms

const raceEnabled = true
