//go:build !freerowage

package main

import (
	"time"

	"github.com/dsynclock/dsync"
)

// freeRowAgeOptions returns no options and false: built without the
// freerowage tag, for a dsync that does not have WithFreeRowAge yet. The
// distinct-names scenario then reports the rate and the table's growth, and
// that nothing cleans it up.
func freeRowAgeOptions(time.Duration) ([]dsync.Option, bool) { return nil, false }
