//go:build freerowage

package main

import (
	"time"

	"github.com/dsynclock/dsync"
)

// freeRowAgeOptions returns the session options that delete lock rows free
// for age, and true: this dsync has WithFreeRowAge.
func freeRowAgeOptions(age time.Duration) ([]dsync.Option, bool) {
	return []dsync.Option{dsync.WithFreeRowAge(age)}, true
}
