//go:build !race

package softhca_test

const raceEnabled = false
