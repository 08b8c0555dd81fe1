// Package archtest holds the module's import rules, as a test over what
// `go list` says each package imports: the layers a package may import
// from (never one above its own), and the doors (server's protocol
// packages and the core they share) that must not reach past serving into
// the engines, the batcher, the generation loop or the step runner. It
// has no code: a package of its own so that the rules are written once.
package archtest
