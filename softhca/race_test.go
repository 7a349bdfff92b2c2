//go:build race

package softhca_test

// The race detector's runtime allocates on its own account.
const raceEnabled = true
