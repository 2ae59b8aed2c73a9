// Package doccheck holds the tests that keep the documentation true to the
// code, so that a page cannot drift from what it describes:
//
//   - the package map of docs/architecture.md against go list: one row per
//     package of the module, each with the module's packages it imports;
//   - the flag table of docs/configuration.md against the flags the
//     presenced binary prints with -h;
//   - the presenced_* series README.md and docs name against the code;
//   - every package doc at most 25 lines.
//
// It has no code of its own; its tests run in the normal suite.
package doccheck
