// Package presence holds presence.js, the browser client of presenced, and
// its timer worker presence-timer.js: the one source of both the npm package
// @presenced/presence (package.json beside this file) and the files the
// binary serves at /static/presence.js and /static/presence-timer.js
// (internal/web embeds them from here, as go:embed cannot reach outside a
// package's directory).
package presence

import "embed"

// Files holds presence.js and presence-timer.js at its root. It is
// read-only and safe for concurrent use.
//
//go:embed presence.js presence-timer.js
var Files embed.FS
