package dsync

import (
	"context"
	"sync/atomic"
)

// ownerKey is the context key of an owner token.
type ownerKey struct{}

// lastOwner is the last owner token minted in this process; tokens start at 1
// so that 0 means "no owner".
var lastOwner atomic.Uint64

// WithOwner returns a copy of ctx carrying a new owner token, unique in this
// process. A lock taken with such a context belongs to that owner: the same
// owner may lock it again without blocking (each Lock needs its Unlock), and
// only the same owner may unlock it; Unlock with another owner, or none,
// returns [ErrNotOwner].
//
// Pass the context down the call chain of one logical task, typically one
// goroutine. A lock taken with a context without an owner behaves like
// sync.Mutex: it is not reentrant and any goroutine may unlock it.
func WithOwner(ctx context.Context) context.Context {
	return context.WithValue(ctx, ownerKey{}, lastOwner.Add(1))
}

// ownerOf returns the owner token in ctx, or 0 when it has none.
func ownerOf(ctx context.Context) uint64 {
	o, _ := ctx.Value(ownerKey{}).(uint64)
	return o
}
