package controller

import (
	"context"
	"time"
)

// Backoff bounds between reattach attempts after the first, which is at
// once: 0.2 s doubling to 5 s.
const (
	backoffMin = 200 * time.Millisecond
	backoffMax = 5 * time.Second
)

// backoff spaces reattach attempts: the first at once (a lost session is
// most often a master or client that died, replaced in milliseconds), then
// 0.2 s doubling to 5 s.
type backoff struct {
	d       time.Duration
	retried bool // the at-once retry was used
}

func (b *backoff) reset() { b.d, b.retried = 0, false }

// wait sleeps the next interval, ending early when ctx ends.
func (b *backoff) wait(ctx context.Context) {
	if !b.retried {
		b.retried = true
		return
	}
	if b.d == 0 {
		b.d = backoffMin
	} else if b.d *= 2; b.d > backoffMax {
		b.d = backoffMax
	}
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
